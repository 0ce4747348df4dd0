package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// processBatch runs ProcessBatch until every record is done and returns one result per record.
func (h *harness) processBatch(recs ...Record) []Result {
	h.t.Helper()
	res, err := processAllInBatches(context.Background(), h.engine, recs)
	if err != nil {
		h.t.Fatalf("process batch: %v", err)
	}
	return res
}

// processAllInBatches passes recs to ProcessBatch, and the rest again after each prefix.
func processAllInBatches(ctx context.Context, e *Engine, recs []Record) ([]Result, error) {
	var all []Result
	for len(recs) > 0 {
		res, err := e.ProcessBatch(ctx, recs)
		if err != nil {
			return all, err
		}
		if len(res) == 0 {
			return all, errors.New("process batch: no record done")
		}
		all, recs = append(all, res...), recs[len(res):]
	}
	return all, nil
}

func outcomes(rs []Result) []Outcome {
	out := make([]Outcome, len(rs))
	for i, r := range rs {
		out[i] = r.Outcome
	}
	return out
}

// TestBatchSuccessorInTheSameBatchSeesItsPredecessor proves that messages of one context inside a
// batch see each other's outcomes: a successor after its predecessor is delivered, not buffered;
// a successor before it is buffered and released by the batch's release after T1.
func TestBatchSuccessorInTheSameBatchSeesItsPredecessor(t *testing.T) {
	h := newHarness(t, chainSet())
	res := h.processBatch(h.rec("A", "a1", "c1"), h.rec("B", "b1", "c1"), h.rec("C", "c1", "c1"))
	if got, want := outcomes(res), []Outcome{Delivered, Delivered, Delivered}; !slices.Equal(got, want) {
		t.Fatalf("in order: outcomes %v, want %v", got, want)
	}
	if got := h.listener.deliveredTypes(h.ctxID("c1")); !slices.Equal(got, []string{"A", "B", "C"}) {
		t.Fatalf("in order: delivered %v, want [A B C]", got)
	}
	if s := h.instanceState("chain", "c1"); s != "CLOSED" {
		t.Fatalf("in order: instance %s, want CLOSED", s)
	}

	res = h.processBatch(h.rec("C", "c2", "c2"), h.rec("B", "b2", "c2"), h.rec("A", "a2", "c2"))
	if got, want := outcomes(res), []Outcome{Buffered, Buffered, Delivered}; !slices.Equal(got, want) {
		t.Fatalf("reversed: outcomes %v, want %v", got, want)
	}
	if got := types(res[2].Released); !slices.Equal(got, []string{"B", "C"}) {
		t.Fatalf("reversed: released %v with the last record of the context, want [B C]", got)
	}
	if got := h.listener.deliveredTypes(h.ctxID("c2")); !slices.Equal(got, []string{"A", "B", "C"}) {
		t.Fatalf("reversed: delivered %v, want [A B C]", got)
	}
	if s := h.instanceState("chain", "c2"); s != "CLOSED" {
		t.Fatalf("reversed: instance %s, want CLOSED", s)
	}
}

// TestBatchListenerFailureInTheMiddleFreesOnlyItsClaim fails the listener for one message in the
// middle of a batch while a duplicate of it waits for the batch's claim. The failed message ends
// FAILED with its claim deleted, so the waiting duplicate takes over when the batch's T1 commits;
// the other messages of the batch keep their claims, and a successor of the failed message in the
// same batch is buffered.
func TestBatchListenerFailureInTheMiddleFreesOnlyItsClaim(t *testing.T) {
	h := newHarness(t, chainSet())
	var failed atomic.Bool
	h.listener.setBehaviour(func(_ context.Context, m Message) error {
		switch m.Record.IdempotenceID {
		case h.prefix + "x2":
			if failed.CompareAndSwap(false, true) {
				waitFor(t, "the duplicate waits for the batch's claim", func() bool { return len(h.blockedClaimInserts()) > 0 })
				return errors.New("sink answered 500")
			}
		case h.prefix + "b4":
			return errors.New("sink answered 500")
		}
		return nil
	})
	batch := []Record{
		h.rec("A", "x1", "c1"), h.rec("A", "x2", "c2"), h.rec("A", "x3", "c3"),
		h.rec("A", "a4", "c4"), h.rec("B", "b4", "c4"), h.rec("C", "c4", "c4"),
	}
	var (
		dup    Result
		dupErr error
		wg     sync.WaitGroup
	)
	wg.Go(func() {
		waitFor(t, "the batch's listener runs for x2", func() bool { return h.listener.callCount() >= 2 })
		dup, dupErr = h.engine.Process(context.Background(), h.rec("A", "x2", "c2"))
	})
	res := h.processBatch(batch...)
	wg.Wait()
	if dupErr != nil {
		t.Fatal(dupErr)
	}
	if got, want := outcomes(res), []Outcome{Delivered, Failed, Delivered, Delivered, Failed, Buffered}; !slices.Equal(got, want) {
		t.Fatalf("batch outcomes %v, want %v", got, want)
	}
	if dup.Outcome != Delivered {
		t.Fatalf("waiting duplicate: %v, want Delivered (it takes over the failed message's claim)", dup.Outcome)
	}
	if s := h.states("A", "x2"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("x2 rows %v, want [PROCESSED]", s)
	}
	for _, id := range []string{"x1", "x3", "a4"} {
		if n := h.claims("A", id); n != 1 {
			t.Fatalf("%s: %d claims, want 1", id, n)
		}
	}
	if n := h.claims("B", "b4"); n != 0 {
		t.Fatalf("b4: %d claims after its failure, want 0", n)
	}
	if s := h.states("C", "c4"); !slices.Equal(s, []string{stateWaiting}) {
		t.Fatalf("c4 rows %v, want [WAITING] behind the failed b4", s)
	}

	// A resend of the failed message delivers it and releases its successor.
	h.listener.setBehaviour(nil)
	if r := h.process(h.rec("B", "b4", "c4")); r.Outcome != Delivered || !slices.Equal(types(r.Released), []string{"C"}) {
		t.Fatalf("resent b4: %v released %v, want Delivered releasing [C]", r.Outcome, types(r.Released))
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Fatalf("listener ran twice at the same time for %v", o)
	}
}

// TestBatchCopyAfterAFailedOriginalRetriesIt puts a copy of a message right after it in one
// batch. Processed one after the other, the copy retries a failed original; the batch ends
// before the copy, so that it does the same.
func TestBatchCopyAfterAFailedOriginalRetriesIt(t *testing.T) {
	h := newHarness(t, chainSet())
	var calls atomic.Int64
	h.listener.setBehaviour(func(context.Context, Message) error {
		if calls.Add(1) == 1 {
			return errors.New("sink answered 503")
		}
		return nil
	})
	res := h.processBatch(h.rec("A", "a", "c"), h.rec("A", "a", "c"), h.rec("A", "a", "c"))
	if got, want := outcomes(res), []Outcome{Failed, Delivered, Duplicate}; !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	if n := h.listener.callCount(); n != 2 {
		t.Fatalf("listener calls %d, want 2 (the original, then the copy's retry)", n)
	}
	if s := h.states("A", "a"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("rows %v, want [PROCESSED]", s)
	}
}

// retryLog counts the engine's log lines about retried batch claims (deadlocks, deleted
// instances).
type retryLog struct{ n atomic.Int64 }

func (r *retryLog) option() harnessOption {
	return func(s *harnessSettings) {
		s.Log = funcr.New(func(_, args string) {
			if strings.Contains(args, "batch claim retried") {
				r.n.Add(1)
			}
		}, funcr.Options{Verbosity: 1})
	}
}

// TestBatchesRacingOnOverlappingKeysInOppositeOrdersNeverDeadlock races batches holding the same
// messages of new instances in opposite orders. The instances are created and the claims taken in
// one fixed order, so no batch waits for another in a cycle: no deadlock to retry, one listener
// call per message, never two at once.
func TestBatchesRacingOnOverlappingKeysInOppositeOrdersNeverDeadlock(t *testing.T) {
	var retries retryLog
	h := newHarness(t, chainSet(), retries.option())
	h.listener.setBehaviour(func(context.Context, Message) error {
		runtime.Gosched()
		return nil
	})
	const iterations, messages = 20, 8
	for it := range iterations {
		var forward []Record
		for i := range messages {
			forward = append(forward, h.rec("A", fmt.Sprintf("a%d-%d", it, i), fmt.Sprintf("it%d-c%d", it, i)))
		}
		backward := slices.Clone(forward)
		slices.Reverse(backward)
		var fns []func() error
		for _, order := range [][]Record{forward, backward, forward, backward} {
			fns = append(fns, func() error {
				_, err := processAllInBatches(context.Background(), h.engine, order)
				return err
			})
		}
		for _, err := range raceAll(fns) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := retries.n.Load(); n != 0 {
		t.Fatalf("%d batch claims retried, want 0 (claims taken in one order cannot deadlock)", n)
	}
	if n, want := h.listener.callCount(), iterations*messages; n != want {
		t.Fatalf("listener calls %d, want exactly %d", n, want)
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Fatalf("listener ran twice at the same time for %v", o)
	}
}

// TestBatchesAndSingleDeliveriesReleaseEachMessageOnceInSequenceOrder races workers that deliver
// every message of several contexts, several copies each, in their own random order, some in
// batches of random size (copies inside and across batches), some one by one. Exactly one
// successful listener call per logical message, in sequence order per context, never two at once,
// nothing left WAITING, every instance closed.
func TestBatchesAndSingleDeliveriesReleaseEachMessageOnceInSequenceOrder(t *testing.T) {
	h := newHarness(t, chainSet(), withRecordsPool(40))
	// A fifth of the calls fail, so claims pass from failed messages to copies.
	h.listener.setBehaviour(func(context.Context, Message) error {
		runtime.Gosched()
		if rand.IntN(5) == 0 {
			return errors.New("flaky sink")
		}
		return nil
	})
	const iterations, contexts, workers, copies = 12, 4, 8, 2
	chain := []string{"A", "B", "C"}
	for it := range iterations {
		recs := h.chainRecords(it, contexts, copies, chain)
		fns := make([]func() error, workers)
		for w := range fns {
			order := slices.Clone(recs)
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			fns[w] = func() error {
				if w%2 == 0 {
					for _, rec := range order {
						if _, err := h.engine.Process(context.Background(), rec); err != nil {
							return err
						}
					}
					return nil
				}
				for len(order) > 0 {
					n := min(1+rand.IntN(8), len(order))
					if _, err := processAllInBatches(context.Background(), h.engine, order[:n]); err != nil {
						return err
					}
					order = order[n:]
				}
				return nil
			}
		}
		for _, err := range raceAll(fns) {
			if err != nil {
				t.Fatal(err)
			}
		}
		// Messages whose every delivery failed are FAILED; a resend completes them, as the
		// dead-letter retry of an operator would.
		h.listener.setBehaviour(nil)
		if _, err := processAllInBatches(context.Background(), h.engine, recs); err != nil {
			t.Fatal(err)
		}
		h.listener.setBehaviour(func(context.Context, Message) error {
			runtime.Gosched()
			if rand.IntN(5) == 0 {
				return errors.New("flaky sink")
			}
			return nil
		})
		h.requireContextsDeliveredAndClosed(it, contexts, chain)
	}
	h.requireAllProcessedNeverTwiceAtOnce()
}

// TestProcessBatchRefusesRecordsItCannotClaim names the record that must go through Process.
func TestProcessBatchRefusesRecordsItCannotClaim(t *testing.T) {
	h := newHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("chain", mt("A", "", nil))}))
	unsequenced := h.rec("A", "u", "c")
	unsequenced.Sequenced = false
	_, err := h.engine.ProcessBatch(context.Background(), []Record{h.rec("A", "a", "c"), unsequenced})
	if !errors.Is(err, errNotBatchable) || !strings.Contains(err.Error(), "record 1") {
		t.Fatalf("error %v, want errNotBatchable naming record 1", err)
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls %d, want 0", n)
	}
}
