package consumer

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"weak"

	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

func TestMaxBufferedBytesIsTheSpecsElseAQuarterOfTheMemoryLimit(t *testing.T) {
	cases := map[string]struct {
		spec        string
		memoryLimit int64
		want        int64
	}{
		"spec set":                      {"64Mi", 1 << 30, 64 << 20},
		"spec set, no memory limit":     {"2Mi", 0, 2 << 20},
		"quarter of the memory limit":   {"", 512 << 20, 128 << 20},
		"small limit, floor":            {"", 2 << 20, minMaxBufferedBytes},
		"no memory limit, the default":  {"", 0, defaultMaxBufferedBytes},
		"decimal quantity in the spec":  {"10M", 0, 10_000_000},
		"memory limit ignored for spec": {"1Mi", 64 << 30, 1 << 20},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Inbox: testInbox(t, []string{"kafka:9092"}, "g", "http://sink", sinkOpts{}), MemoryLimit: tc.memoryLimit}
			if tc.spec != "" {
				q := resource.MustParse(tc.spec)
				cfg.Inbox.Spec.Kafka.MaxBufferedBytes = &q
			}
			if got := cfg.maxBufferedBytes(); got != tc.want {
				t.Errorf("maxBufferedBytes = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestConsumerRefusesABufferBoundBelowOneMebibyte(t *testing.T) {
	in := testInbox(t, []string{"kafka:9092"}, "g", "http://sink", sinkOpts{})
	q := resource.MustParse("512Ki")
	in.Spec.Kafka.MaxBufferedBytes = &q
	_, err := New(Config{Inbox: in, DatabaseURL: "postgres://x", InstanceID: "i"})
	if err == nil || !strings.Contains(err.Error(), "spec.kafka.maxBufferedBytes 512Ki must be at least 1Mi") {
		t.Errorf("New = %v, want an error naming spec.kafka.maxBufferedBytes", err)
	}
}

// clientHook hands the test the consumer's group client and the records it fetched.
type clientHook struct {
	mu      sync.Mutex
	client  *kgo.Client
	fetched []weak.Pointer[kgo.Record]
	ids     []string
}

func (h *clientHook) OnNewClient(cl *kgo.Client) {
	h.mu.Lock()
	h.client = cl
	h.mu.Unlock()
}

func (h *clientHook) OnFetchRecordBuffered(r *kgo.Record) {
	h.mu.Lock()
	h.fetched = append(h.fetched, weak.Make(r))
	h.ids = append(h.ids, headerOf(r, "ce_id"))
	h.mu.Unlock()
}

// paused reports whether the consumer stopped fetching partition 0 of the orders topic.
func (h *clientHook) paused() bool {
	h.mu.Lock()
	cl := h.client
	h.mu.Unlock()
	if cl == nil {
		return false
	}
	ps := cl.PauseFetchPartitions(nil)["orders"]
	return len(ps) == 1 && ps[0] == 0
}

// largeOrder is an OrderCreated record whose payload is padded to about size bytes, on the Kafka
// key of the hung record when key is set (so that it waits behind it).
func largeOrder(id, order, key string, size int) *kgo.Record {
	r := event(0, "OrderCreated", id, order)
	r.Value = fmt.Appendf(nil, `{"orderId":%q,"padding":%q}`, order, strings.Repeat("x", size))
	if key != "" {
		r.Key = []byte(key)
	}
	return r
}

// TestRecordsParkedBehindAHungCallStayWithinTheByteBound: records of one Kafka key wait in the
// partition's keyed window and queue behind a sink call that hangs. The consumer stops fetching
// once it holds its bound in bytes (far below the count bounds), holds no more than the bound and
// one fetch, and after the call answers delivers everything, gives every byte back and commits.
func TestRecordsParkedBehindAHungCallStayWithinTheByteBound(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	const bound, size, n = 4 << 20, 256 << 10, 48
	s := newSink(t, func(id string, _ int) int {
		if id == "mem-hung" {
			return 0 // held until the test releases it
		}
		return 200
	})
	// The hung call outlives the test's waits: the record deadline is 108s, the sink's 100s.
	in := testInbox(t, seeds, "g-memory-parked", s.srv.URL, sinkOpts{timeout: 100 * time.Second})
	in.Spec.Kafka.MaxPollIntervalMs = 120000
	in.Spec.Kafka.MaxBufferedBytes = resource.NewQuantity(bound, resource.BinarySI)
	hook := &clientHook{}
	r := startConsumer(t, in, "memory-parked-1", func(c *Config) { c.hooks = append(c.hooks, hook) })
	r.waitReady(t)

	testenv.Produce(t, seeds, largeOrder("mem-hung", "mem-o-hung", "mem", 100))
	waitUntil(t, "the sink holds the first call", func() bool { return s.hanging("mem-hung") })
	var total int64
	for i := range n {
		// One produce per record: one batch per record, as a broker returns whole batches.
		rec := largeOrder(fmt.Sprintf("mem-%d", i), fmt.Sprintf("mem-o%d", i), "mem", size)
		total += recordSize(rec)
		testenv.Produce(t, seeds, rec)
	}
	b := r.c.backlog
	waitUntil(t, "the consumer paused fetching or holds every record", func() bool { return hook.paused() || b.bytes.Load() >= total })
	// Paused with the call still hung: nothing finishes and nothing more is fetched.
	held := b.bytes.Load()
	// One fetch: a quarter of the bound, and the batch that crosses it.
	slack := int64(bound/fetchShare + size + recordOverhead)
	if held > bound+slack || held <= bound {
		t.Errorf("the consumer holds %d bytes of the %d produced while the call hangs; want more than its bound %d and at most one fetch (%d) more",
			held, total, bound, slack)
	}
	hook.mu.Lock()
	fetched := len(hook.fetched)
	hook.mu.Unlock()
	if fetched >= n {
		t.Errorf("%d of %d records fetched behind the hung call, want fetching paused at the bound", fetched, n+1)
	}

	s.release.Open()
	waitUntil(t, "every record is processed", func() bool { return r.events.count("") == n+1 })
	accepted := s.accepted()
	for i := range n {
		if id := fmt.Sprintf("mem-%d", i); accepted[id] != 1 {
			t.Errorf("%s accepted %d times, want once", id, accepted[id])
		}
	}
	waitUntil(t, "every offset is committed", func() bool { return committedLag(t, seeds, "g-memory-parked")[0] == 0 })
	if got := b.bytes.Load(); got != 0 {
		t.Errorf("the consumer counts %d bytes after every record finished, want 0", got)
	}
}

// TestFinishedRecordsBehindAnUnfinishedOneAreGivenUp: records of other keys pass a hung call, but
// the commit mark waits for it, so the keyed window keeps them. They no longer count against the
// bound, and their memory is collectable, while the hung one is still held.
func TestFinishedRecordsBehindAnUnfinishedOneAreGivenUp(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	const size, n = 128 << 10, 8
	s := newSink(t, func(id string, _ int) int {
		if id == "gone-hung" {
			return 0
		}
		return 200
	})
	in := testInbox(t, seeds, "g-memory-finished", s.srv.URL, sinkOpts{timeout: 100 * time.Second})
	in.Spec.Kafka.MaxPollIntervalMs = 120000
	hook := &clientHook{}
	r := startConsumer(t, in, "memory-finished-1", func(c *Config) { c.hooks = append(c.hooks, hook) })
	r.waitReady(t)

	hung := largeOrder("gone-hung", "gone-o-hung", "", 100)
	testenv.Produce(t, seeds, hung)
	waitUntil(t, "the sink holds the first call", func() bool { return s.hanging("gone-hung") })
	for i := range n {
		testenv.Produce(t, seeds, largeOrder(fmt.Sprintf("gone-%d", i), fmt.Sprintf("gone-o%d", i), "", size))
	}
	waitUntil(t, "the records behind the hung call are processed", func() bool { return r.events.count("") == n })
	if lag := committedLag(t, seeds, "g-memory-finished")[0]; lag != n+1 {
		t.Fatalf("committed lag %d, want %d: the hung record keeps the commit mark", lag, n+1)
	}
	if got, want := r.c.backlog.bytes.Load(), recordSize(hung); got != want {
		t.Errorf("the consumer counts %d bytes while only the hung record (%d bytes) is unfinished", got, want)
	}
	runtime.GC()
	hook.mu.Lock()
	for i, p := range hook.fetched {
		if hook.ids[i] != "gone-hung" && p.Value() != nil {
			t.Errorf("finished record %s is still reachable while the hung one waits", hook.ids[i])
		}
	}
	hook.mu.Unlock()
	s.release.Open()
	waitUntil(t, "the hung record is processed", func() bool { return r.events.count("") == n+1 })
}

// TestAPartitionStuckAtTheBoundDoesNotStopTheOthers: partition 0 holds the consumer's whole bound
// behind a hung call. Partition 1 pauses too when its records arrive, but fetches again as soon
// as they are finished, so that its later records are delivered while the call still hangs.
func TestAPartitionStuckAtTheBoundDoesNotStopTheOthers(t *testing.T) {
	database(t)
	seeds := cluster(t, 2)
	const bound, size, n = 2 << 20, 256 << 10, 16
	s := newSink(t, func(id string, _ int) int {
		if id == "stuck-hung" {
			return 0
		}
		return 200
	})
	in := testInbox(t, seeds, "g-memory-stuck", s.srv.URL, sinkOpts{timeout: 100 * time.Second})
	in.Spec.Kafka.MaxPollIntervalMs = 120000
	in.Spec.Kafka.MaxBufferedBytes = resource.NewQuantity(bound, resource.BinarySI)
	r := startConsumer(t, in, "memory-stuck-1")
	r.waitReady(t)

	testenv.Produce(t, seeds, largeOrder("stuck-hung", "stuck-o-hung", "stuck", 100))
	waitUntil(t, "the sink holds the first call", func() bool { return s.hanging("stuck-hung") })
	for i := range n {
		testenv.Produce(t, seeds, largeOrder(fmt.Sprintf("stuck-%d", i), fmt.Sprintf("stuck-o%d", i), "stuck", size))
	}
	waitUntil(t, "partition 0 holds more than the bound", r.c.backlog.over)
	for round := range 3 {
		var ids []string
		for i := range 4 {
			id := fmt.Sprintf("free-%d-%d", round, i)
			rec := event(1, "OrderCreated", id, fmt.Sprintf("free-o%d-%d", round, i))
			ids = append(ids, id)
			testenv.Produce(t, seeds, rec)
		}
		waitUntil(t, fmt.Sprintf("round %d of partition 1 is delivered while partition 0 waits", round), func() bool {
			accepted := s.accepted()
			for _, id := range ids {
				if accepted[id] != 1 {
					return false
				}
			}
			return true
		})
	}
	if !s.hanging("stuck-hung") || !r.c.backlog.over() {
		t.Errorf("partition 0 no longer holds the bound behind its hung call; the test shows nothing")
	}
	s.release.Open()
	waitUntil(t, "every record is processed", func() bool { return r.events.count("") == n+1+3*4 })
}
