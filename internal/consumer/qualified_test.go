package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// dottedSequences declares CloudEvents types as the CloudEvents spec recommends them, with a
// reverse-DNS prefix, one of them with a subtype.
const dottedSequences = `  sequences:
  - name: order
    retention: 1h
    messages:
    - type: com.example.order.created
      contextId: {jsonPointer: /orderId}
    - type: com.example.order.paid
      contextId: {jsonPointer: /orderId}
      releaseCondition: {predecessor: com.example.order.created}
    - type: com.example.order.validated
      subtype: OK
      subtypeFrom: {header: ce_result}
      contextId: {jsonPointer: /orderId}
      releaseCondition: {predecessor: com.example.order.paid}
`

func dottedInbox(t *testing.T, seeds []string, group, sinkURL string) *v1alpha1.SequentialInbox {
	t.Helper()
	head, _, _ := strings.Cut(inboxYAML, "  sequences:\n")
	inbox, err := manifest.Parse(fmt.Appendf(nil, head+dottedSequences, strings.Join(seeds, ","), group, sinkURL, "5s", 0))
	if err != nil {
		t.Fatal(err)
	}
	return inbox
}

// structured is a structured-mode CloudEvent record (the whole event as the JSON value), as the
// CloudEvents SDKs' Kafka bindings write it; attrs are further attributes.
func structured(typ, id, orderID, attrs string) *kgo.Record {
	return &kgo.Record{
		Topic: "orders", Key: []byte(orderID),
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}},
		Value: fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"/shop","type":%q,%s"datacontenttype":"application/json","data":{"orderId":%q}}`,
			id, typ, attrs, orderID),
	}
}

// TestCloudEventsTypesWithDotsAreSequencedInBothModes produces the events of one order out of
// order, in structured and binary mode, with types that carry a reverse-DNS prefix: the subtyped
// validated event and paid wait, created releases them in the declared order, each reaches the
// sink with its own ce-type, and the database names them by their full qualified types. An
// undeclared dotted type is still dead-lettered as UndeclaredType.
func TestCloudEventsTypesWithDotsAreSequencedInBothModes(t *testing.T) {
	db := database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	r := startConsumer(t, dottedInbox(t, seeds, "g-dotted", s.srv.URL), "dotted-1")
	testenv.Produce(t, seeds,
		structured("com.example.order.validated", "dot-validated", "dot-o1", `"result":"OK",`),
		event(0, "com.example.order.paid", "dot-paid", "dot-o1"),
		event(0, "com.example.order.refunded", "dot-refunded", "dot-o1"),
	)
	waitUntil(t, "validated and paid are buffered", func() bool { return r.events.count("Buffered") == 2 })
	if n := len(s.deliveries()); n != 0 {
		t.Fatalf("the sink received %d messages before com.example.order.created, want none", n)
	}
	testenv.Produce(t, seeds, structured("com.example.order.created", "dot-created", "dot-o1", ""))
	waitUntil(t, "every record was processed", func() bool { return r.events.count("") == 4 })

	want := []string{"com.example.order.created", "com.example.order.paid", "com.example.order.validated"}
	if got := s.acceptedOrder("dot-o1"); !slices.Equal(got, want) {
		t.Errorf("the sink received ce-types %v, want %v", got, want)
	}
	for _, d := range s.deliveries() {
		if d.Type == "com.example.order.validated" && d.Header.Get("ce-result") != "OK" {
			t.Errorf("the validated event arrived with ce-result %q, want its subtype OK", d.Header.Get("ce-result"))
		}
	}
	rows, err := db.Query(context.Background(), `SELECT message_type || ' ' || state FROM sequenced_message ORDER BY message_type`)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"com.example.order.created PROCESSED", "com.example.order.paid PROCESSED", "com.example.order.validated.OK PROCESSED"}; !slices.Equal(stored, want) {
		t.Errorf("sequenced_message holds %v, want %v", stored, want)
	}
	letters := testenv.ReadTopic(t, seeds, "orders.dlq")
	if len(letters) != 1 || deadletter.Read(letters[0]).Reason != decode.ClassUndeclaredType {
		t.Fatalf("dead letters %v, want one UndeclaredType (com.example.order.refunded)", letters)
	}
}
