package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/sequence"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// newIsolatedHarness gives the test a database of its own, for assertions over whole tables.
func newIsolatedHarness(t *testing.T, set *sequence.Set, opts ...harnessOption) *harness {
	t.Helper()
	return newHarnessOn(t, testenv.FreshDatabase(t, "inbox_isolated"), set, opts...)
}

func (h *harness) housekeep(hc HousekeepingConfig, dl DeadLetterer) HousekeepingReport {
	h.t.Helper()
	rep, err := h.engine.Housekeep(context.Background(), hc, dl)
	if err != nil {
		h.t.Fatal(err)
	}
	return rep
}

func TestHousekeepingDeletesClosedThenMarksAndDeletesExpiredInstances(t *testing.T) {
	h := newIsolatedHarness(t, chainSet())
	for _, typ := range []string{"A", "B", "C"} {
		h.process(h.rec(typ, typ+"1", "done"))
	}
	waiting := h.rec("B", "b2", "stuck")
	h.process(waiting)
	h.process(h.rec("A", "a3", "open"))
	hc := HousekeepingConfig{ExpiryDelay: 30 * time.Minute, BatchSize: 1, MaxDuration: time.Hour}
	dl := &recordingDeadLetterer{}

	rep := h.housekeep(hc, dl)
	if want := (HousekeepingReport{Leader: true, Finished: true, DeletedClosed: 1}); rep != want {
		t.Fatalf("first run = %+v, want %+v", rep, want)
	}
	if s, n := h.instanceState("chain", "done"), h.claims("A", "A1"); s != "" || n != 0 {
		t.Fatalf("closed instance %q with %d claims left, want it deleted with its claims", s, n)
	}

	h.clock.Step(time.Hour + time.Minute)
	rep = h.housekeep(hc, dl)
	if want := (HousekeepingReport{Leader: true, Finished: true, MarkedExpired: 2}); rep != want {
		t.Fatalf("run past retention = %+v, want %+v", rep, want)
	}
	if n := h.count(`SELECT count(*) FROM sequence_instance WHERE remove_after = retain_until + interval '30 minutes'`); n != 2 {
		t.Fatalf("instances with remove_after = retain_until + delay: %d, want 2", n)
	}
	if len(dl.letters) != 0 {
		t.Fatalf("dead letters before removal: %v", dl.letters)
	}

	h.clock.Step(30 * time.Minute)
	rep = h.housekeep(hc, dl)
	if want := (HousekeepingReport{Leader: true, Finished: true, DeletedExpired: 2, DeadLettered: 1}); rep != want {
		t.Fatalf("run past remove_after = %+v, want %+v", rep, want)
	}
	if len(dl.letters) != 1 {
		t.Fatalf("dead letters = %v, want the WAITING B", dl.letters)
	}
	got := dl.letters[0]
	if got.reason != DeadLetterReasonSequenceDeleted || got.msg.Record.IdempotenceID != waiting.IdempotenceID ||
		string(got.msg.Record.Value) != string(waiting.Value) || got.msg.Record.Origin != waiting.Origin || got.msg.ContextID != waiting.ContextID {
		t.Fatalf("dead letter = %+v (%q), want B's record with reason %q", got.msg, got.reason, DeadLetterReasonSequenceDeleted)
	}
	h.requireEngineTablesEmpty("after housekeeping")
}

// TestHousekeepingRunsOnOneConsumerAtATime covers both ways another consumer may lead: one of an
// earlier version holds the advisory lock on a session of its own (during a rollout), and one of
// this version holds the lease. A run does nothing then, and the lead passes when it is given up.
func TestHousekeepingRunsOnOneConsumerAtATime(t *testing.T) {
	h := newIsolatedHarness(t, chainSet())
	for _, typ := range []string{"A", "B", "C"} {
		h.process(h.rec(typ, typ+"1", "done"))
	}
	ctx := context.Background()
	other, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock($1)`, housekeepingLockKey); err != nil {
		t.Fatal(err)
	}
	hc := HousekeepingConfig{ExpiryDelay: time.Minute, BatchSize: 10, MaxDuration: time.Minute}
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep != (HousekeepingReport{}) {
		t.Fatalf("run while a consumer of an earlier version leads = %+v, want nothing done", rep)
	}
	if s := h.instanceState("chain", "done"); s != "CLOSED" {
		t.Fatalf("instance = %q, want untouched", s)
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock($1)`, housekeepingLockKey); err != nil {
		t.Fatal(err)
	}
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); !rep.Leader || rep.DeletedClosed != 1 {
		t.Fatalf("run after the lock was released = %+v, want leader deleting 1", rep)
	}

	// The leader keeps the lease between runs, until it resigns.
	second, err := New(h.pool, chainSet(), newTestListener(), h.engine.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if leader, err := second.LeadHousekeeping(ctx); err != nil || leader {
		t.Fatalf("another engine's LeadHousekeeping after the leader's run = %v, %v; want the lease kept by the leader", leader, err)
	}
	if rep, err := second.Housekeep(ctx, hc, &recordingDeadLetterer{}); err != nil || rep.Leader {
		t.Fatalf("another engine's run while the leader holds the lease = %+v, %v; want nothing done", rep, err)
	}
	h.engine.ResignHousekeeping()
	if leader, err := second.LeadHousekeeping(ctx); err != nil || !leader {
		t.Fatalf("another engine's LeadHousekeeping after the leader resigned = %v, %v; want it to lead", leader, err)
	}
	second.ResignHousekeeping()
}

// TestAHousekeepingBatchHoldsTheLeadAndALostLeadStopsTheRun stops the leader's run inside a batch
// (its dead-letter call blocks): another consumer asking for the lead meanwhile is told at once
// that it does not lead, without waiting for the batch, and a takeover of the lease (it ran out)
// waits for the batch to commit. Once the lead is lost, the old leader's next batch finds it so
// and runs nothing.
func TestAHousekeepingBatchHoldsTheLeadAndALostLeadStopsTheRun(t *testing.T) {
	h := newIsolatedHarness(t, chainSet())
	ctx := context.Background()
	for i := range 3 {
		h.process(h.rec("B", fmt.Sprintf("b%d", i), fmt.Sprintf("x%d", i)))
	}
	if _, err := h.pool.Exec(ctx, `UPDATE sequence_instance SET retain_until = now() - interval '1 day', remove_after = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	second, err := New(h.pool, chainSet(), newTestListener(), h.engine.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.ResignHousekeeping)

	dl := &blockingDeadLetterer{entered: make(chan struct{}), released: make(chan struct{})}
	hc := HousekeepingConfig{ExpiryDelay: time.Minute, BatchSize: 1, MaxDuration: time.Hour}
	done := make(chan error, 1)
	go func() {
		_, err := h.engine.Housekeep(ctx, hc, dl)
		done <- err
	}()
	<-dl.entered // inside the first deletion batch, its lease row locked
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	leader, err := second.LeadHousekeeping(lctx)
	cancel()
	if err != nil || leader {
		t.Fatalf("LeadHousekeeping during the leader's batch = %v, %v; want false at once", leader, err)
	}
	expired := make(chan error, 1)
	go func() {
		_, err := h.pool.Exec(ctx, `UPDATE housekeeping_lease SET expires_at = now() - interval '1 second'`)
		expired <- err
	}()
	waitFor(t, "the takeover to wait for the batch's lock on the lease", func() bool {
		return h.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND query LIKE 'UPDATE housekeeping_lease SET expires_at = now() - %'`) == 1
	})
	close(dl.released)
	if err := <-expired; err != nil {
		t.Fatal(err)
	}
	if n := h.count(`SELECT count(*) FROM sequence_instance WHERE context_id LIKE $1`, h.prefix+"%"); n > 2 {
		t.Fatalf("%d instances left when the takeover got the lease row, want the batch that held it committed", n)
	}
	if err := <-done; err != nil && !errors.Is(err, errLeadLost) {
		t.Fatal(err)
	}

	if leader, err := second.LeadHousekeeping(ctx); err != nil || !leader {
		t.Fatalf("LeadHousekeeping after the lease ran out = %v, %v; want the second engine to lead", leader, err)
	}
	conn, err := h.engine.maint.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	ran := false
	hk := &housekeeper{e: h.engine, conn: conn, cfg: hc, dl: dl}
	_, err = hk.fenced(ctx, func(context.Context, pgx.Tx) (int, error) { ran = true; return 0, nil })
	if !errors.Is(err, errLeadLost) || ran {
		t.Fatalf("the old leader's batch after the takeover: ran %v, error %v; want it not run and %v", ran, err, errLeadLost)
	}
}

// steppingClock advances a minute on every reading.
type steppingClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *steppingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Minute)
	return c.now
}

func (c *steppingClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func TestHousekeepingStopsBetweenBatchesAtMaxDuration(t *testing.T) {
	clock := &steppingClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	h := newIsolatedHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("single", mt("A", "", nil))}),
		func(c *harnessSettings) { c.Clock = clock })
	for i := range 5 {
		h.process(h.rec("A", string(rune('a'+i)), string(rune('a'+i))))
	}
	rep := h.housekeep(HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: 1, MaxDuration: 5 * time.Minute}, &recordingDeadLetterer{})
	if rep.Finished || rep.DeletedClosed == 0 || rep.DeletedClosed >= 5 {
		t.Fatalf("run = %+v, want stopped by MaxDuration after some but not all batches", rep)
	}
	if n := h.count(`SELECT count(*) FROM sequence_instance WHERE state = 'CLOSED'`); n != 5-rep.DeletedClosed {
		t.Fatalf("closed instances left = %d, want %d", n, 5-rep.DeletedClosed)
	}
}

type failingDeadLetterer struct{}

func (failingDeadLetterer) DeadLetter(context.Context, Message, string) error {
	return errors.New("dead-letter topic unavailable")
}

func TestHousekeepingKeepsWaitingMessagesWhoseDeadLetterFailed(t *testing.T) {
	h := newIsolatedHarness(t, chainSet())
	h.process(h.rec("B", "b1", "stuck"))
	hc := HousekeepingConfig{ExpiryDelay: time.Minute, BatchSize: 10, MaxDuration: time.Hour}
	h.clock.Step(time.Hour + time.Minute)
	h.housekeep(hc, failingDeadLetterer{})
	h.clock.Step(2 * time.Minute)
	if _, err := h.engine.Housekeep(context.Background(), hc, failingDeadLetterer{}); err == nil {
		t.Fatal("housekeeping succeeded although the dead letter failed")
	}
	if s := h.states("B", "b1"); len(s) != 1 || s[0] != stateWaiting {
		t.Fatalf("B = %v, want still WAITING: it must not be deleted without its dead letter", s)
	}
}
