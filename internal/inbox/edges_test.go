package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// The tests of this file prove the edges of the engine (issue 11): operator actions take the
// claim path of a delivery, every state write is guarded by the state it expects, a pending
// action survives every write but its own execution, maintenance never takes a record's
// connection, and historical duplicates are delivered at most once.

// rejectType makes the listener fail every message of the qualified type.
func rejectType(l *testListener, qualified string) {
	l.setBehaviour(func(_ context.Context, m Message) error {
		if m.QualifiedType == qualified {
			return errors.New("rejected by the sink")
		}
		return nil
	})
}

func (h *harness) request(qualified, idem string, a MessageAction) {
	h.t.Helper()
	if err := RequestMessageAction(context.Background(), h.pool, "", qualified, h.prefix+idem, a); err != nil {
		h.t.Fatal(err)
	}
}

// runActionsUntilDone runs the pending actions until none of the test's is left (an instance
// that a release holds right now is left to the next run).
func (h *harness) runActionsUntilDone(dl DeadLetterer) {
	h.t.Helper()
	for range 50 {
		if _, err := h.engine.RunPendingActions(context.Background(), dl); err != nil {
			h.t.Fatal(err)
		}
		if h.pendingActions() == 0 {
			return
		}
	}
	h.t.Fatalf("%d actions still pending after 50 runs", h.pendingActions())
}

func (h *harness) deliveries(qualified, idem string) int {
	h.listener.mu.Lock()
	defer h.listener.mu.Unlock()
	n := 0
	for _, m := range h.listener.delivered {
		if m.QualifiedType == qualified && m.Record.IdempotenceID == h.prefix+idem {
			n++
		}
	}
	return n
}

func TestFailedConsumeLeavesTheMessageFailedWithoutClaim(t *testing.T) {
	h := newHarness(t, chainSet())
	rejectType(h.listener, "A")
	a := h.rec("A", "a1", "x")
	if res := h.process(a); res.Outcome != Failed {
		t.Fatalf("first delivery = %v, want Failed", res.Outcome)
	}
	h.request("A", "a1", ActionConsume)
	h.runActions(1)
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); !slices.Equal(s, []string{stateFailed}) || c != 0 {
		t.Fatalf("after a failed CONSUME: rows %v, claims %d; want FAILED without claim, so that a resend can retry it", s, c)
	}
	h.listener.setBehaviour(nil)
	if res := h.process(a); res.Outcome != Delivered {
		t.Fatalf("resend after a failed CONSUME = %v, want Delivered", res.Outcome)
	}
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); !slices.Equal(s, []string{stateProcessed}) || c != 1 {
		t.Fatalf("after the resend: rows %v, claims %d; want PROCESSED with its claim", s, c)
	}
}

// TestExpireRacingAResendNeverUndoesProcessed races the resend of a FAILED message, whose
// predecessor is missing (so the resend buffers it), against an EXPIRE of the same message.
// Whichever goes first, the message ends PROCESSED and is never delivered: the buffer write is
// guarded by the state it expects, and EXPIRE waits for the resend's claim.
func TestExpireRacingAResendNeverUndoesProcessed(t *testing.T) {
	h := newHarness(t, chainSet())
	dl := &recordingDeadLetterer{}
	const iterations = 150
	for it := range iterations {
		idem, ctxID := fmt.Sprintf("b%d", it), fmt.Sprintf("x%d", it)
		h.insertHistoricalRows("B", idem, ctxID, stateFailed)
		h.request("B", idem, ActionExpire)
		resend := h.rec("B", idem, ctxID)
		errs := raceAll([]func() error{
			func() error { _, err := h.engine.Process(context.Background(), resend); return err },
			func() error { _, err := h.engine.RunPendingActions(context.Background(), dl); return err },
		})
		for _, err := range errs {
			if err != nil && !errors.Is(err, errStateChanged) {
				t.Fatalf("iteration %d: %v", it, err)
			}
		}
		h.runActionsUntilDone(dl)
		if s := h.states("B", idem); !slices.Equal(s, []string{stateProcessed}) {
			t.Fatalf("iteration %d: B = %v, want PROCESSED: an EXPIRE is final", it, s)
		}
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls = %d, want 0: an expired message is never delivered", n)
	}
}

func TestPendingActionSurvivesAResendThatFailsAgain(t *testing.T) {
	h := newHarness(t, chainSet())
	rejectType(h.listener, "A")
	a := h.rec("A", "a1", "x")
	h.process(a)
	h.request("A", "a1", ActionConsume)
	if res := h.process(a); res.Outcome != Failed {
		t.Fatalf("resend = %v, want Failed again", res.Outcome)
	}
	h.listener.setBehaviour(nil)
	h.runActions(1)
	if got := h.deliveries("A", "a1"); got != 1 {
		t.Fatalf("A delivered %d times, want once by the CONSUME recorded before the resend", got)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("A = %v, want PROCESSED", s)
	}
}

func TestPendingActionSurvivesBufferingAndRelease(t *testing.T) {
	h := newHarness(t, chainSet())
	h.insertHistoricalRows("B", "b1", "x", stateFailed)
	h.request("B", "b1", ActionExpire)
	if res := h.process(h.rec("B", "b1", "x")); res.Outcome != Buffered {
		t.Fatalf("resend of B = %v, want Buffered (A missing)", res.Outcome)
	}
	if n := h.pendingActions(); n != 1 {
		t.Fatalf("pending actions after buffering = %d, want 1", n)
	}
	h.process(h.rec("A", "a1", "x"))
	if n := h.pendingActions(); n != 1 {
		t.Fatalf("pending actions after the release of B = %d, want 1: it is executed by its own run only", n)
	}
	h.runActions(1)
	if n := h.pendingActions(); n != 0 {
		t.Fatalf("pending actions after the run = %d, want 0", n)
	}
}

// blockingDeadLetterer blocks every dead letter until released, like a dead-letter produce
// waiting for a broker.
type blockingDeadLetterer struct {
	entered  chan struct{}
	released chan struct{}
	once     sync.Once
}

func (d *blockingDeadLetterer) DeadLetter(ctx context.Context, _ Message, _ string) error {
	d.once.Do(func() { close(d.entered) })
	select {
	case <-d.released:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestHousekeepingNeverTakesARecordsConnection runs housekeeping whose dead-letter produce hangs
// while a record is processed on a records pool of two connections (T1 and its state write).
func TestHousekeepingNeverTakesARecordsConnection(t *testing.T) {
	h := newIsolatedHarness(t, chainSet(), withRecordsPool(2))
	h.process(h.rec("B", "b1", "stuck"))
	hc := HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: 10, MaxDuration: time.Hour}
	h.clock.Step(time.Hour + time.Minute)
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep.MarkedExpired != 1 || rep.DeletedExpired != 0 {
		t.Fatalf("first run = %+v, want the instance marked for removal", rep)
	}
	h.clock.Step(2 * time.Hour)

	dl := &blockingDeadLetterer{entered: make(chan struct{}), released: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := h.engine.Housekeep(context.Background(), hc, dl)
		done <- err
	}()
	select {
	case <-dl.entered:
	case err := <-done:
		t.Fatalf("housekeeping ended (%v) without dead-lettering", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := h.engine.Process(ctx, h.rec("A", "a1", "other"))
	close(dl.released)
	if err != nil || res.Outcome != Delivered {
		t.Fatalf("record processed while housekeeping waits for a dead letter = %v, %v; want Delivered", res.Outcome, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestActionsNeverTakeARecordsConnection holds an instance's release lock, so that the action run
// waits, while records are processed on a records pool of two connections.
func TestActionsNeverTakeARecordsConnection(t *testing.T) {
	h := newHarness(t, chainSet(), withRecordsPool(2))
	h.process(h.rec("B", "b1", "x"))
	h.request("B", "b1", ActionConsume)
	entered, release := blockFirstCall(t, h.listener, nil)
	done := make(chan error, 1)
	go func() {
		_, err := h.engine.RunPendingActions(context.Background(), &recordingDeadLetterer{})
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("action run ended (%v) without delivering", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := h.engine.Process(ctx, h.rec("A", "a2", "other"))
	release()
	if err != nil || res.Outcome != Delivered {
		t.Fatalf("record processed while an action delivers = %v, %v; want Delivered", res.Outcome, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// insertHistoricalMessage stores rows of one logical message in the given states, each WAITING
// and FAILED row with a raw record, as a database from before the claim table holds them.
func (h *harness) insertHistoricalMessage(rec Record, states ...string) {
	h.t.Helper()
	ctx := context.Background()
	var instanceID int64
	err := h.pool.QueryRow(ctx, `INSERT INTO sequence_instance (name, context_id, retain_until)
VALUES ('chain', $1, now() + interval '1 hour') ON CONFLICT (name, context_id) DO UPDATE SET name = EXCLUDED.name RETURNING id`,
		rec.ContextID).Scan(&instanceID)
	if err != nil {
		h.t.Fatal(err)
	}
	headers, err := encodeHeaders(rec.Headers)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, s := range states {
		if _, err := h.pool.Exec(ctx, `WITH m AS (
  INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, state)
  VALUES ($1, $2, $3, $4) RETURNING id)
INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
SELECT $1, id, $5, $6, $7 FROM m WHERE $4 <> 'PROCESSED'`, instanceID, rec.Type, rec.IdempotenceID, s, rec.Key, rec.Value, headers); err != nil {
			h.t.Fatal(err)
		}
	}
}

// TestHistoricalDuplicatesAreDeliveredAtMostOnce stores every combination of two and three
// historical rows of one logical message B, then processes its predecessor A, a resend of B and
// a duplicate of A. B is delivered once when no row says PROCESSED, never otherwise.
func TestHistoricalDuplicatesAreDeliveredAtMostOnce(t *testing.T) {
	h := newHarness(t, chainSet())
	all := []string{stateWaiting, stateProcessed, stateFailed}
	var combos [][]string
	for _, x := range all {
		for _, y := range all {
			combos = append(combos, []string{x, y})
			for _, z := range all {
				combos = append(combos, []string{x, y, z})
			}
		}
	}
	for i, states := range combos {
		ctxID, idemB := fmt.Sprintf("c%d", i), fmt.Sprintf("b%d", i)
		b := h.rec("B", idemB, ctxID)
		h.insertHistoricalMessage(b, states...)
		a := h.rec("A", fmt.Sprintf("a%d", i), ctxID)
		h.process(a)
		h.process(b)
		h.process(a)
		want := 1
		if slices.Contains(states, stateProcessed) {
			want = 0
		}
		if got := h.deliveries("B", idemB); got != want {
			t.Errorf("historical rows %s: B delivered %d times, want %d", strings.Join(states, ","), got, want)
		}
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Fatalf("listener ran twice at the same time for %v", o)
	}
}

func TestConsumeDeliversAProcessedMessageAgain(t *testing.T) {
	h := newHarness(t, keepingChainSet())
	a := h.rec("A", "a1", "x")
	h.process(a)
	h.request("A", "a1", ActionConsume)
	h.runActions(1)
	if got := h.deliveries("A", "a1"); got != 2 {
		t.Fatalf("A delivered %d times, want twice: once by its record, once on request", got)
	}
	h.listener.mu.Lock()
	again := h.listener.delivered[1].Record
	h.listener.mu.Unlock()
	if string(again.Value) != string(a.Value) || string(again.Key) != string(a.Key) || len(again.Headers) != len(a.Headers) {
		t.Fatalf("redelivered record %+v, want the original byte for byte", again)
	}
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); !slices.Equal(s, []string{stateProcessed}) || c != 1 {
		t.Fatalf("A rows %v, claims %d; want PROCESSED with its claim", s, c)
	}
}

func TestConsumeDeliversAMessageWhoseFirstDeliveryFailed(t *testing.T) {
	h := newHarness(t, chainSet())
	rejectType(h.listener, "A")
	a := h.rec("A", "a1", "x")
	h.process(a)
	h.process(h.rec("B", "b1", "x"))
	h.listener.setBehaviour(nil)
	h.request("A", "a1", ActionConsume)
	h.runActions(1)
	if got := h.listener.deliveredTypes(h.ctxID("x")); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("delivered %v, want A (consumed from its stored record) then B (released)", got)
	}
	h.listener.mu.Lock()
	got := h.listener.delivered[0].Record
	h.listener.mu.Unlock()
	if string(got.Value) != string(a.Value) || got.Origin != a.Origin {
		t.Fatalf("consumed record %+v, want the record of A's failed delivery", got)
	}
	if s, c := h.states("A", "a1"), h.claims("A", "a1"); !slices.Equal(s, []string{stateProcessed}) || c != 1 {
		t.Fatalf("A rows %v, claims %d; want PROCESSED with its claim", s, c)
	}
}

func TestExpireOfAProcessedMessageChangesNothing(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("A", "a1", "x"))
	h.request("A", "a1", ActionExpire)
	h.runActions(1)
	if s, n := h.states("A", "a1"), h.listener.callCount(); !slices.Equal(s, []string{stateProcessed}) || n != 1 {
		t.Fatalf("A rows %v after %d listener calls; want PROCESSED, delivered once", s, n)
	}
}

// TestConsumeRacingAResendDeliversOnce races a CONSUME of a FAILED message against its resend:
// both take the claim, so the listener never runs twice at once for it, and exactly one of them
// delivers it.
func TestConsumeRacingAResendDeliversOnce(t *testing.T) {
	h := newHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("single", mt("A", "", nil))}))
	const iterations = 60
	for it := range iterations {
		idem, ctxID := fmt.Sprintf("a%d", it), fmt.Sprintf("x%d", it)
		rec := h.rec("A", idem, ctxID)
		rejectType(h.listener, "A")
		h.process(rec)
		h.request("A", idem, ActionConsume)
		h.listener.setBehaviour(nil)
		errs := raceAll([]func() error{
			func() error { _, err := h.engine.Process(context.Background(), rec); return err },
			func() error {
				_, err := h.engine.RunPendingActions(context.Background(), &recordingDeadLetterer{})
				return err
			},
		})
		for _, err := range errs {
			if err != nil {
				t.Fatalf("iteration %d: %v", it, err)
			}
		}
		h.runActionsUntilDone(&recordingDeadLetterer{})
		if s, c := h.states("A", idem), h.claims("A", idem); !slices.Equal(s, []string{stateProcessed}) || c != 1 {
			t.Fatalf("iteration %d: rows %v, claims %d; want PROCESSED with its claim", it, s, c)
		}
		if got := h.deliveries("A", idem); got < 1 || got > 2 {
			t.Fatalf("iteration %d: A delivered %d times; want once by the resend or the CONSUME, twice only when CONSUME ran on the PROCESSED message", it, got)
		}
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Fatalf("listener ran twice at the same time for %v", o)
	}
}

// TestMaintenanceWaitsForAConnectionNoLongerThanItsAcquireTimeout exhausts the maintenance pool:
// an action run and a housekeeping run give up with an error instead of waiting without end.
func TestMaintenanceWaitsForAConnectionNoLongerThanItsAcquireTimeout(t *testing.T) {
	h := newHarness(t, chainSet(), func(s *harnessSettings) { s.AcquireTimeout = 200 * time.Millisecond })
	for range MaintenanceConnections {
		c, err := h.engine.maint.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	if _, err := h.engine.RunPendingActions(context.Background(), &recordingDeadLetterer{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("action run on an exhausted maintenance pool = %v, want its acquire deadline exceeded", err)
	}
	hc := HousekeepingConfig{ExpiryDelay: time.Minute, BatchSize: 10, MaxDuration: time.Minute}
	if _, err := h.engine.Housekeep(context.Background(), hc, &recordingDeadLetterer{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("housekeeping on an exhausted maintenance pool = %v, want its acquire deadline exceeded", err)
	}
	if res := h.process(h.rec("A", "a1", "x")); res.Outcome != Delivered {
		t.Fatalf("record processed while the maintenance pool is exhausted = %v, want Delivered", res.Outcome)
	}
}

func (h *harness) result(requestID string) ActionResult {
	h.t.Helper()
	r, err := ActionResultOf(context.Background(), h.pool, h.prefix+requestID)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func TestExecutedActionsReportTheirOutcome(t *testing.T) {
	h := newHarness(t, chainSet())
	ctx := context.Background()
	rejectType(h.listener, "A")
	h.process(h.rec("A", "a1", "x"))
	h.process(h.rec("B", "b1", "x"))
	h.process(h.rec("C", "c1", "y"))
	for _, r := range []struct{ id, typ, idem string }{{"consume-a", "A", "a1"}, {"expire-b", "B", "b1"}} {
		if err := RequestMessageAction(ctx, h.pool, h.prefix+r.id, r.typ, h.prefix+r.idem, ActionConsume); err != nil {
			t.Fatal(err)
		}
	}
	// A second request on B replaces the first before it ran.
	if err := RequestMessageAction(ctx, h.pool, h.prefix+"expire-b-2", "B", h.prefix+"b1", ActionExpire); err != nil {
		t.Fatal(err)
	}
	if err := RequestInstanceAction(ctx, h.pool, h.prefix+"close-y", "chain", h.ctxID("y"), ActionClose); err != nil {
		t.Fatal(err)
	}
	if r := h.result("consume-a"); r.Done {
		t.Fatalf("result before any run = %+v, want not done", r)
	}
	if r := h.result("expire-b"); r.Outcome != OutcomeSuperseded || !strings.Contains(r.Detail, h.prefix+"expire-b-2") {
		t.Fatalf("replaced request = %+v, want Superseded naming its successor", r)
	}
	// Recording a request again (a rerun of its Job) changes nothing.
	if err := RequestMessageAction(ctx, h.pool, h.prefix+"expire-b", "B", h.prefix+"b1", ActionConsume); err != nil {
		t.Fatal(err)
	}
	h.runActionsUntilDone(&recordingDeadLetterer{})
	if r := h.result("consume-a"); !r.Done || r.Outcome != OutcomeFailed || !strings.Contains(r.Detail, "rejected by the sink") {
		t.Fatalf("failed CONSUME = %+v, want Failed with the sink's error", r)
	}
	if r := h.result("expire-b-2"); r.Outcome != OutcomeExecuted || !strings.Contains(r.Detail, "marked PROCESSED without delivery") {
		t.Fatalf("EXPIRE = %+v, want Executed", r)
	}
	if r := h.result("close-y"); r.Outcome != OutcomeExecuted || !strings.Contains(r.Detail, "1 buffered message(s) FAILED") {
		t.Fatalf("CLOSE = %+v, want Executed naming the dead-lettered message", r)
	}
	if s := h.states("B", "b1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("B = %v, want PROCESSED by the EXPIRE, the superseded CONSUME never ran", s)
	}
	if _, err := ActionResultOf(ctx, h.pool, h.prefix+"never"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("result of an unknown request: %v, want ErrNotFound", err)
	}
}

// TestKnownSuccessIsRecordedAfterTheStateConnectionDies kills, from inside the sink's successful
// call, every idle connection of the records' pool, among them the one reserved for the state
// write, and cancels the record's context (a revocation): the state write retries on a new
// connection within the claim's lease, the success is recorded, and the sink is not called again.
func TestKnownSuccessIsRecordedAfterTheStateConnectionDies(t *testing.T) {
	h := newIsolatedHarness(t, chainSet())
	killer := newPool(t, testenvURL(h), 2)
	ctx, revoke := context.WithCancel(context.Background())
	defer revoke()
	h.listener.setBehaviour(func(context.Context, Message) error {
		var killed int
		if err := killer.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'idle' AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&killed); err != nil {
			return err
		}
		if killed == 0 {
			return errors.New("no idle connection to kill")
		}
		revoke()
		return nil
	})
	res, err := h.engine.Process(ctx, h.rec("A", "a1", "x"))
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("process = %v", err)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("A rows %v (outcome %v, %v); want the known success recorded PROCESSED", s, res.Outcome, err)
	}
	h.listener.setBehaviour(nil)
	if res := h.process(h.rec("A", "a1", "x")); res.Outcome != Duplicate {
		t.Fatalf("resend = %v, want Duplicate: the sink must not see the message again", res.Outcome)
	}
	if n := h.listener.callCount(); n != 1 {
		t.Fatalf("sink calls = %d, want 1", n)
	}
}

// testenvURL is the database URL of the harness's pool.
func testenvURL(h *harness) string {
	return h.pool.Config().ConnString()
}
