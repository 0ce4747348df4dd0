package inbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

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

func TestHousekeepingRunsOnOneConsumerAtATime(t *testing.T) {
	h := newIsolatedHarness(t, chainSet())
	for _, typ := range []string{"A", "B", "C"} {
		h.process(h.rec(typ, typ+"1", "done"))
	}
	other, err := h.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if _, err := other.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, housekeepingLockKey); err != nil {
		t.Fatal(err)
	}
	hc := HousekeepingConfig{ExpiryDelay: time.Minute, BatchSize: 10, MaxDuration: time.Minute}
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep != (HousekeepingReport{}) {
		t.Fatalf("run while another consumer holds the lock = %+v, want nothing done", rep)
	}
	if s := h.instanceState("chain", "done"); s != "CLOSED" {
		t.Fatalf("instance = %q, want untouched", s)
	}
	if _, err := other.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, housekeepingLockKey); err != nil {
		t.Fatal(err)
	}
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); !rep.Leader || rep.DeletedClosed != 1 {
		t.Fatalf("run after the lock was released = %+v, want leader deleting 1", rep)
	}
	// The leader keeps the lock between runs, until it resigns.
	var got bool
	if err := other.QueryRow(context.Background(), `SELECT pg_try_advisory_lock($1)`, housekeepingLockKey).Scan(&got); err != nil || got {
		t.Fatalf("housekeeping lock taken by another session after the leader's run (%v), want it kept by the leader", err)
	}
	h.engine.ResignHousekeeping()
	if err := other.QueryRow(context.Background(), `SELECT pg_try_advisory_lock($1)`, housekeepingLockKey).Scan(&got); err != nil || !got {
		t.Fatalf("housekeeping lock still held after the leader resigned (%v)", err)
	}
	if _, err := other.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, housekeepingLockKey); err != nil {
		t.Fatal(err)
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
