package consumer

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// overlapSink answers 200 to every request; the first request is held until a second one is in
// flight at the same time (or until hold passes), which shows whether deliveries overlap.
type overlapSink struct {
	srv      *httptest.Server
	hold     time.Duration
	mu       sync.Mutex
	inFlight int
	overlap  chan struct{} // closed when two requests were in flight at once
	first    bool
	order    map[string][]string // accepted ce-types per context, in arrival order
	accepted map[string]int
}

func newOverlapSink(t *testing.T, hold time.Duration) *overlapSink {
	s := &overlapSink{hold: hold, overlap: make(chan struct{}), order: map[string][]string{}, accepted: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *overlapSink) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.inFlight++
	if s.inFlight == 2 {
		select {
		case <-s.overlap:
		default:
			close(s.overlap)
		}
	}
	holdThis := !s.first
	s.first = true
	s.mu.Unlock()
	if holdThis {
		select {
		case <-s.overlap:
		case <-r.Context().Done():
		case <-time.After(s.hold):
		}
	}
	s.mu.Lock()
	s.inFlight--
	ctx := r.Header.Get("ce-seqinboxcontextid")
	s.order[ctx] = append(s.order[ctx], r.Header.Get("ce-type"))
	s.accepted[r.Header.Get("ce-id")]++
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (s *overlapSink) overlapped() bool {
	select {
	case <-s.overlap:
		return true
	default:
		return false
	}
}

func TestContextsOfOnePartitionRunConcurrentlyAndEachInOrder(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newOverlapSink(t, 3*time.Second)
	const orders = 30
	types := []string{"OrderCreated", "OrderPaid", "OrderShipped"}
	var recs []*kgo.Record
	// Each type for every order before the next type: an order's messages lie far apart in the
	// partition, with other orders' messages between them.
	for _, typ := range types {
		for i := range orders {
			order := fmt.Sprintf("par-o%d", i)
			recs = append(recs, event(0, typ, order+"-"+typ, order))
		}
	}
	testenv.Produce(t, seeds, recs...)
	r := startConsumer(t, testInbox(t, seeds, "g-par", s.srv.URL, sinkOpts{}), "par-1")
	waitUntil(t, "every record was delivered", func() bool { return r.events.count("Delivered") == len(recs) })

	if !s.overlapped() {
		t.Fatalf("no two deliveries of the partition were in flight at once: the partition runs one record at a time")
	}
	// A Duplicate is a record read again after a session ended on a slow machine.
	for _, e := range r.events.all() {
		if e.Outcome != "Delivered" && e.Outcome != "Duplicate" || e.Released != 0 {
			t.Errorf("%s: %s with %d released, want Delivered: a message of its order was processed before its predecessor", e.IdempotenceID, e.Outcome, e.Released)
		}
	}
	s.mu.Lock()
	for i := range orders {
		order := fmt.Sprintf("par-o%d", i)
		if got := fmt.Sprint(s.order[order]); got != fmt.Sprint(types) {
			t.Errorf("order %s reached the sink as %s, want %s", order, got, types)
		}
	}
	for id, n := range s.accepted {
		if n != 1 {
			t.Errorf("%s accepted %d times, want once", id, n)
		}
	}
	s.mu.Unlock()
	waitUntil(t, "every offset is committed", func() bool { return committedLag(t, seeds, "g-par")[0] == 0 })
}

func TestCrashWithAnUnfinishedRecordReadsAgainFromItsOffsetAndLosesNothing(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, func(id string, attempt int) int {
		if id == "crash-head-created" && attempt == 1 {
			return 0 // hang until the crashed consumer's request goes away
		}
		return 200
	})
	so := sinkOpts{timeout: 8 * time.Second}
	recs := []*kgo.Record{event(0, "OrderCreated", "crash-first", "crash-first")}
	recs = append(recs, event(0, "OrderCreated", "crash-head-created", "crash-head"))
	const others = 20
	for i := range others {
		order := fmt.Sprintf("crash-o%d", i)
		recs = append(recs, event(0, "OrderCreated", order, order))
	}
	// Of the head's order, so it must wait for the hanging record.
	recs = append(recs, event(0, "OrderPaid", "crash-head-paid", "crash-head"))
	testenv.Produce(t, seeds, recs...)

	a := startConsumer(t, testInbox(t, seeds, "g-crash", s.srv.URL, so), "crash-a")
	waitUntil(t, "the head record hangs and the records of other orders behind it finished", func() bool {
		return s.hanging("crash-head-created") && a.events.count("Delivered") == 1+others
	})
	waitUntil(t, "the offset of the hanging record is committed", func() bool {
		return committedLag(t, seeds, "g-crash")[0] == int64(len(recs)-1)
	})
	if s.accepted()["crash-head-paid"] != 0 {
		t.Fatalf("the head's OrderPaid was delivered while its OrderCreated hung")
	}
	a.c.Kill()
	if err := a.stop(t); !errors.Is(err, ErrKilled) {
		t.Fatalf("Run of the killed consumer returned %v, want ErrKilled", err)
	}
	if lag := committedLag(t, seeds, "g-crash")[0]; lag != int64(len(recs)-1) {
		t.Fatalf("committed lag after the crash %d, want %d: the commit must stop at the lowest unfinished record", lag, len(recs)-1)
	}

	b := startConsumer(t, testInbox(t, seeds, "g-crash", s.srv.URL, so), "crash-b")
	// Sets, not counts: a session of b that ends on a slow machine reads some records again.
	outcomes := func() map[string]map[string]bool {
		out := map[string]map[string]bool{}
		for _, e := range b.events.all() {
			if out[e.IdempotenceID] == nil {
				out[e.IdempotenceID] = map[string]bool{}
			}
			out[e.IdempotenceID][e.Outcome] = true
		}
		return out
	}
	waitUntil(t, "the second consumer read everything from the hanging record on", func() bool {
		return len(outcomes()) == len(recs)-1
	})
	got := outcomes()
	if got["crash-first"] != nil {
		t.Errorf("the second consumer read crash-first again: the committed offset did not cover the finished prefix")
	}
	for i := range others {
		if id := fmt.Sprintf("crash-o%d", i); !got[id]["Duplicate"] || got[id]["Delivered"] {
			t.Errorf("%s: %v in the second consumer, want Duplicate (the first had finished it)", id, got[id])
		}
	}
	for _, id := range []string{"crash-head-created", "crash-head-paid"} {
		if !got[id]["Delivered"] {
			t.Errorf("%s: %v in the second consumer, want Delivered", id, got[id])
		}
	}
	accepted := s.accepted()
	for _, r := range recs {
		if id := headerOf(r, "ce_id"); accepted[id] != 1 {
			t.Errorf("%s accepted %d times, want once", id, accepted[id])
		}
	}
	if got := s.acceptedOrder("crash-head"); fmt.Sprint(got) != "[OrderCreated OrderPaid]" {
		t.Errorf("the head's order reached the sink as %v", got)
	}
	waitUntil(t, "every offset is committed", func() bool { return committedLag(t, seeds, "g-crash")[0] == 0 })
}
