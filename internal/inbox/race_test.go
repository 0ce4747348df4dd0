package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// raceAll runs every function at once behind a barrier and returns their errors.
func raceAll(fns []func() error) []error {
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		errs  = make([]error, len(fns))
	)
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = fn()
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

func TestConcurrentDuplicatesNeverRunTheListenerTwiceAtOnce(t *testing.T) {
	h := newHarness(t, chainSet())
	const iterations, deliveries = 25, 8
	// A third of the calls fail, so claims pass from rolled-back winners to waiting duplicates.
	h.listener.setBehaviour(func(context.Context, Message) error {
		runtime.Gosched()
		if rand.IntN(3) == 0 {
			return errors.New("flaky sink")
		}
		return nil
	})
	for it := range iterations {
		rec := h.rec("A", fmt.Sprintf("a%d", it), fmt.Sprintf("ctx%d", it))
		outcomes := make([]Outcome, deliveries)
		fns := make([]func() error, deliveries)
		for i := range fns {
			fns[i] = func() error {
				res, err := h.engine.Process(context.Background(), rec)
				outcomes[i] = res.Outcome
				return err
			}
		}
		for _, err := range raceAll(fns) {
			if err != nil {
				t.Fatal(err)
			}
		}
		delivered := 0
		for _, o := range outcomes {
			if o == Delivered {
				delivered++
			}
		}
		want := []string{stateFailed}
		if delivered == 1 {
			want = []string{stateProcessed}
		}
		if s := h.states("A", fmt.Sprintf("a%d", it)); delivered > 1 || !slices.Equal(s, want) {
			t.Fatalf("iteration %d: outcomes %v, rows %v; want at most one Delivered and one row", it, outcomes, s)
		}
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Fatalf("listener ran twice at the same time for %v", o)
	}
	if got, want := len(h.listener.delivered), h.count(`SELECT count(*) FROM sequenced_message WHERE idempotence_id LIKE $1 AND state = 'PROCESSED'`, h.prefix+"%"); got != want {
		t.Fatalf("successful listener calls %d, PROCESSED rows %d; want equal", got, want)
	}
}

// TestConcurrentDeliveriesReleaseEachMessageOnceInSequenceOrder races workers that each deliver
// every message of several contexts in their own random order. It proves the claim (exactly
// one listener call per logical message), the release order, and the safety of skipping T2
// (docs/design.md#skipping-t2): no message is left WAITING and every complete instance is closed.
func TestConcurrentDeliveriesReleaseEachMessageOnceInSequenceOrder(t *testing.T) {
	h := newHarness(t, chainSet())
	h.listener.setBehaviour(func(context.Context, Message) error {
		runtime.Gosched()
		return nil
	})
	const iterations, contexts, workers = 12, 4, 8
	chain := []string{"A", "B", "C"}
	for it := range iterations {
		recs := h.chainRecords(it, contexts, 1, chain)
		fns := make([]func() error, workers)
		for w := range fns {
			order := slices.Clone(recs)
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			fns[w] = func() error {
				for _, rec := range order {
					if _, err := h.engine.Process(context.Background(), rec); err != nil {
						return err
					}
				}
				return nil
			}
		}
		for _, err := range raceAll(fns) {
			if err != nil {
				t.Fatal(err)
			}
		}
		h.requireContextsDeliveredAndClosed(it, contexts, chain)
	}
	if n, want := h.listener.callCount(), iterations*contexts*len(chain); n != want {
		t.Fatalf("listener calls = %d, want exactly %d (one per logical message)", n, want)
	}
	h.requireAllProcessedNeverTwiceAtOnce()
}

// TestSkippedReleasesLeaveNoMessageWaiting races the messages of many contexts, each delivered
// exactly once (no duplicate could repair a missed release), with a listener that takes a moment,
// so that successors are buffered while their predecessor's listener runs. It proves that deciding
// about T2 after the record's own state commit (docs/design.md#skipping-t2) leaves no message
// WAITING and closes every complete instance.
func TestSkippedReleasesLeaveNoMessageWaiting(t *testing.T) {
	h := newHarness(t, chainSet())
	h.listener.setBehaviour(func(context.Context, Message) error {
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond) // sink latency, not synchronisation
		return nil
	})
	const iterations, contexts = 30, 3
	chain := []string{"A", "B", "C"}
	for it := range iterations {
		var fns []func() error
		for c := range contexts {
			for _, typ := range chain {
				rec := h.rec(typ, fmt.Sprintf("%s-%d-%d", typ, it, c), fmt.Sprintf("it%d-c%d", it, c))
				fns = append(fns, func() error {
					_, err := h.engine.Process(context.Background(), rec)
					return err
				})
			}
		}
		for _, err := range raceAll(fns) {
			if err != nil {
				t.Fatal(err)
			}
		}
		h.requireContextsDeliveredAndClosed(it, contexts, chain)
	}
	if n := h.count(`SELECT count(*) FROM sequenced_message WHERE idempotence_id LIKE $1 AND state = 'WAITING'`, h.prefix+"%"); n != 0 {
		t.Fatalf("%d messages left WAITING", n)
	}
}

// requireContextsDeliveredAndClosed fails unless every context it<it>-c<c> of an iteration got
// exactly chain delivered, in that order, and its instance closed.
func (h *harness) requireContextsDeliveredAndClosed(it, contexts int, chain []string) {
	h.t.Helper()
	for c := range contexts {
		ctxID := fmt.Sprintf("it%d-c%d", it, c)
		if got := h.listener.deliveredTypes(h.ctxID(ctxID)); !slices.Equal(got, chain) {
			h.t.Fatalf("context %s delivered %v, want exactly %v", ctxID, got, chain)
		}
		if s := h.instanceState("chain", ctxID); s != "CLOSED" {
			h.t.Fatalf("context %s: instance %s, want CLOSED", ctxID, s)
		}
	}
}

// requireAllProcessedNeverTwiceAtOnce fails when a message of the test is not PROCESSED, or when
// the listener ran twice at the same time for one message.
func (h *harness) requireAllProcessedNeverTwiceAtOnce() {
	h.t.Helper()
	if n := h.count(`SELECT count(*) FROM sequenced_message WHERE idempotence_id LIKE $1 AND state <> 'PROCESSED'`, h.prefix+"%"); n != 0 {
		h.t.Fatalf("%d messages not PROCESSED, want 0", n)
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		h.t.Fatalf("listener ran twice at the same time for %v", o)
	}
}

// chainRecords makes the records of an iteration: for every context it<it>-c<c>, each type of
// chain in order, copies times each.
func (h *harness) chainRecords(it, contexts, copies int, chain []string) []Record {
	var recs []Record
	for c := range contexts {
		for _, typ := range chain {
			for range copies {
				recs = append(recs, h.rec(typ, fmt.Sprintf("%s-%d-%d", typ, it, c), fmt.Sprintf("it%d-c%d", it, c)))
			}
		}
	}
	return recs
}
