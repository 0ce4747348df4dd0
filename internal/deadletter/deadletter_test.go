package deadletter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

var failedAt = time.Date(2026, 3, 1, 12, 30, 0, 5, time.UTC)

func headerMap(hs []kgo.RecordHeader) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

func TestRecordCarriesTheOriginalAndWhy(t *testing.T) {
	p := NewPublisher(nil, "orders.dlq", testingclock.NewFakePassiveClock(failedAt), nil)
	original := []inbox.Header{
		{Key: "ce_id", Value: []byte("e-1")},
		{Key: "ce_type", Value: []byte("OrderCreated")},
		{Key: HeaderReason, Value: []byte("an earlier failure")},
		{Key: HeaderOriginalOffset, Value: []byte("1")},
	}
	tests := []struct {
		name        string
		letter      Letter
		wantHeaders map[string]string
		absent      []string
	}{
		{
			name: "decode failure without sequence",
			letter: Letter{Key: []byte("k"), Value: []byte("{bad"), Headers: original[:2], Reason: "InvalidJSON", Message: "payload is not JSON",
				Origin: inbox.Origin{Topic: "orders", Partition: 3, Offset: 77}},
			wantHeaders: map[string]string{
				"ce_id": "e-1", "ce_type": "OrderCreated",
				HeaderReason: "InvalidJSON", HeaderMessage: "payload is not JSON", HeaderOriginalTopic: "orders",
				HeaderOriginalPartition: "3", HeaderOriginalOffset: "77", HeaderFailedAt: "2026-03-01T12:30:00.000000005Z",
			},
			absent: []string{HeaderSequence, HeaderContextID},
		},
		{
			name: "failed message of a retried letter replaces the old dead-letter headers",
			letter: Letter{Value: []byte("{}"), Headers: original, Reason: ReasonListenerFailed, Message: "HTTP 500",
				Origin: inbox.Origin{Topic: "orders", Partition: 0, Offset: 5}, Sequence: "order", ContextID: "o-1"},
			wantHeaders: map[string]string{
				"ce_id": "e-1", "ce_type": "OrderCreated",
				HeaderReason: ReasonListenerFailed, HeaderMessage: "HTTP 500", HeaderOriginalTopic: "orders",
				HeaderOriginalPartition: "0", HeaderOriginalOffset: "5", HeaderSequence: "order", HeaderContextID: "o-1",
				HeaderFailedAt: "2026-03-01T12:30:00.000000005Z",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := p.Record(tt.letter)
			if r.Topic != "orders.dlq" || string(r.Key) != string(tt.letter.Key) || string(r.Value) != string(tt.letter.Value) {
				t.Fatalf("record %s key=%q value=%q, want the original on orders.dlq", r.Topic, r.Key, r.Value)
			}
			got := headerMap(r.Headers)
			if len(got) != len(tt.wantHeaders) || len(r.Headers) != len(tt.wantHeaders) {
				t.Fatalf("headers %v, want exactly %v", r.Headers, tt.wantHeaders)
			}
			for k, v := range tt.wantHeaders {
				if got[k] != v {
					t.Errorf("header %s = %q, want %q", k, got[k], v)
				}
			}
			for _, k := range tt.absent {
				if _, ok := got[k]; ok {
					t.Errorf("header %s present", k)
				}
			}
			back := Read(r)
			if back.Reason != tt.letter.Reason || back.Origin != tt.letter.Origin || back.Sequence != tt.letter.Sequence ||
				back.ContextID != tt.letter.ContextID || len(back.Headers) != 2 {
				t.Errorf("Read(Record(l)) = %+v, want the letter back with the two CloudEvents headers", back)
			}
		})
	}
}

func TestRetryRepublishesEachLetterOnce(t *testing.T) {
	seeds := testenv.Kafka(t, 3, "orders", "orders.dlq")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p := NewPublisher(cl, "orders.dlq", nil, nil)

	publish := func(from, to int, reason string) {
		for i := from; i < to; i++ {
			l := Letter{
				Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, `{"n":%d}`, i),
				Headers: []inbox.Header{{Key: "ce_id", Value: fmt.Appendf(nil, "e-%d", i)}},
				Origin:  inbox.Origin{Topic: "orders", Partition: int32(i % 3), Offset: int64(i)},
				Reason:  reason, Message: "test",
			}
			if err := p.Publish(ctx, l); err != nil {
				t.Fatalf("Publish: %v", err)
			}
		}
	}
	publish(0, 6, ReasonListenerFailed)
	publish(6, 9, "UndeclaredType")

	conn := []kgo.Opt{kgo.SeedBrokers(seeds...)}
	retry := func(reason string, limit int) RetryReport {
		t.Helper()
		rep, err := Retry(ctx, conn, RetryOptions{Topic: "orders.dlq", Group: RetryGroup("orders-inbox", reason), Reason: reason, Limit: limit})
		if err != nil {
			t.Fatalf("Retry(%q, %d): %v", reason, limit, err)
		}
		return rep
	}

	if rep := retry(ReasonListenerFailed, 4); rep.Total() != 4 {
		t.Fatalf("first retry with limit 4 re-published %d, want 4 (report %+v)", rep.Total(), rep)
	}
	if rep := retry(ReasonListenerFailed, 0); rep.Total() != 2 || rep.Republished[ReasonListenerFailed] != 2 {
		t.Fatalf("second retry re-published %+v, want the 2 ListenerFailed letters the limit left", rep)
	}
	if rep := retry(ReasonListenerFailed, 0); rep.Total() != 0 {
		t.Fatalf("third retry re-published %+v, want nothing: every ListenerFailed letter was re-published", rep)
	}
	publish(9, 10, ReasonListenerFailed)
	if rep := retry(ReasonListenerFailed, 0); rep.Total() != 1 {
		t.Fatalf("retry after a new letter re-published %+v, want only the new one", rep)
	}
	if rep := retry("UndeclaredType", 0); rep.Total() != 3 || rep.Skipped != 7 {
		t.Fatalf("UndeclaredType retry %+v, want its own 3 letters, 7 passed over", rep)
	}

	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	total := int64(0)
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	if total != 10 {
		t.Fatalf("orders holds %d records, want the 10 re-published letters", total)
	}
	got := consumeAll(ctx, t, seeds, "orders", 10)
	seen := map[string]int{}
	for _, r := range got {
		h := headerMap(r.Headers)
		id := h["ce_id"]
		seen[id]++
		var n, partition int
		if _, err := fmt.Sscanf(id, "e-%d", &n); err != nil {
			t.Fatalf("record with ce_id %q", id)
		}
		partition = n % 3
		if int(r.Partition) != partition || string(r.Key) != fmt.Sprintf("k%d", n) || string(r.Value) != fmt.Sprintf(`{"n":%d}`, n) {
			t.Errorf("%s re-published to partition %d key %q value %q, want partition %d with the original key and value", id, r.Partition, r.Key, r.Value, partition)
		}
		if len(r.Headers) != 1 {
			t.Errorf("%s re-published with headers %v, want only the original ce_id", id, r.Headers)
		}
	}
	for i := range 10 {
		if id := fmt.Sprintf("e-%d", i); seen[id] != 1 {
			t.Errorf("%s re-published %d times, want once", id, seen[id])
		}
	}
}

func TestDeadLetterNamesHousekeepingDeletions(t *testing.T) {
	tests := []struct{ engineReason, wantClass string }{
		{inbox.DeadLetterReasonSequenceDeleted, ReasonSequenceDeleted},
		{"operator action: sequence closed without delivery", ReasonOperatorAction},
	}
	for _, tt := range tests {
		l := engineLetter(inbox.Message{Sequence: "order", ContextID: "o-1", Record: inbox.Record{Origin: inbox.Origin{Topic: "orders"}}}, tt.engineReason)
		if l.Reason != tt.wantClass || l.Message != tt.engineReason || l.Sequence != "order" || l.ContextID != "o-1" {
			t.Errorf("engine reason %q became %+v, want class %s", tt.engineReason, l, tt.wantClass)
		}
	}
}

func consumeAll(ctx context.Context, t *testing.T, seeds []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records from %s: %v", len(out), want, topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}
