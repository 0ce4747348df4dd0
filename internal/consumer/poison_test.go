package consumer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// poisonCase is one bad record, alone on its partition with a good record behind it.
type poisonCase struct {
	name string
	bad  *kgo.Record
	// reason is the dead-letter reason, message a text the reason's message must contain (the
	// limit it names).
	reason, message string
}

func poisonCases() []poisonCase {
	long := strings.Repeat("x", 10*1024)
	withContextID := func(partition int32, id, contextID string) *kgo.Record {
		r := event(partition, "OrderCreated", id, "")
		r.Value, _ = json.Marshal(map[string]string{"orderId": contextID})
		return r
	}
	return []poisonCase{
		{"ce_id with 0xFF 0x00", event(0, "OrderCreated", "\xff\x00", "pz-o0"), decode.ClassInvalidID, "UTF-8"},
		{"context ID with NUL", withContextID(1, "pz-bad-1", "pz\x00o1"), decode.ClassInvalidID, "NUL"},
		{"10 KB context ID", withContextID(2, "pz-bad-2", long), decode.ClassInvalidID, "at most 1024 bytes"},
		{"10 KB ce_id", event(3, "OrderCreated", long, "pz-o3"), decode.ClassInvalidID, "at most 1024 bytes"},
		{"traceparent with NUL", event(4, "OrderPaid", "pz-bad-4", "pz-o4", kgo.RecordHeader{Key: "traceparent", Value: []byte("00-\x00")}), decode.ClassInvalidHeader, "NUL"},
		{"sink slower than the record deadline", event(5, "OrderCreated", "pz-slow", "pz-o5"), deadletter.ReasonListenerDeadlineExceeded, "spec.kafka.maxPollIntervalMs"},
		{"5 MB non-JSON payload", bigNonJSON(6), decode.ClassInvalidJSON, "not JSON"},
	}
}

// bigNonJSON is an OrderCreated record of 5 MB whose payload is not JSON: larger than the
// dead-letter topic takes (kfake's default max.message.bytes, 1 MB, as Kafka's).
func bigNonJSON(partition int32) *kgo.Record {
	r := event(partition, "OrderCreated", "pz-big", "")
	r.Value = bytes.Repeat([]byte("not json "), 5<<20/9)
	return r
}

// TestEveryPoisonRecordIsDeadLetteredAndTheRecordBehindItDelivered puts each kind of record
// that used to stall its partition forever on a partition of its own, with a good record behind
// it: the bad one must reach the dead-letter topic with a reason naming the limit, the good one
// the sink, and every offset must be committed.
func TestEveryPoisonRecordIsDeadLetteredAndTheRecordBehindItDelivered(t *testing.T) {
	database(t)
	cases := poisonCases()
	seeds := cluster(t, int32(len(cases)))
	s := newSink(t, func(id string, _ int) int {
		if id == "pz-slow" {
			return 0 // hang until the consumer gives up
		}
		return 200
	})
	// The sink may take 8s per attempt, the record only 5.4s: the listener deadline exceeds the
	// record deadline.
	in := testInbox(t, seeds, "g-poison-table", s.srv.URL, sinkOpts{timeout: 8 * time.Second})
	in.Spec.Kafka.MaxPollIntervalMs, in.Spec.Kafka.SessionTimeoutMs, in.Spec.Kafka.HeartbeatIntervalMs = 6000, 6000, 1000
	r := startConsumer(t, in, "poison-table-1")

	var records []*kgo.Record
	for i, c := range cases {
		records = append(records, c.bad, event(int32(i), "OrderCreated", fmt.Sprintf("pz-good-%d", i), fmt.Sprintf("pz-good-o%d", i)))
	}
	allowLargeRecords(t, seeds, "orders")
	testenv.Produce(t, seeds, records...)
	waitUntil(t, "every record was processed", func() bool { return r.events.count("") == 2*len(cases) })

	letters := map[int32]deadletter.Letter{}
	for _, rec := range testenv.ReadTopic(t, seeds, "orders.dlq") {
		l := deadletter.Read(rec)
		if wantOmitted := l.Origin.Partition == 6; wantOmitted != (l.Omitted == "value") || wantOmitted && len(rec.Value) != 0 {
			t.Errorf("dead letter of partition %d: %d bytes of value, omitted %q; only the 5 MB letter leaves its value out",
				l.Origin.Partition, len(rec.Value), l.Omitted)
		}
		if _, dup := letters[l.Origin.Partition]; dup {
			t.Errorf("a second dead letter from partition %d: %+v", l.Origin.Partition, l)
		}
		letters[l.Origin.Partition] = l
	}
	accepted := s.accepted()
	for i, c := range cases {
		l, ok := letters[int32(i)]
		switch {
		case !ok:
			t.Errorf("%s: no dead letter", c.name)
		case l.Reason != c.reason || l.Origin.Offset != 0 || !strings.Contains(l.Message, c.message):
			t.Errorf("%s: dead letter reason %q offset %d message %q; want reason %q at offset 0 with a message naming %q",
				c.name, l.Reason, l.Origin.Offset, l.Message, c.reason, c.message)
		}
		if id := fmt.Sprintf("pz-good-%d", i); accepted[id] != 1 {
			t.Errorf("%s: the good record behind it was accepted %d times, want once", c.name, accepted[id])
		}
	}
	if n, want := len(s.deliveries()), len(cases)+1; n != want {
		t.Errorf("the sink saw %d requests, want %d: the good records and the one abandoned slow call", n, want)
	}
	waitUntil(t, "every offset is committed", func() bool {
		for _, lag := range committedLag(t, seeds, "g-poison-table") {
			if lag != 0 {
				return false
			}
		}
		return true
	})
}

// TestSinkRequestCarriesOnlyAttributesTraceContextAndAllowListedHeaders produces a record whose
// producer tries to relabel it (a raw ce-type header) and to pass a bearer token, a cookie and a
// forwarding claim to the team's service.
func TestSinkRequestCarriesOnlyAttributesTraceContextAndAllowListedHeaders(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	in := testInbox(t, seeds, "g-forge", s.srv.URL, sinkOpts{})
	in.Spec.Sink.ForwardHeaders = []string{"x-tenant"}
	r := startConsumer(t, in, "forge-1")
	testenv.Produce(t, seeds, event(0, "OrderCreated", "forge-1", "forge-o1",
		kgo.RecordHeader{Key: "ce-type", Value: []byte("OrderCancelled")},
		kgo.RecordHeader{Key: "ce-id", Value: []byte("forged")},
		kgo.RecordHeader{Key: "authorization", Value: []byte("Bearer secret")},
		kgo.RecordHeader{Key: "cookie", Value: []byte("session=1")},
		kgo.RecordHeader{Key: "x-forwarded-for", Value: []byte("10.0.0.1")},
		kgo.RecordHeader{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
		kgo.RecordHeader{Key: "x-tenant", Value: []byte("t-1")},
		kgo.RecordHeader{Key: "x-other", Value: []byte("o")},
	))
	waitUntil(t, "the record was processed", func() bool { return r.events.count("") == 1 })
	ds := s.deliveries()
	if len(ds) != 1 {
		t.Fatalf("the sink saw %d requests, want 1", len(ds))
	}
	h := ds[0].Header
	if got := h.Values("Ce-Type"); len(got) != 1 || got[0] != "OrderCreated" {
		t.Errorf("ce-type %q, want only the record's attribute OrderCreated", got)
	}
	if got := h.Values("Ce-Id"); len(got) != 1 || got[0] != "forge-1" {
		t.Errorf("ce-id %q, want only the record's attribute forge-1", got)
	}
	if h.Get("Traceparent") == "" || h.Get("X-Tenant") != "t-1" {
		t.Errorf("traceparent %q, x-tenant %q: want the trace context and the allow-listed header", h.Get("Traceparent"), h.Get("X-Tenant"))
	}
	for _, absent := range []string{"Authorization", "Cookie", "X-Forwarded-For", "X-Other"} {
		if v := h.Values(absent); len(v) > 0 {
			t.Errorf("record header %s = %q reached the sink", absent, v)
		}
	}
}
