package inbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// protectedChainSet is chainSet with a duplicate-protection window longer than its retention, so
// that a test tells the window (from closing) apart from the retention (from creation).
func protectedChainSet(window time.Duration) *sequence.Set {
	set := chainSet()
	set.Sequences()[0].DuplicateProtection = window
	return set
}

// TestLateDuplicateOfAClosedInstanceIsRecognisedUntilItsWindowHasPassed closes an instance, lets
// housekeeping run after the retention but inside the duplicate-protection window, sends a late
// duplicate, and runs housekeeping again once the window has passed.
func TestLateDuplicateOfAClosedInstanceIsRecognisedUntilItsWindowHasPassed(t *testing.T) {
	h := newIsolatedHarness(t, protectedChainSet(2*time.Hour))
	for _, typ := range []string{"A", "B", "C"} {
		h.process(h.rec(typ, typ+"1", "done"))
	}
	hc := HousekeepingConfig{ExpiryDelay: time.Minute, BatchSize: 10, MaxDuration: time.Hour}

	// 90 minutes after closing: past the retention (1h from creation), inside the window (2h from
	// closing).
	h.clock.Step(90 * time.Minute)
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep != (HousekeepingReport{Leader: true, Finished: true}) {
		t.Fatalf("run inside the window = %+v, want nothing deleted or marked", rep)
	}
	if s, n := h.instanceState("chain", "done"), h.claims("B", "B1"); s != "CLOSED" || n != 1 {
		t.Fatalf("inside the window: instance %q with %d claims of B, want CLOSED with its claim", s, n)
	}
	calls := h.listener.callCount()
	if res := h.process(h.rec("B", "B1", "done")); res.Outcome != Duplicate {
		t.Fatalf("late duplicate inside the window = %v, want Duplicate", res.Outcome)
	}
	if n := h.listener.callCount(); n != calls {
		t.Fatalf("late duplicate inside the window reached the listener (%d calls, want %d)", n, calls)
	}
	if n := h.count(`SELECT count(*) FROM sequence_instance`); n != 1 {
		t.Fatalf("instances after the late duplicate = %d, want the closed one only", n)
	}
	if s := h.states("B", "B1"); len(s) != 1 || s[0] != stateProcessed {
		t.Fatalf("rows of B after the late duplicate = %v, want the one PROCESSED", s)
	}

	// Exactly two hours after closing the window has passed: the instance goes with its claims.
	h.clock.Step(30 * time.Minute)
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep != (HousekeepingReport{Leader: true, Finished: true, DeletedClosed: 1}) {
		t.Fatalf("run at the end of the window = %+v, want the closed instance deleted", rep)
	}
	h.requireEngineTablesEmpty("after the window")
	// After the window a duplicate is a new message: a new instance, where B waits for A.
	if res := h.process(h.rec("B", "B1", "done")); res.Outcome != Buffered {
		t.Fatalf("duplicate after the window = %v, want Buffered in a new instance", res.Outcome)
	}
}

// TestClosingAMarkedInstanceStartsItsWindow closes an instance that housekeeping had already
// marked for removal as expired: closing replaces the removal time by the window's end.
func TestClosingAMarkedInstanceStartsItsWindow(t *testing.T) {
	h := newIsolatedHarness(t, protectedChainSet(2*time.Hour))
	h.process(h.rec("A", "A1", "late"))
	h.process(h.rec("B", "B1", "late"))
	hc := HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: 10, MaxDuration: time.Hour}
	h.clock.Step(61 * time.Minute)
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep.MarkedExpired != 1 {
		t.Fatalf("run past the retention = %+v, want the open instance marked", rep)
	}
	h.process(h.rec("C", "C1", "late"))
	if s := h.instanceState("chain", "late"); s != "CLOSED" {
		t.Fatalf("instance = %q, want CLOSED by C", s)
	}
	// Past the expiry removal time (retain_until + 1h), inside the window (2h from closing).
	h.clock.Step(90 * time.Minute)
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep.DeletedClosed != 0 || rep.DeletedExpired != 0 {
		t.Fatalf("run inside the window = %+v, want nothing deleted", rep)
	}
	if res := h.process(h.rec("A", "A1", "late")); res.Outcome != Duplicate {
		t.Fatalf("late duplicate = %v, want Duplicate", res.Outcome)
	}
	h.clock.Step(30 * time.Minute)
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep.DeletedClosed != 1 {
		t.Fatalf("run after the window = %+v, want the closed instance deleted", rep)
	}
}

// TestClosedInstanceWithoutWindowGetsItsSequencesWindow stands for instances closed before the
// schema had windows, or by an older consumer during a rolling update: CLOSED with no
// remove_after. Housekeeping gives them closed_at plus their sequence's window; the instance of a
// sequence that is no longer declared gets none and goes at once.
func TestClosedInstanceWithoutWindowGetsItsSequencesWindow(t *testing.T) {
	h := newIsolatedHarness(t, protectedChainSet(2*time.Hour))
	for _, typ := range []string{"A", "B", "C"} {
		h.process(h.rec(typ, typ+"1", "old"))
	}
	closedAt := h.clock.Now().Add(-30 * time.Minute)
	if _, err := h.pool.Exec(context.Background(),
		`UPDATE sequence_instance SET remove_after = NULL, closed_at = $1`, closedAt); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(context.Background(), `INSERT INTO sequence_instance (name, context_id, state, closed_at, retain_until)
		VALUES ('undeclared', $1, 'CLOSED', $2, $2)`, h.ctxID("gone"), closedAt); err != nil {
		t.Fatal(err)
	}
	hc := HousekeepingConfig{ExpiryDelay: time.Minute, BatchSize: 10, MaxDuration: time.Hour}
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep != (HousekeepingReport{Leader: true, Finished: true, WindowedClosed: 2, DeletedClosed: 1}) {
		t.Fatalf("first run = %+v, want both windowed and the undeclared one deleted", rep)
	}
	if n := h.count(`SELECT count(*) FROM sequence_instance WHERE remove_after = closed_at + interval '2 hours'`); n != 1 {
		t.Fatalf("instances with remove_after = closed_at + 2h: %d, want the chain instance", n)
	}
	if res := h.process(h.rec("C", "C1", "old")); res.Outcome != Duplicate {
		t.Fatalf("duplicate inside the window = %v, want Duplicate", res.Outcome)
	}
	h.clock.Step(90 * time.Minute)
	if rep := h.housekeep(hc, &recordingDeadLetterer{}); rep.DeletedClosed != 1 || rep.WindowedClosed != 0 {
		t.Fatalf("run after the window = %+v, want the chain instance deleted", rep)
	}
}

// TestHousekeepingDeletesClosedInstancesInBoundedBatchesOldestWindowFirst stops a run between
// batches (every clock reading advances a minute) and checks that whole batches went, the ones
// whose window ended first, and that the next run deletes the rest.
func TestHousekeepingDeletesClosedInstancesInBoundedBatchesOldestWindowFirst(t *testing.T) {
	clock := &steppingClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	set := sequence.NewSet([]*sequence.Sequence{seqOf("single", mt("A", "", nil))})
	set.Sequences()[0].DuplicateProtection = 10 * time.Minute
	h := newIsolatedHarness(t, set, func(c *harnessSettings) { c.Clock = clock })
	const instances, batch = 7, 2
	for i := range instances {
		h.process(h.rec("A", string(rune('a'+i)), string(rune('a'+i))))
	}
	clock.now = clock.now.Add(time.Hour)
	rep := h.housekeep(HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: batch, MaxDuration: 7 * time.Minute}, &recordingDeadLetterer{})
	if rep.Finished || rep.DeletedClosed == 0 || rep.DeletedClosed >= instances || rep.DeletedClosed%batch != 0 {
		t.Fatalf("run = %+v, want stopped by MaxDuration after whole batches of %d, not all %d", rep, batch, instances)
	}
	// The survivors are the instances that closed last.
	if n := h.count(`SELECT count(*) FROM sequence_instance WHERE context_id > $1`, h.ctxID(string(rune('a'+rep.DeletedClosed-1)))); n != instances-rep.DeletedClosed {
		t.Fatalf("instances left after the first %d = %d, want %d: the oldest windows go first", rep.DeletedClosed, n, instances-rep.DeletedClosed)
	}
	rest := h.housekeep(HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: batch, MaxDuration: time.Hour}, &recordingDeadLetterer{})
	if !rest.Finished || rest.DeletedClosed != instances-rep.DeletedClosed {
		t.Fatalf("second run = %+v, want the other %d deleted", rest, instances-rep.DeletedClosed)
	}
}

// TestHousekeepingQueriesUseTheirIndexes plans every housekeeping query and the expired gauge
// with sequential scans disabled: a plan that still scans the table has no usable index, which
// would make housekeeping walk every instance kept for its duplicates.
func TestHousekeepingQueriesUseTheirIndexes(t *testing.T) {
	h := newIsolatedHarness(t, chainSet())
	now := h.clock.Now()
	for _, q := range []struct {
		name, sql, index string
		args             []any
	}{
		{"window closed", windowClosedSQL, "sequence_instance_closed_remove_after", []any{10, now, []string{"chain"}, []float64{60}}},
		{"delete closed", closedBatchSQL, "sequence_instance_closed_remove_after", []any{10, now}},
		{"mark expired", markExpiredSQL, "sequence_instance_retain_until", []any{10, now, 60.0}},
		{"delete expired", removableBatchSQL, "sequence_instance_expired_remove_after", []any{10, now}},
		{"expired gauge", `SELECT count(*) FROM sequence_instance WHERE state = 'OPEN' AND remove_after IS NOT NULL`,
			"sequence_instance_expired_remove_after", nil},
	} {
		t.Run(q.name, func(t *testing.T) {
			plan := h.plan(q.sql, q.args...)
			if !strings.Contains(plan, q.index) || strings.Contains(plan, "Seq Scan on sequence_instance") {
				t.Fatalf("plan does not use %s:\n%s", q.index, plan)
			}
		})
	}
}

// plan returns the query plan of sql with sequential scans disabled.
func (h *harness) plan(sql string, args ...any) string {
	h.t.Helper()
	return h.explain(`SET LOCAL enable_seqscan = off`, sql, args...)
}

// explain returns the query plan of sql, in a transaction that first runs setting (if any).
func (h *harness) explain(setting, sql string, args ...any) string {
	h.t.Helper()
	ctx := context.Background()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if setting != "" {
		if _, err := tx.Exec(ctx, setting); err != nil {
			h.t.Fatal(err)
		}
	}
	rows, err := tx.Query(ctx, `EXPLAIN `+sql, args...)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			h.t.Fatal(err)
		}
		lines = append(lines, line)
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}
