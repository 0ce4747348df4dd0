package inbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestAnUndersizedPoolerSlowsTheEngineDownAndNeverDeliversTwice runs two engines, each with 8
// workers and 8 pool connections, through a PgBouncer in transaction mode with 4 server
// connections: far fewer than the 2 per holder (a holding transaction and its state writes) that
// 16 holders would need. Every message of 60 three-step instances is delivered to both engines in
// random order, and a worker repeats a record until Process succeeds, as the consumer does. A
// client connection of the pool holds no server connection between transactions there, so a
// state write that waited for one after a listener call would wait beyond the claim's lease and
// the message would be delivered again; the engine must only slow down: every message reaches
// the listener exactly once, never twice at a time, and every instance closes.
func TestAnUndersizedPoolerSlowsTheEngineDownAndNeverDeliversTwice(t *testing.T) {
	url := testenv.PgBouncer(t, dbURL, 4)
	short := func(s *harnessSettings) {
		s.ListenerDeadline, s.LeaseMargin, s.IdleLockTimeout = 2*time.Second, 500*time.Millisecond, 2*time.Second
	}
	h := newHarnessOn(t, url, chainSet(), withRecordsPool(8), short)
	h.listener.setBehaviour(func(ctx context.Context, _ Message) error {
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	second := newHarnessOn(t, url, chainSet(), withRecordsPool(8), short)
	other, err := New(second.pool, chainSet(), h.listener, h.engine.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}

	const contexts, workers = 60, 8
	var recs []Record
	for c := range contexts {
		for _, typ := range []string{"A", "B", "C"} {
			recs = append(recs, h.rec(typ, fmt.Sprintf("%s%d", typ, c), fmt.Sprintf("ctx%d", c)))
		}
	}
	deadline := time.Now().Add(3 * time.Minute)
	var wg sync.WaitGroup
	for _, e := range []*Engine{h.engine, other} {
		queue := make(chan Record, len(recs))
		for _, i := range rand.Perm(len(recs)) {
			queue <- recs[i]
		}
		close(queue)
		for range workers {
			wg.Go(func() {
				for rec := range queue {
					for {
						_, err := e.Process(context.Background(), rec)
						if err == nil {
							break
						}
						if time.Now().After(deadline) {
							t.Errorf("process %s/%s: still failing at the deadline: %v", rec.Type, rec.IdempotenceID, err)
							return
						}
						time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond)
					}
				}
			})
		}
	}
	wg.Wait()

	calls := map[string]int{}
	h.listener.mu.Lock()
	for _, m := range h.listener.calls {
		calls[claimKey(m)]++
	}
	h.listener.mu.Unlock()
	for _, rec := range recs {
		if n := calls[rec.Type+"/"+rec.IdempotenceID]; n != 1 {
			t.Errorf("%s/%s: %d listener calls, want exactly 1", rec.Type, rec.IdempotenceID, n)
		}
	}
	if o := h.listener.concurrentCalls(); len(o) != 0 {
		t.Errorf("listener ran twice at the same time for %v", o)
	}
	if n := h.count(`SELECT count(*) FROM sequence_instance WHERE context_id LIKE $1 AND state = 'CLOSED'`, h.prefix+"%"); n != contexts {
		t.Errorf("%d of %d instances closed", n, contexts)
	}
}
