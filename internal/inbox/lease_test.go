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
)

// The tests of this file race a second consumer against a batch or an action run whose holding
// transaction ends early (its lease ran out while it waited, or its backend was terminated), and
// check the rule of lease.go: no listener call without the claim, so never two calls of one
// message at once and never two successful deliveries.

// rival is a second consumer of the harness's inbox: an engine with pools of its own on the same
// database and with the same settings, calling the same listener, so that the listener sees the
// calls of both.
func (h *harness) rival() *Engine {
	h.t.Helper()
	cfg := h.engine.cfg
	cfg.Maintenance = newPool(h.t, dbURL, MaintenanceConnections)
	e, err := New(newPool(h.t, dbURL, 4), h.engine.set, h.listener, cfg, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(e.ResignHousekeeping)
	return e
}

// shortLease gives the engine a listener deadline of 1s and a margin of 300ms.
func shortLease(s *harnessSettings) {
	s.ListenerDeadline, s.LeaseMargin = time.Second, 300*time.Millisecond
}

// lingeringCalls makes every listener call of the given messages stay for up to linger, or until
// a second call of the same message starts (which the listener records as an overlap), and counts
// the calls that started per message.
type lingeringCalls struct {
	mu      sync.Mutex
	started map[string]int
	second  map[string]chan struct{}
}

func (h *harness) lingerOn(linger time.Duration, recs ...Record) *lingeringCalls {
	lc := &lingeringCalls{started: map[string]int{}, second: map[string]chan struct{}{}}
	keys := map[string]bool{}
	for _, r := range recs {
		keys[r.IdempotenceID] = true
		lc.second[r.IdempotenceID] = make(chan struct{})
	}
	h.listener.setBehaviour(func(ctx context.Context, m Message) error {
		id := m.Record.IdempotenceID
		if !keys[id] {
			return nil
		}
		lc.mu.Lock()
		lc.started[id]++
		n := lc.started[id]
		lc.mu.Unlock()
		if n == 2 {
			close(lc.second[id])
		}
		select {
		case <-lc.second[id]:
		case <-time.After(linger):
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
	return lc
}

func (lc *lingeringCalls) calls(r Record) int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.started[r.IdempotenceID]
}

// requireEachDeliveredOnceNeverTwiceAtOnce fails on an overlapping call of one message or on a
// message delivered successfully other than once.
func (h *harness) requireEachDeliveredOnceNeverTwiceAtOnce(recs ...Record) {
	h.t.Helper()
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		h.t.Errorf("the listener ran twice at the same time for %v", o)
	}
	for _, r := range recs {
		if n := h.deliveries(r.Type, strings.TrimPrefix(r.IdempotenceID, h.prefix)); n != 1 {
			h.t.Errorf("%s delivered %d times, want once", r.IdempotenceID, n)
		}
	}
}

// TestBatchWaitsForNoConnectionBetweenItsClaimsAndAListenerCall: a batch that has to wait for
// its state connection must not hold its claims meanwhile. The records' pool has one free
// connection (the test holds the other); the batch [x, y] takes it, and a second consumer
// delivers x meanwhile. When the test gives its connection back, the batch must find x delivered,
// not call the listener for it: had the batch claimed first and then waited, its claims would
// have expired on the server during the wait (after the lease of 1s+300ms or, before, of two
// deadlines plus the margin), the rival would have won x, and the batch would call x again at
// the same time.
func TestBatchWaitsForNoConnectionBetweenItsClaimsAndAListenerCall(t *testing.T) {
	h := newHarness(t, chainSet(), withRecordsPool(2), shortLease)
	rival := h.rival()
	ctx := context.Background()
	x, y := h.rec("A", "x", "cx"), h.rec("A", "y", "cy")
	lc := h.lingerOn(500*time.Millisecond, x)

	held, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		batchErr error
	)
	wg.Go(func() { _, batchErr = h.engine.ProcessBatch(ctx, []Record{x, y}) })
	waitFor(t, "the batch holds the pool's other connection", func() bool { return h.pool.Stat().AcquiredConns() == 2 })
	time.Sleep(100 * time.Millisecond)
	var rivalErr error
	wg.Go(func() { _, rivalErr = rival.Process(ctx, x) })
	waitFor(t, "the rival calls the listener for x", func() bool { return lc.calls(x) >= 1 })
	held.Release()
	wg.Wait()
	h.requireEachDeliveredOnceNeverTwiceAtOnce(x, y)
	if batchErr != nil || rivalErr != nil {
		t.Fatalf("batch: %v, rival: %v; want both without error", batchErr, rivalErr)
	}
	for _, id := range []string{"x", "y"} {
		if s := h.states("A", id); !slices.Equal(s, []string{stateProcessed}) {
			t.Errorf("%s rows %v, want [PROCESSED]", id, s)
		}
	}
}

// TestBatchThatLostItsClaimTransactionCallsNoListenerAfterIt terminates a batch's T1 while its
// first listener call runs and a second consumer waits for the claims of the batch's other two
// records. The rival wins and delivers them; the batch must then call the listener for neither
// (it would overlap the rival's calls): it stores what its call did, reports an error, and its
// records processed again on their own are found processed.
func TestBatchThatLostItsClaimTransactionCallsNoListenerAfterIt(t *testing.T) {
	h := newHarness(t, chainSet())
	rival := h.rival()
	ctx := context.Background()
	x1, x2, x3 := h.rec("A", "x1", "c1"), h.rec("A", "x2", "c2"), h.rec("A", "x3", "c3")
	lc := h.lingerOn(time.Second, x2, x3)
	x1Entered, x1Release := make(chan struct{}), make(chan struct{})
	lingering := h.listener.behave
	h.listener.setBehaviour(func(ctx context.Context, m Message) error {
		if m.Record.IdempotenceID == x1.IdempotenceID {
			close(x1Entered)
			<-x1Release
			return nil
		}
		return lingering(ctx, m)
	})

	var (
		wg       sync.WaitGroup
		batchRes []Result
		batchErr error
		rivalErr [2]error
	)
	wg.Go(func() { batchRes, batchErr = h.engine.ProcessBatch(ctx, []Record{x1, x2, x3}) })
	<-x1Entered
	for i, r := range []Record{x2, x3} {
		wg.Go(func() { _, rivalErr[i] = rival.Process(ctx, r) })
	}
	var waiting []int32
	waitFor(t, "the rival waits for the batch's claims of x2 and x3", func() bool {
		waiting = h.blockedClaimInserts()
		return len(waiting) == 2
	})
	t1 := h.blockerOf(waiting[0])
	h.terminate(t1)
	waitFor(t, "the rival calls the listener for x2 and x3", func() bool { return lc.calls(x2) >= 1 && lc.calls(x3) >= 1 })
	close(x1Release)
	wg.Wait()
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Fatalf("the listener ran twice at the same time for %v", o)
	}
	if rivalErr[0] != nil || rivalErr[1] != nil {
		t.Fatalf("rival: %v; want no error", rivalErr)
	}
	if batchErr == nil && len(batchRes) > 1 {
		t.Errorf("the batch reported %d results without error after losing T1, want an error or x1 alone", len(batchRes))
	}
	for _, r := range []Record{x1, x2, x3} {
		if res := h.process(r); res.Outcome != Duplicate {
			t.Errorf("%s processed again on its own: %v, want Duplicate", r.IdempotenceID, res.Outcome)
		}
	}
	h.requireEachDeliveredOnceNeverTwiceAtOnce(x1, x2, x3)
	for _, id := range []string{"x1", "x2", "x3"} {
		if s := h.states("A", id); !slices.Equal(s, []string{stateProcessed}) {
			t.Errorf("%s rows %v, want [PROCESSED]", id, s)
		}
	}
}

// terminate ends a backend as a lost connection would, and waits until it has exited.
func (h *harness) terminate(pid int32) {
	h.t.Helper()
	var ok bool
	if err := h.pool.QueryRow(context.Background(), `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&ok); err != nil || !ok {
		h.t.Fatalf("terminate backend %d: %v, %v", pid, ok, err)
	}
}

// TestActionRunDeadLettersAFailedConsumeWhateverBecomesOfTheRestOfTheRun requests CONSUME on two
// buffered messages of one instance. The first delivery fails, which commits the message FAILED
// without claim; then the action transaction's backend is terminated during the second delivery,
// so the run fails. The first message must still reach the dead-letter topic: nothing else would
// ever retry it.
func TestActionRunDeadLettersAFailedConsumeWhateverBecomesOfTheRestOfTheRun(t *testing.T) {
	h := newHarness(t, chainSet())
	ctx := context.Background()
	b, c := h.rec("B", "b", "x"), h.rec("C", "c", "x")
	h.process(b)
	h.process(c)
	h.request("B", "b", ActionConsume)
	h.request("C", "c", ActionConsume)
	h.listener.setBehaviour(func(ctx context.Context, m Message) error {
		switch m.Record.IdempotenceID {
		case b.IdempotenceID:
			return errors.New("rejected by the sink")
		case c.IdempotenceID:
			h.terminate(h.actionTransaction())
		}
		return nil
	})

	dl := &recordingDeadLetterer{}
	if _, err := h.engine.RunPendingActions(ctx, dl); err == nil {
		t.Fatal("the action run whose transaction was terminated reported no error")
	}
	if s := h.states("B", "b"); !slices.Equal(s, []string{stateFailed}) {
		t.Fatalf("b rows %v, want [FAILED]", s)
	}
	if n := h.claims("B", "b"); n != 0 {
		t.Fatalf("b has %d claims, want none", n)
	}
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if len(dl.letters) != 1 || dl.letters[0].msg.Record.IdempotenceID != b.IdempotenceID ||
		!strings.Contains(dl.letters[0].reason, "rejected by the sink") {
		t.Fatalf("dead letters %v, want b's with the sink's error", dl.letters)
	}
}

// actionTransaction returns the backend of the running action transaction: the one session of
// the package's database idle inside a transaction.
func (h *harness) actionTransaction() int32 {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND state = 'idle in transaction'`)
	if err != nil {
		h.t.Fatal(err)
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			h.t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if len(pids) != 1 {
		h.t.Fatalf("sessions idle in a transaction: %v, want exactly the action's", pids)
	}
	return pids[0]
}

// TestBatchRetriedAfterItsDeliveriesStartsFromACleanSlate makes a batch's first attempt deliver x
// and then lose a real deadlock while it buffers b (b's FAILED row is locked by a transaction U
// that waits for the batch's claim of b). The retry must decide about x afresh, finding it
// PROCESSED; acting on the first attempt's decision it would store x again and fail with "state
// changed".
func TestBatchRetriedAfterItsDeliveriesStartsFromACleanSlate(t *testing.T) {
	var retries retryLog
	h := newHarness(t, chainSet(), retries.option(), withRecordsSessionParams(map[string]string{"deadlock_timeout": "20ms"}))
	ctx := context.Background()
	x, b := h.rec("A", "x", "cx"), h.rec("B", "b", "cb")
	h.insertHistoricalRows("B", "b", "cb", stateFailed)
	var bInstance int64
	if err := h.pool.QueryRow(ctx, `SELECT sequence_instance_id FROM sequenced_message WHERE message_type = 'B' AND idempotence_id = $1`,
		b.IdempotenceID).Scan(&bInstance); err != nil {
		t.Fatal(err)
	}
	xEntered, xRelease := make(chan struct{}), make(chan struct{})
	var xCalls atomic.Int32
	h.listener.setBehaviour(func(context.Context, Message) error {
		if xCalls.Add(1) == 1 {
			close(xEntered)
			<-xRelease
		}
		return nil
	})

	u, uPID := h.foreignTx()
	if _, err := u.Exec(ctx, `SELECT 1 FROM sequenced_message WHERE message_type = 'B' AND idempotence_id = $1 FOR NO KEY UPDATE`,
		b.IdempotenceID); err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		res      []Result
		batchErr error
	)
	wg.Go(func() { res, batchErr = h.engine.ProcessBatch(ctx, []Record{x, b}) })
	<-xEntered
	uErr := make(chan error, 1)
	go func() {
		_, err := u.Exec(ctx, insertClaimSQL, "B", b.IdempotenceID, bInstance)
		uErr <- errors.Join(err, u.Rollback(ctx))
	}()
	waitFor(t, "U waits for the batch's claim of b", func() bool {
		var n int
		if err := h.pool.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1))`, int32(uPID)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	close(xRelease)
	wg.Wait()
	if err := <-uErr; err != nil {
		t.Fatal(err)
	}
	if retries.n.Load() == 0 {
		t.Fatal("the batch lost no deadlock; the test did not set up what it tests")
	}
	if batchErr != nil {
		t.Fatalf("process batch: %v, want the retry to succeed", batchErr)
	}
	if got := []Outcome{res[0].Outcome, res[1].Outcome}; !slices.Equal(got, []Outcome{Duplicate, Buffered}) {
		t.Fatalf("outcomes %v, want [Duplicate Buffered] (x delivered by the attempt that lost the deadlock)", got)
	}
	if n := xCalls.Load(); n != 1 {
		t.Fatalf("x delivered %d times, want once", n)
	}
	if s := h.states("B", "b"); !slices.Equal(s, []string{stateWaiting}) {
		t.Fatalf("b rows %v, want [WAITING]", s)
	}
}
