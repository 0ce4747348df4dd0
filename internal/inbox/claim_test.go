package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

type processed struct {
	res Result
	err error
}

func (h *harness) processAsync(rec Record) <-chan processed {
	ch := make(chan processed, 1)
	go func() {
		res, err := h.engine.Process(context.Background(), rec)
		ch <- processed{res, err}
	}()
	return ch
}

// await returns the result of an asynchronous Process, failing the test if none comes within
// the deadline (a hang is the failure mode of a missing lease).
func await(t *testing.T, ch <-chan processed, what string) processed {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("no result from %s within 30s", what)
		return processed{}
	}
}

// blockFirstCall makes the listener's first call signal entered and wait for release(), returning
// firstErr; later calls succeed at once. A failed test releases the call, so that the pool can
// close.
func blockFirstCall(t *testing.T, l *testListener, firstErr error) (entered chan struct{}, release func()) {
	entered, released := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	var once sync.Once
	l.setBehaviour(func(ctx context.Context, m Message) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(entered)
		<-released
		return firstErr
	})
	return entered, release
}

// backendState returns pg_stat_activity.state of a backend.
func (h *harness) backendState(pid int32) string {
	h.t.Helper()
	var s string
	if err := h.pool.QueryRow(context.Background(), `SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&s); err != nil {
		h.t.Fatal(err)
	}
	return s
}

// blockerOf returns the single backend a waiting backend waits for.
func (h *harness) blockerOf(pid int32) int32 {
	h.t.Helper()
	var blockers []int32
	if err := h.pool.QueryRow(context.Background(), `SELECT pg_blocking_pids($1)`, pid).Scan(&blockers); err != nil {
		h.t.Fatal(err)
	}
	if len(blockers) != 1 {
		h.t.Fatalf("backend %d waits for %v, want exactly one backend", pid, blockers)
	}
	return blockers[0]
}

func TestLoserWaitsInsidePostgresWhileWinnerListensThenIsDuplicate(t *testing.T) {
	h := newHarness(t, chainSet())
	entered, release := blockFirstCall(t, h.listener, nil)
	rec := h.rec("A", "a1", "c1")

	winner := h.processAsync(rec)
	<-entered
	loser := h.processAsync(rec)
	waitFor(t, "the loser's claim insert to wait for a lock", func() bool { return len(h.blockedClaimInserts()) == 1 })

	// While the loser waits inside PostgreSQL, the winner's T1 holds the claim idle (no statement
	// runs on it), the listener was called once, and no row exists yet.
	blocker := h.blockerOf(h.blockedClaimInserts()[0])
	if s := h.backendState(blocker); s != "idle in transaction" {
		t.Fatalf("winner's T1 backend is %q during the listener call, want idle in transaction", s)
	}
	if n := h.listener.callCount(); n != 1 {
		t.Fatalf("listener calls while the loser waits = %d, want 1", n)
	}
	if s := h.states("A", "a1"); len(s) != 0 {
		t.Fatalf("rows while the winner's listener runs = %v, want none", s)
	}

	release()
	w, l := await(t, winner, "the winner"), await(t, loser, "the loser")
	if w.err != nil || w.res.Outcome != Delivered {
		t.Fatalf("winner = %v, %v; want Delivered", w.res.Outcome, w.err)
	}
	if l.err != nil || l.res.Outcome != Duplicate {
		t.Fatalf("loser = %v, %v; want Duplicate without error", l.res.Outcome, l.err)
	}
	if n := h.listener.callCount(); n != 1 {
		t.Fatalf("listener calls = %d, want 1 (the loser must not call it)", n)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("rows = %v, want exactly one PROCESSED (the loser must not write)", s)
	}
	if n := h.claims("A", "a1"); n != 1 {
		t.Fatalf("claims = %d, want 1", n)
	}
}

func TestLoserTakesOverAfterWinnerListenerFails(t *testing.T) {
	h := newHarness(t, chainSet())
	sinkDown := errors.New("sink returned 503")
	entered, release := blockFirstCall(t, h.listener, sinkDown)
	rec := h.rec("A", "a1", "c1")

	winner := h.processAsync(rec)
	<-entered
	loser := h.processAsync(rec)
	waitFor(t, "the loser's claim insert to wait for a lock", func() bool { return len(h.blockedClaimInserts()) == 1 })
	release()

	w, l := await(t, winner, "the winner"), await(t, loser, "the loser")
	if w.err != nil || w.res.Outcome != Failed || !errors.Is(w.res.ListenerErr, sinkDown) {
		t.Fatalf("winner = %v (%v), %v; want Failed with the listener's error", w.res.Outcome, w.res.ListenerErr, w.err)
	}
	if l.err != nil || l.res.Outcome != Delivered {
		t.Fatalf("loser = %v, %v; want Delivered: the rolled-back claim passes to it", l.res.Outcome, l.err)
	}
	if n := h.listener.callCount(); n != 2 {
		t.Fatalf("listener calls = %d, want 2 (failed winner, then loser)", n)
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Fatalf("listener ran concurrently for %v", o)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("rows = %v, want the FAILED row turned PROCESSED", s)
	}
}

func TestLoserTakesOverAfterWinnerConnectionIsKilled(t *testing.T) {
	h := newHarness(t, chainSet())
	entered, release := blockFirstCall(t, h.listener, nil)
	rec := h.rec("A", "a1", "c1")

	winner := h.processAsync(rec)
	<-entered
	loser := h.processAsync(rec)
	waitFor(t, "the loser's claim insert to wait for a lock", func() bool { return len(h.blockedClaimInserts()) == 1 })
	blocker := h.blockerOf(h.blockedClaimInserts()[0])
	var killed bool
	if err := h.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, blocker).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate winner's backend %d: %v, %v", blocker, killed, err)
	}

	l := await(t, loser, "the loser")
	if l.err != nil || l.res.Outcome != Delivered {
		t.Fatalf("loser = %v, %v; want Delivered after the winner's connection died", l.res.Outcome, l.err)
	}
	// The winner's listener now returns success, but its claim is gone: it must neither write a
	// second row nor report success.
	release()
	w := await(t, winner, "the winner")
	if w.err == nil {
		t.Fatalf("winner = %v without error, want an error: its T1 was terminated", w.res.Outcome)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("rows = %v, want exactly one PROCESSED", s)
	}
	if n := h.claims("A", "a1"); n != 1 {
		t.Fatalf("claims = %d, want 1", n)
	}
	// A retry of the winner's record, as its caller does after the error, is a duplicate.
	if res := h.process(rec); res.Outcome != Duplicate {
		t.Fatalf("retry = %v, want Duplicate", res.Outcome)
	}
	if n := h.listener.callCount(); n != 2 {
		t.Fatalf("listener calls = %d, want 2", n)
	}
}

func TestLaterDuplicatesAreSkippedAfterWinnerCommitted(t *testing.T) {
	h := newHarness(t, chainSet())
	rec := h.rec("A", "a1", "c1")
	if res := h.process(rec); res.Outcome != Delivered {
		t.Fatalf("first = %v, want Delivered", res.Outcome)
	}
	for i := range 3 {
		if res := h.process(rec); res.Outcome != Duplicate {
			t.Fatalf("duplicate %d = %v, want Duplicate", i, res.Outcome)
		}
	}
	if n := h.listener.callCount(); n != 1 {
		t.Fatalf("listener calls = %d, want 1", n)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("rows = %v, want one PROCESSED", s)
	}
}

func TestFailedMessageIsRetriedByResend(t *testing.T) {
	h := newHarness(t, chainSet())
	sinkDown := errors.New("sink down")
	h.listener.setBehaviour(func(context.Context, Message) error { return sinkDown })
	rec := h.rec("A", "a1", "c1")
	if res := h.process(rec); res.Outcome != Failed || !errors.Is(res.ListenerErr, sinkDown) {
		t.Fatalf("first = %v (%v), want Failed", res.Outcome, res.ListenerErr)
	}
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); !slices.Equal(s, []string{stateFailed}) || c != 0 {
		t.Fatalf("after failure rows = %v, claims = %d; want FAILED and no claim", s, c)
	}
	h.listener.setBehaviour(nil)
	if res := h.process(rec); res.Outcome != Delivered {
		t.Fatalf("resend = %v, want Delivered", res.Outcome)
	}
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); !slices.Equal(s, []string{stateProcessed}) || c != 1 {
		t.Fatalf("after resend rows = %v, claims = %d; want one PROCESSED row and its claim", s, c)
	}
}

func TestFailedBufferedMessageStaysRetryable(t *testing.T) {
	h := newHarness(t, chainSet())
	b := h.rec("B", "b1", "c1")
	if res := h.process(b); res.Outcome != Buffered {
		t.Fatalf("B = %v, want Buffered", res.Outcome)
	}
	sinkRejectsB := errors.New("sink rejects B")
	h.listener.setBehaviour(func(_ context.Context, m Message) error {
		if m.QualifiedType == "B" {
			return sinkRejectsB
		}
		return nil
	})
	res := h.process(h.rec("A", "a1", "c1"))
	if res.Outcome != Delivered || len(res.Released) != 0 || len(res.ReleaseFailures) != 1 {
		t.Fatalf("A = %v, released %v, failures %d; want Delivered with one release failure", res.Outcome, types(res.Released), len(res.ReleaseFailures))
	}
	f := res.ReleaseFailures[0]
	if f.Message.Record.IdempotenceID != b.IdempotenceID || !errors.Is(f.Err, sinkRejectsB) || f.Origin != b.Origin {
		t.Fatalf("failure = %+v, want B with the listener's error and its origin", f)
	}
	if s, c := h.states("B", "b1"), h.claims("B", "b1"); !slices.Equal(s, []string{stateFailed}) || c != 0 {
		t.Fatalf("B rows = %v, claims = %d; want FAILED and its claim deleted", s, c)
	}

	h.listener.setBehaviour(nil)
	if res := h.process(b); res.Outcome != Delivered {
		t.Fatalf("resent B = %v, want Delivered", res.Outcome)
	}
	if s := h.states("B", "b1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("B rows = %v, want one PROCESSED row", s)
	}
	if got := h.listener.deliveredTypes(h.ctxID("c1")); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("delivered %v, want [A B]", got)
	}
}

// insertHistoricalRows stores rows of one logical message as a database from before the claim
// table could hold them: no claim, states as given.
func (h *harness) insertHistoricalRows(qualified, idem, contextID string, states ...string) {
	h.t.Helper()
	ctx := context.Background()
	var instanceID int64
	err := h.pool.QueryRow(ctx, `INSERT INTO sequence_instance (name, context_id, retain_until)
VALUES ('chain', $1, now() + interval '1 hour') ON CONFLICT (name, context_id) DO UPDATE SET name = EXCLUDED.name RETURNING id`,
		h.ctxID(contextID)).Scan(&instanceID)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, s := range states {
		if _, err := h.pool.Exec(ctx, `INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, state)
VALUES ($1, $2, $3, $4)`, instanceID, qualified, h.prefix+idem, s); err != nil {
			h.t.Fatal(err)
		}
	}
}

func TestHistoricalDuplicateRowsAreSkippedWithoutError(t *testing.T) {
	h := newHarness(t, chainSet())
	h.insertHistoricalRows("A", "a1", "c1", stateProcessed, stateFailed)

	res, err := h.engine.Process(context.Background(), h.rec("A", "a1", "c1"))
	if err != nil || res.Outcome != Duplicate {
		t.Fatalf("process = %v, %v; want Duplicate without error", res.Outcome, err)
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls = %d, want 0", n)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed, stateFailed}) {
		t.Fatalf("rows = %v, want the historical rows unchanged", s)
	}
	// The skip committed the claim, so the next duplicate loses at the claim insert.
	if n := h.claims("A", "a1"); n != 1 {
		t.Fatalf("claims = %d, want 1", n)
	}
}

func TestHistoricalFailedDuplicatesAreRetriedOnTheNewestRow(t *testing.T) {
	h := newHarness(t, chainSet())
	h.insertHistoricalRows("A", "a1", "c1", stateFailed, stateFailed)
	if res := h.process(h.rec("A", "a1", "c1")); res.Outcome != Delivered {
		t.Fatalf("process = %v, want Delivered", res.Outcome)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateFailed, stateProcessed}) {
		t.Fatalf("rows = %v, want the newest FAILED row turned PROCESSED and no new row", s)
	}
}

func TestUnsequencedRecordsBypassTheClaim(t *testing.T) {
	h := newHarness(t, chainSet())
	filtered := h.rec("B", "b1", "c1")
	filtered.Sequenced = false
	noContext := h.rec("B", "b2", "c1")
	noContext.ContextID = ""
	for _, rec := range []Record{filtered, noContext} {
		if res := h.process(rec); res.Outcome != Bypassed {
			t.Fatalf("%s = %v, want Bypassed", rec.IdempotenceID, res.Outcome)
		}
	}
	if n := h.listener.callCount(); n != 2 {
		t.Fatalf("listener calls = %d, want 2 (B delivered although A was not)", n)
	}
	if n := h.count(`SELECT count(*) FROM sequence_instance WHERE context_id IN ($1, '')`, h.ctxID("c1")); n != 0 {
		t.Fatalf("instances = %d, want none", n)
	}
	for _, id := range []string{"b1", "b2"} {
		if s, c := h.states("B", id), h.claims("B", id); len(s) != 0 || c != 0 {
			t.Fatalf("%s: rows %v, claims %d; want none", id, s, c)
		}
	}
}

func TestUnsequencedListenerFailureIsReportedWithoutRows(t *testing.T) {
	h := newHarness(t, chainSet())
	h.listener.setBehaviour(func(context.Context, Message) error { return errors.New("down") })
	rec := h.rec("A", "a1", "c1")
	rec.Sequenced = false
	if res := h.process(rec); res.Outcome != Failed || res.ListenerErr == nil {
		t.Fatalf("outcome = %v (%v), want Failed with the listener's error", res.Outcome, res.ListenerErr)
	}
	if s := h.states("A", "a1"); len(s) != 0 {
		t.Fatalf("rows = %v, want none", s)
	}
}

func TestClaimsAreDeletedWithTheirInstance(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("A", "a1", "c1"))
	h.process(h.rec("C", "c1", "c1"))
	if n := h.count(`SELECT count(*) FROM sequential_inbox_idempotence c JOIN sequence_instance i ON i.id = c.sequence_instance_id
WHERE i.context_id = $1`, h.ctxID("c1")); n != 2 {
		t.Fatalf("claims before = %d, want 2", n)
	}
	if _, err := h.pool.Exec(context.Background(), `DELETE FROM sequence_instance WHERE name = 'chain' AND context_id = $1`, h.ctxID("c1")); err != nil {
		t.Fatal(err)
	}
	if a, c := h.claims("A", "a1"), h.claims("C", "c1"); a != 0 || c != 0 {
		t.Fatalf("claims after the instance was deleted: A %d, C %d; want 0", a, c)
	}
	if n := h.count(`SELECT count(*) FROM buffered_message b JOIN sequenced_message m ON m.id = b.sequenced_message_id
WHERE m.idempotence_id = $1`, h.prefix+"c1"); n != 0 {
		t.Fatalf("buffered records after the instance was deleted = %d, want 0", n)
	}
	// The idempotence guarantee ended with the instance: a resend is a new message.
	if res := h.process(h.rec("A", "a1", "c1")); res.Outcome != Delivered {
		t.Fatalf("resend after deletion = %v, want Delivered", res.Outcome)
	}
}

func TestUndeclaredTypeIsAnErrorNotACrash(t *testing.T) {
	h := newHarness(t, chainSet())
	for _, rec := range []Record{h.rec("Unknown", "u1", "c1"), h.rec("A.SUB", "a1", "c1")} {
		_, err := h.engine.Process(context.Background(), rec)
		if !errors.Is(err, ErrUndeclaredType) {
			t.Fatalf("%s.%s: error %v, want ErrUndeclaredType", rec.Type, rec.Subtype, err)
		}
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls = %d, want 0", n)
	}
	if s := h.instanceState("chain", "c1"); s != "" {
		t.Fatalf("instance = %q, want none", s)
	}
}

func TestRecordWithoutIdempotenceIDIsAnError(t *testing.T) {
	h := newHarness(t, chainSet())
	rec := h.rec("A", "a1", "c1")
	rec.IdempotenceID = ""
	if _, err := h.engine.Process(context.Background(), rec); !errors.Is(err, ErrNoIdempotenceID) {
		t.Fatalf("error %v, want ErrNoIdempotenceID", err)
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls = %d, want 0", n)
	}
}

func TestListenerCallIsCancelledAtItsDeadline(t *testing.T) {
	h := newHarness(t, chainSet(), func(c *harnessSettings) { c.ListenerDeadline = 100 * time.Millisecond })
	h.listener.setBehaviour(func(ctx context.Context, _ Message) error {
		<-ctx.Done()
		return ctx.Err()
	})
	res := h.process(h.rec("A", "a1", "c1"))
	if res.Outcome != Failed || !errors.Is(res.ListenerErr, context.DeadlineExceeded) {
		t.Fatalf("outcome = %v (%v), want Failed by the deadline", res.Outcome, res.ListenerErr)
	}
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); !slices.Equal(s, []string{stateFailed}) || c != 0 {
		t.Fatalf("rows %v, claims %d; want FAILED and no claim", s, c)
	}
}

func TestAbandonedRecordLeavesNoStateAndNoClaim(t *testing.T) {
	h := newHarness(t, chainSet())
	ctx, cancel := context.WithCancel(context.Background())
	h.listener.setBehaviour(func(lctx context.Context, _ Message) error {
		cancel()
		<-lctx.Done()
		return lctx.Err()
	})
	_, err := h.engine.Process(ctx, h.rec("A", "a1", "c1"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled (the caller retries the record)", err)
	}
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); len(s) != 0 || c != 0 {
		t.Fatalf("rows %v, claims %d; want none: an abandoned record is not a listener failure", s, c)
	}
}

// TestHungListenerLosesItsClaimOnlyAfterItsDeadline proves T1's lease: a listener that ignores
// its cancellation keeps the claim until the deadline plus the margin (never less than the
// deadline), then the server ends T1 and a waiting duplicate takes over; the hung winner neither
// writes a second row nor reports success.
func TestHungListenerLosesItsClaimOnlyAfterItsDeadline(t *testing.T) {
	h := newHarness(t, chainSet(), func(c *harnessSettings) {
		c.ListenerDeadline, c.LeaseMargin = 300*time.Millisecond, 2*time.Second
	})
	deadlineReached, released := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	var once sync.Once
	h.listener.setBehaviour(func(ctx context.Context, _ Message) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		<-ctx.Done()
		close(deadlineReached)
		<-released // hangs past its deadline
		return nil
	})
	rec := h.rec("A", "a1", "c1")
	winner := h.processAsync(rec)
	waitFor(t, "the winner's listener call", func() bool { return h.listener.callCount() == 1 })
	loser := h.processAsync(rec)
	waitFor(t, "the loser's claim insert to wait for a lock", func() bool { return len(h.blockedClaimInserts()) == 1 })
	blocker := h.blockerOf(h.blockedClaimInserts()[0])

	<-deadlineReached
	if s := h.backendState(blocker); s != "idle in transaction" {
		t.Fatalf("winner's T1 at the listener deadline is %q, want still idle in transaction (lease >= deadline)", s)
	}
	l := await(t, loser, "the loser")
	if l.err != nil || l.res.Outcome != Delivered {
		t.Fatalf("loser = %v, %v; want Delivered once the hung winner's lease expired", l.res.Outcome, l.err)
	}
	if n := h.count(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, blocker); n != 0 {
		t.Fatalf("winner's T1 backend still exists after the takeover")
	}
	release()
	if w := await(t, winner, "the hung winner"); w.err == nil {
		t.Fatalf("hung winner = %v without error, want an error: its claim expired", w.res.Outcome)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("rows = %v, want exactly one PROCESSED", s)
	}
}

func TestConcurrentCreatorsEndWithOneInstance(t *testing.T) {
	h := newHarness(t, chainSet())
	const creators = 8
	for it := range 10 {
		fns := make([]func() error, creators)
		for i := range fns {
			// Engines of their own: no instance cache shared between the creators.
			e, err := New(h.pool, chainSet(), h.listener, Config{ListenerDeadline: time.Minute, IdleLockTimeout: time.Minute, Clock: h.clock,
				Maintenance: h.engine.maint}, nil)
			if err != nil {
				t.Fatal(err)
			}
			rec := h.rec("C", fmt.Sprintf("c%d-%d", it, i), fmt.Sprintf("new%d", it))
			fns[i] = func() error {
				_, err := e.Process(context.Background(), rec)
				return err
			}
		}
		for _, err := range raceAll(fns) {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := h.count(`SELECT count(*) FROM sequence_instance WHERE context_id = $1`, h.ctxID(fmt.Sprintf("new%d", it))); n != 1 {
			t.Fatalf("iteration %d: %d instances, want 1", it, n)
		}
		if n := h.count(`SELECT count(DISTINCT sequence_instance_id) FROM sequenced_message WHERE idempotence_id LIKE $1`,
			h.prefix+fmt.Sprintf("c%d-%%", it)); n != 1 {
			t.Fatalf("iteration %d: messages in %d instances, want 1", it, n)
		}
	}
}
