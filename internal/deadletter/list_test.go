package deadletter

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// orderDecoder decodes the records of one sequence, OrderCreated then OrderPaid, whose context ID
// is the CloudEvent subject and whose idempotence ID is the CloudEvent id.
func orderDecoder(t *testing.T) *decode.Decoder {
	t.Helper()
	var spec v1alpha1.SequentialInboxSpec
	if err := yaml.UnmarshalStrict([]byte(`
sequences:
- name: order
  retention: 1h
  messages:
  - type: OrderCreated
    contextId: {header: ce_subject}
  - type: OrderPaid
    contextId: {header: ce_subject}
    releaseCondition: {predecessor: OrderCreated}
`), &spec); err != nil {
		t.Fatal(err)
	}
	set, errs := declaration.Compile(&spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	dec, err := decode.New(set)
	if err != nil {
		t.Fatal(err)
	}
	return dec
}

// cloudEvent is the headers of a binary-mode CloudEvent of type typ with id and subject.
func cloudEvent(typ, id, subject string) []inbox.Header {
	h := func(k, v string) inbox.Header { return inbox.Header{Key: k, Value: []byte(v)} }
	return []inbox.Header{h("ce_specversion", "1.0"), h("ce_source", "/shop"), h("ce_type", typ), h("ce_id", id), h("ce_subject", subject)}
}

func TestListShowsTheLettersOfATimeAndReasonWithoutPayloadOrConsumerGroup(t *testing.T) {
	seeds := testenv.Kafka(t, 2, "orders", "orders.dlq", "empty.dlq")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	now := time.Now().UTC().Truncate(time.Millisecond)
	clk := testingclock.NewFakeClock(now)
	p := NewPublisher(cl, "orders.dlq", clk, nil)
	// publish dead-letters l as the consumer does, failed d before now, into partition of orders.dlq.
	publish := func(d time.Duration, partition int32, l Letter) {
		t.Helper()
		clk.SetTime(now.Add(-d))
		r := p.Record(l)
		r.Partition = partition
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	publish(3*time.Hour, 0, Letter{Value: []byte(`{"card":"4111 1111"`), Headers: cloudEvent("OrderPaid", "pay-7", "o-7"), Reason: decode.ClassInvalidJSON,
		Message: "payload is not JSON", Origin: inbox.Origin{Topic: "orders", Partition: 1, Offset: 10}})
	publish(2*time.Hour, 1, Letter{Value: []byte(`{"card":"4111 1111"}`), Headers: cloudEvent("OrderPaid", "pay-8", "o-8"), Reason: ReasonListenerFailed,
		Message: "the sink answered HTTP 500\nafter 5 attempts", Origin: inbox.Origin{Topic: "orders", Partition: 0, Offset: 11}, Sequence: "order", ContextID: "o-8"})
	publish(30*time.Minute, 1, Letter{Value: []byte(`{}`), Headers: cloudEvent("OrderRefunded", "ref-1", "o-8"), Reason: decode.ClassUndeclaredType,
		Message: `type "OrderRefunded" is not declared by any sequence`, Origin: inbox.Origin{Topic: "orders", Partition: 0, Offset: 12}})
	publish(10*time.Minute, 0, Letter{Value: []byte(`{}`), Headers: cloudEvent("OrderCreated", "new-9", "o-9"), Reason: ReasonListenerFailed,
		Message: "the sink answered HTTP 503", Origin: inbox.Origin{Topic: "orders", Partition: 1, Offset: 13}, Sequence: "order", ContextID: "o-9"})

	conn := []kgo.Opt{kgo.SeedBrokers(seeds...)}
	list := func(opts ListOptions) []Entry {
		t.Helper()
		if opts.Topic == "" {
			opts.Topic = "orders.dlq"
		}
		opts.Decoder = orderDecoder(t)
		entries, err := List(ctx, conn, opts)
		if err != nil {
			t.Fatalf("List(%+v): %v", opts, err)
		}
		return entries
	}
	origins := func(entries []Entry) []int64 {
		var offsets []int64
		for _, e := range entries {
			offsets = append(offsets, e.Offset)
		}
		return offsets
	}

	all := list(ListOptions{})
	if got := origins(all); len(got) != 4 || got[0] != 10 || got[1] != 11 || got[2] != 12 || got[3] != 13 {
		t.Fatalf("every letter by original offset %v, want 10, 11, 12, 13 in the order they failed across both partitions", got)
	}
	paid := all[1]
	want := Entry{FailedAt: now.Add(-2 * time.Hour), Reason: ReasonListenerFailed, Message: "the sink answered HTTP 500\nafter 5 attempts",
		Topic: "orders", Partition: 0, Offset: 11, Type: "OrderPaid", IdempotenceID: "pay-8", Sequence: "order", ContextID: "o-8",
		DeadLetterPartition: 1, DeadLetterOffset: 0}
	if !paid.FailedAt.Equal(want.FailedAt) {
		t.Errorf("failed at %s, want %s", paid.FailedAt, want.FailedAt)
	}
	paid.FailedAt = want.FailedAt
	if paid != want {
		t.Errorf("ListenerFailed letter %+v, want %+v", paid, want)
	}
	if all[0].Type != "OrderPaid" || all[0].IdempotenceID != "pay-7" || all[0].Reason != decode.ClassInvalidJSON {
		t.Errorf("undecodable letter %+v, want InvalidJSON with the type and id its headers name", all[0])
	}
	if all[2].Type != "OrderRefunded" || all[2].IdempotenceID != "" {
		t.Errorf("letter of an undeclared type %+v, want its type and no idempotence ID (no declaration says where it is)", all[2])
	}
	for _, e := range all {
		if b, _ := yaml.Marshal(e); strings.Contains(string(b), "4111") {
			t.Errorf("entry %s carries the payload", b)
		}
	}

	if got := origins(list(ListOptions{Reason: ReasonListenerFailed})); len(got) != 2 || got[0] != 11 || got[1] != 13 {
		t.Errorf("ListenerFailed letters %v, want 11 and 13", got)
	}
	if got := origins(list(ListOptions{Since: now.Add(-time.Hour)})); len(got) != 2 || got[0] != 12 || got[1] != 13 {
		t.Errorf("letters of the last hour %v, want 12 and 13", got)
	}
	if got := origins(list(ListOptions{Reason: ReasonListenerFailed, Since: now.Add(-time.Hour)})); len(got) != 1 || got[0] != 13 {
		t.Errorf("ListenerFailed letters of the last hour %v, want 13", got)
	}
	if got := list(ListOptions{Since: now.Add(time.Minute)}); got == nil || len(got) != 0 {
		t.Errorf("letters from a minute ahead %v, want an empty list", got)
	}
	if got := list(ListOptions{Topic: "empty.dlq"}); got == nil || len(got) != 0 {
		t.Errorf("letters of an empty topic %v, want an empty list", got)
	}
	_, err = List(ctx, conn, ListOptions{Topic: "missing.dlq"})
	if err == nil || !strings.Contains(err.Error(), "the dead-letter topic missing.dlq does not exist") {
		t.Errorf("list of a missing topic: %v, want it named", err)
	}

	adm := kadm.NewClient(cl)
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 0 {
		t.Fatalf("after the lists the broker has groups %v, want none", groups.Groups())
	}
	// The check sees a group where there is one: a retry keeps its position in one.
	if _, err := Retry(ctx, conn, RetryOptions{Topic: "orders.dlq", Group: RetryGroup("orders-inbox", ""), Limit: 1}); err != nil {
		t.Fatal(err)
	}
	if groups, err = adm.ListGroups(ctx); err != nil || len(groups) != 1 {
		t.Fatalf("after a retry the broker has groups %v (%v), want the retry's", groups.Groups(), err)
	}
}
