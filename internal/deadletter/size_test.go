package deadletter

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestLetterTooLargeForTheTopicIsStoredWithoutItsPayload publishes letters larger than the
// dead-letter topic's max.message.bytes: each must still be stored, without its value (and, when
// the headers alone are too large, without key and headers), saying what was left out and where
// the original is; a retry passes such a letter over instead of re-publishing an empty record.
func TestLetterTooLargeForTheTopicIsStoredWithoutItsPayload(t *testing.T) {
	seeds := testenv.Kafka(t, 1, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), ProducerLimit())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const limit = 20000
	limitText := strconv.Itoa(limit)
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &limitText}, "orders.dlq"); err != nil {
		t.Fatal(err)
	}
	p := NewPublisher(cl, "orders.dlq", nil, nil)

	small := Letter{Key: []byte("k0"), Value: []byte(`{"n":0}`), Origin: inbox.Origin{Topic: "orders", Offset: 0}, Reason: ReasonListenerFailed, Message: "m"}
	bigValue := Letter{Key: []byte("k1"), Value: bytes.Repeat([]byte("v"), 5*limit),
		Headers: []inbox.Header{{Key: "ce_id", Value: []byte("e-1")}},
		Origin:  inbox.Origin{Topic: "orders", Partition: 0, Offset: 1}, Reason: "InvalidJSON", Message: "not JSON"}
	bigHeaders := Letter{Key: []byte("k2"), Value: []byte("v"),
		Headers: []inbox.Header{{Key: "x-big", Value: bytes.Repeat([]byte("h"), 2*limit)}},
		Origin:  inbox.Origin{Topic: "orders", Partition: 0, Offset: 2}, Reason: "InvalidJSON", Message: "not JSON"}
	for _, l := range []Letter{small, bigValue, bigHeaders} {
		if err := p.Publish(ctx, l); err != nil {
			t.Fatalf("Publish of the letter of offset %d: %v", l.Origin.Offset, err)
		}
	}

	var stored []*kgo.Record
	consumer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics("orders.dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	for len(stored) < 3 && ctx.Err() == nil {
		consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) { stored = append(stored, r) })
	}
	if len(stored) != 3 {
		t.Fatalf("%d letters stored, want 3", len(stored))
	}
	header := func(r *kgo.Record, key string) string {
		for _, h := range r.Headers {
			if h.Key == key {
				return string(h.Value)
			}
		}
		return ""
	}
	if r := stored[0]; string(r.Value) != `{"n":0}` || header(r, HeaderOmitted) != "" {
		t.Errorf("small letter: value %q, omitted %q; want it whole", r.Value, header(r, HeaderOmitted))
	}
	if r := stored[1]; len(r.Value) != 0 || header(r, HeaderOmitted) != "value" || header(r, HeaderOriginalValueBytes) != strconv.Itoa(5*limit) ||
		string(r.Key) != "k1" || header(r, "ce_id") != "e-1" || header(r, HeaderOriginalOffset) != "1" || header(r, HeaderReason) != "InvalidJSON" {
		t.Errorf("letter with a large value: value %d bytes, key %q, headers %v; want the value omitted and said so, key, headers and origin kept",
			len(r.Value), r.Key, r.Headers)
	}
	if r := stored[2]; len(r.Value) != 0 || len(r.Key) != 0 || header(r, "x-big") != "" || header(r, HeaderOmitted) != "value,key,headers" ||
		header(r, HeaderOriginalOffset) != "2" || header(r, HeaderOriginalTopic) != "orders" {
		t.Errorf("letter with large headers: key %q, headers %v; want value, key and headers omitted and the origin named", r.Key, r.Headers)
	}

	rep, err := Retry(ctx, []kgo.Opt{kgo.SeedBrokers(seeds...)}, RetryOptions{Topic: "orders.dlq", Group: RetryGroup("size", "")})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total() != 1 || rep.Incomplete != 2 {
		t.Errorf("retry %+v; want the whole letter re-published and the two incomplete ones passed over", rep)
	}
}
