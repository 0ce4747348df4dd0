package inbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// insertClaimSQL is a claim taken by hand, outside the engine.
const insertClaimSQL = `INSERT INTO sequential_inbox_idempotence (message_type, idempotence_id, sequence_instance_id, created_at)
VALUES ($1, $2, $3, now())`

// foreignTx begins, on a connection of its own, a transaction that checks for deadlocks only
// after 30s: of a cycle it is part of, PostgreSQL aborts the other member, whose check runs first.
func (h *harness) foreignTx() (pgx.Tx, uint32) {
	h.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '30s'`); err != nil {
		h.t.Fatal(err)
	}
	return tx, conn.PgConn().PID()
}

// blockedBy lists the backends whose statement waits for a lock held by the backend pid.
func (h *harness) blockedBy(pid uint32) []int32 {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE $1::int4 = ANY(pg_blocking_pids(pid))`, int32(pid))
	if err != nil {
		h.t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		h.t.Fatal(err)
	}
	return pids
}

// TestBatchDeadlockIsRolledBackBeforeAnyDeliveryAndRetried puts a batch's claim statement into a
// real deadlock with another transaction T that takes two of the batch's claims in the other
// order, and makes the batch the victim: ProcessBatch retries it and delivers every message once,
// none of them in the attempt that was rolled back. It fails when 40P01 is not retried
// (ProcessBatch returns "deadlock detected").
//
// PostgreSQL checks a lock wait for a deadlock once, deadlock_timeout after the wait began, and
// aborts the session that checks. The batch inserts its claims in (type, idempotence ID) order,
// x1, x2, x3, in one statement, and would wait for T on a claim of T before T waits for it: its
// one check would come too early, and T's check would find the cycle and abort T. So a third
// transaction U holds x2 first: the batch takes x1 and waits for U; T holds x3 and waits for the
// batch's x1; then U rolls back, the batch takes x2 and waits for T on x3 — a new wait, whose
// check after the records' pool's 20ms (T's: 30s) finds the cycle and aborts the batch.
func TestBatchDeadlockIsRolledBackBeforeAnyDeliveryAndRetried(t *testing.T) {
	var retries retryLog
	h := newHarness(t, chainSet(), retries.option(), withRecordsSessionParams(map[string]string{"deadlock_timeout": "20ms"}))
	ctx := context.Background()
	recs := []Record{h.rec("A", "x1", "c1"), h.rec("A", "x2", "c2"), h.rec("A", "x3", "c3")}
	mtA, _ := h.engine.set.Lookup("A")
	instances := make([]int64, len(recs))
	for i, r := range recs {
		id, err := h.engine.getOrCreateInstance(ctx, h.pool, mtA.Sequence, r.ContextID)
		if err != nil {
			t.Fatal(err)
		}
		instances[i] = id
	}
	var deliveredBeforeRetry atomic.Int64
	h.listener.setBehaviour(func(context.Context, Message) error {
		if retries.n.Load() == 0 {
			deliveredBeforeRetry.Add(1)
		}
		return nil
	})

	u, uPID := h.foreignTx()
	if _, err := u.Exec(ctx, insertClaimSQL, "A", recs[1].IdempotenceID, instances[1]); err != nil {
		t.Fatal(err)
	}
	tx, tPID := h.foreignTx()
	if _, err := tx.Exec(ctx, insertClaimSQL, "A", recs[2].IdempotenceID, instances[2]); err != nil {
		t.Fatal(err)
	}

	var (
		res      []Result
		batchErr error
		wg       sync.WaitGroup
	)
	wg.Go(func() { res, batchErr = h.engine.ProcessBatch(ctx, recs) })
	waitFor(t, "the batch holds x1 and waits for U's x2", func() bool { return len(h.blockedBy(uPID)) > 0 })
	tErr := make(chan error, 1)
	go func() {
		_, err := tx.Exec(ctx, insertClaimSQL, "A", recs[0].IdempotenceID, instances[0])
		tErr <- err
	}()
	waitFor(t, "T waits for the batch's x1", func() bool {
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1))`, int32(tPID)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := u.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-tErr; err != nil {
		t.Fatalf("T's claim of x1: %v, want it granted once the batch, the deadlock's victim, rolled back", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	if batchErr != nil {
		t.Fatalf("process batch: %v, want the deadlock retried", batchErr)
	}
	if got, want := outcomes(res), []Outcome{Delivered, Delivered, Delivered}; !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	if n := retries.n.Load(); n < 1 {
		t.Fatal("no batch claim retried, want the deadlock's victim retried")
	}
	if n := deliveredBeforeRetry.Load(); n != 0 {
		t.Fatalf("%d listener calls before the retry, want none in the attempt that was rolled back", n)
	}
	if n := h.listener.callCount(); n != len(recs) {
		t.Fatalf("listener calls %d, want %d (one per message)", n, len(recs))
	}
	for _, id := range []string{"x1", "x2", "x3"} {
		if s := h.states("A", id); !slices.Equal(s, []string{stateProcessed}) {
			t.Fatalf("%s rows %v, want [PROCESSED]", id, s)
		}
		if n := h.claims("A", id); n != 1 {
			t.Fatalf("%s: %d claims, want 1", id, n)
		}
	}
}

// TestBatchWithACachedInstanceThatHousekeepingDeletedRecreatesIt deletes an instance after the
// engine cached its id, as housekeeping does. The batch's claim insert then fails on the foreign
// key; the batch evicts the cached id, creates the instance anew and delivers, without a delivery
// in the failed attempt. It fails when the batch does not retry errInstanceGone, or retries
// without evicting the stale id (every attempt fails on the foreign key again).
func TestBatchWithACachedInstanceThatHousekeepingDeletedRecreatesIt(t *testing.T) {
	var retries retryLog
	h := newHarness(t, chainSet(), retries.option())
	ctx := context.Background()
	if res := h.processBatch(h.rec("A", "a1", "c")); res[0].Outcome != Delivered {
		t.Fatalf("first message: %v, want Delivered", res[0].Outcome)
	}
	instanceOf := func(contextID string) (int64, bool) {
		var id int64
		err := h.pool.QueryRow(ctx, `SELECT id FROM sequence_instance WHERE name = 'chain' AND context_id = $1`, h.ctxID(contextID)).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return id, true
	}
	old, _ := instanceOf("c")
	if cached, ok := h.engine.instances.get(instanceKey{"chain", h.ctxID("c")}); !ok || cached != old {
		t.Fatalf("cached instance %d (%v), want %d", cached, ok, old)
	}
	if _, err := h.pool.Exec(ctx, `DELETE FROM sequence_instance WHERE id = $1`, old); err != nil {
		t.Fatal(err)
	}

	res, err := h.engine.ProcessBatch(ctx, []Record{h.rec("A", "a2", "c"), h.rec("A", "n1", "new")})
	if err != nil {
		t.Fatalf("process batch: %v, want the deleted instance recreated", err)
	}
	if got, want := outcomes(res), []Outcome{Delivered, Delivered}; !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	if n := retries.n.Load(); n != 1 {
		t.Fatalf("%d batch claims retried, want 1", n)
	}
	id, ok := instanceOf("c")
	if !ok || id == old {
		t.Fatalf("instance after the batch: %d (exists %v), want a new row instead of %d", id, ok, old)
	}
	if n := h.count(`SELECT count(*) FROM sequential_inbox_idempotence WHERE idempotence_id = $1 AND sequence_instance_id = $2`,
		h.prefix+"a2", id); n != 1 {
		t.Fatalf("a2: %d claims on the new instance, want 1", n)
	}
	if n := h.listener.callCount(); n != 3 {
		t.Fatalf("listener calls %d, want 3 (a1, then a2 and n1 once each)", n)
	}
	if s := h.states("A", "a2"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("a2 rows %v, want [PROCESSED]", s)
	}
}

// TestBatchStartsAListenerCallOnlyWhileItsDeadlineFits proves both cuts of a batch (fits): a
// listener call starts only while its whole ListenerDeadline fits before the caller's deadline,
// and within one ListenerDeadline of the batch's claims. The batch then
// returns a strict prefix without error; the records after it have neither claim nor stored
// state, and a second call with the rest delivers them; no record is delivered twice.
//
// Each case's 8 calls of 100ms fit only the other bound: the caller's case fails when fits
// ignores ctx's deadline, the claims' case when it ignores the time since the claims (then all 8
// are delivered in the first call); both fail when the records the batch did not get to keep
// their claims (the second call finds them duplicates).
func TestBatchStartsAListenerCallOnlyWhileItsDeadlineFits(t *testing.T) {
	const records, call = 8, 100 * time.Millisecond
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		// callerTimeout is the caller's context's timeout; zero for none.
		callerTimeout time.Duration
	}{
		// Calls may start for 300ms; the time since the claims would allow 5s.
		{name: "caller's deadline", deadline: 5 * time.Second, callerTimeout: 5*time.Second + 3*call},
		// Calls may start for 300ms after the claim; there is no caller's deadline.
		{name: "time since the claims", deadline: 3 * call},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, chainSet(), func(s *harnessSettings) { s.ListenerDeadline = tc.deadline })
			h.listener.setBehaviour(func(ctx context.Context, _ Message) error {
				select {
				case <-time.After(call):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			var recs []Record
			for i := range records {
				recs = append(recs, h.rec("A", string(rune('a'+i)), string(rune('a'+i))))
			}
			ctx := context.Background()
			if tc.callerTimeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.callerTimeout)
				defer cancel()
			}
			res, err := h.engine.ProcessBatch(ctx, recs)
			if err != nil {
				t.Fatalf("process batch: %v, want a prefix without error", err)
			}
			n := len(res)
			if n == 0 || n >= records {
				t.Fatalf("%d of %d records done, want a strict prefix", n, records)
			}
			for i, r := range res {
				if r.Outcome != Delivered {
					t.Fatalf("record %d: %v, want Delivered", i, r.Outcome)
				}
			}
			if c := h.listener.callCount(); c != n {
				t.Fatalf("listener calls %d after a prefix of %d, want one per record of the prefix", c, n)
			}
			for _, r := range recs[n:] {
				id := strings.TrimPrefix(r.IdempotenceID, h.prefix)
				if c := h.claims("A", id); c != 0 {
					t.Fatalf("%s after the prefix: %d claims, want 0", id, c)
				}
				if s := h.states("A", id); len(s) != 0 {
					t.Fatalf("%s after the prefix: rows %v, want none", id, s)
				}
			}

			rest, err := processAllInBatches(context.Background(), h.engine, recs[n:])
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range rest {
				if r.Outcome != Delivered {
					t.Fatalf("rest, record %d: %v, want Delivered", n+i, r.Outcome)
				}
			}
			if c := h.listener.callCount(); c != records {
				t.Fatalf("listener calls %d, want %d (each record once)", c, records)
			}
			for _, r := range recs {
				if s := h.states("A", strings.TrimPrefix(r.IdempotenceID, h.prefix)); !slices.Equal(s, []string{stateProcessed}) {
					t.Fatalf("%s rows %v, want [PROCESSED]", r.IdempotenceID, s)
				}
			}
		})
	}
}
