package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

var businessOrder = []string{"OrderCreated", "OrderPaid", "OrderShipped"}

// outOfOrder produces, for each order, Shipped to partition 0 and Paid to partition 1 first, and
// Created to partition 2 only after the consumer buffered the others (when wait is set).
func orderRecords(prefix string, orders int) (early, late []*kgo.Record) {
	for i := range orders {
		order := fmt.Sprintf("%s-o%d", prefix, i)
		early = append(early,
			event(0, "OrderShipped", order+"-shipped", order),
			event(1, "OrderPaid", order+"-paid", order))
		late = append(late, event(2, "OrderCreated", order+"-created", order))
	}
	return early, late
}

func assertBusinessOrder(t *testing.T, s *testSink, prefix string, orders int) {
	t.Helper()
	accepted := s.accepted()
	for i := range orders {
		order := fmt.Sprintf("%s-o%d", prefix, i)
		if got := s.acceptedOrder(order); !slices.Equal(got, businessOrder) {
			t.Errorf("order %s reached the sink as %v, want %v", order, got, businessOrder)
		}
		for _, suffix := range []string{"-created", "-paid", "-shipped"} {
			if n := accepted[order+suffix]; n != 1 {
				t.Errorf("%s accepted %d times, want exactly once", order+suffix, n)
			}
		}
	}
}

func TestRecordsOutOfOrderAcrossPartitionsReachTheSinkInSequenceOrder(t *testing.T) {
	database(t)
	seeds := cluster(t, 3)
	s := newSink(t, nil)
	const orders = 20
	early, late := orderRecords("ooo", orders)
	testenv.Produce(t, seeds, early...)

	r := startConsumer(t, testInbox(t, seeds, "g-ooo", s.srv.URL, sinkOpts{}), "ooo-1")
	waitUntil(t, "Paid and Shipped of every order are buffered", func() bool { return r.events.count("Buffered") == 2*orders })
	if n := len(s.deliveries()); n != 0 {
		t.Fatalf("the sink received %d messages before any predecessor arrived, want none", n)
	}
	testenv.Produce(t, seeds, late...)
	waitUntil(t, "every message reached the sink", func() bool { return len(s.accepted()) == 3*orders })
	waitUntil(t, "every record was processed", func() bool { return r.events.count("") == 3*orders })

	assertBusinessOrder(t, s, "ooo", orders)
	if n := r.events.count("Delivered"); n != orders {
		t.Errorf("%d records delivered directly, want %d (the Created ones)", n, orders)
	}
	released := 0
	for _, e := range r.events.all() {
		released += e.Released
	}
	if released != 2*orders {
		t.Errorf("%d buffered messages released, want %d", released, 2*orders)
	}
	for _, d := range s.deliveries() {
		if d.Sequence != "order" || !strings.HasPrefix(d.ContextID, "ooo-o") || d.ContentType != "application/json" {
			t.Fatalf("delivery %+v lacks the sequence, context or content type", d)
		}
	}
}

func TestTwoConsumerGroupsAtOnceDeliverEveryMessageOnce(t *testing.T) {
	database(t)
	seeds := cluster(t, 3)
	s := newSink(t, nil)
	const orders = 30
	early, late := orderRecords("two", orders)
	a := startConsumer(t, testInbox(t, seeds, "g-two-a", s.srv.URL, sinkOpts{}), "two-a")
	b := startConsumer(t, testInbox(t, seeds, "g-two-b", s.srv.URL, sinkOpts{}), "two-b")
	a.waitReady(t)
	b.waitReady(t)
	testenv.Produce(t, seeds, append(late[:orders/2:orders/2], append(early, late[orders/2:]...)...)...)

	total := 3 * orders
	waitUntil(t, "both groups processed every record", func() bool {
		return a.events.count("") == total && b.events.count("") == total
	})
	waitUntil(t, "every message reached the sink", func() bool { return len(s.accepted()) == total })
	assertBusinessOrder(t, s, "two", orders)
	if n := len(s.deliveries()); n != total {
		t.Errorf("the sink received %d requests for %d messages: a second delivery got through", n, total)
	}
	dups := a.events.count("Duplicate") + b.events.count("Duplicate")
	if dups != total {
		t.Errorf("%d records were duplicates across both groups, want %d (each record once per group, one of the two loses)", dups, total)
	}
}

func TestPoisonRecordsAreDeadLetteredWhileGoodRecordsFlow(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	r := startConsumer(t, testInbox(t, seeds, "g-poison", s.srv.URL, sinkOpts{}), "poison-1")

	badJSON := event(0, "OrderCreated", "p-bad-json", "x")
	badJSON.Value = []byte(`{"orderId":`)
	noID := event(0, "OrderCreated", "", "p-o2")
	undeclared := event(0, "InvoiceSent", "p-undeclared", "p-o3")
	badSubtype := event(0, "OrderValidated", "p-subtype", "p-o4", kgo.RecordHeader{Key: "ce_result", Value: []byte("MAYBE")})
	goodSubtype := event(0, "OrderValidated", "p-good-validated", "p-o4", kgo.RecordHeader{Key: "ce_result", Value: []byte("OK")})
	testenv.Produce(t, seeds,
		event(0, "OrderCreated", "p-good-1", "p-o1"), badJSON,
		event(0, "OrderCreated", "p-good-2", "p-o2"), noID,
		undeclared, event(0, "OrderCreated", "p-good-3", "p-o3"),
		badSubtype, goodSubtype,
	)
	waitUntil(t, "every record was processed", func() bool { return r.events.count("") == 8 })

	want := map[int64]string{1: decode.ClassInvalidJSON, 3: decode.ClassMissingID, 4: decode.ClassUndeclaredType, 6: decode.ClassInvalidSubtype}
	letters := testenv.ReadTopic(t, seeds, "orders.dlq")
	if len(letters) != len(want) {
		t.Fatalf("%d dead letters, want %d", len(letters), len(want))
	}
	for _, rec := range letters {
		l := deadletter.Read(rec)
		if l.Reason != want[l.Origin.Offset] || l.Origin.Topic != "orders" || l.Origin.Partition != 0 || l.Message == "" {
			t.Errorf("dead letter of offset %d: reason %q topic %q message %q, want reason %q from orders/0",
				l.Origin.Offset, l.Reason, l.Origin.Topic, l.Message, want[l.Origin.Offset])
		}
		if headerOf(rec, deadletter.HeaderFailedAt) == "" {
			t.Errorf("dead letter of offset %d has no failed-at header", l.Origin.Offset)
		}
	}
	accepted := s.accepted()
	for _, id := range []string{"p-good-1", "p-good-2", "p-good-3", "p-good-validated"} {
		if accepted[id] != 1 {
			t.Errorf("good record %s accepted %d times, want once", id, accepted[id])
		}
	}
	if len(s.deliveries()) != 4 {
		t.Errorf("the sink received %d requests, want the 4 good records only", len(s.deliveries()))
	}
	waitUntil(t, "every offset is committed", func() bool { return committedLag(t, seeds, "g-poison")[0] == 0 })
}

func TestSinkErrorIsRetriedUntilSuccess(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, func(id string, attempt int) int {
		if attempt == 1 {
			return 500
		}
		return 204
	})
	r := startConsumer(t, testInbox(t, seeds, "g-500", s.srv.URL, sinkOpts{retries: 3}), "500-1")
	testenv.Produce(t, seeds, event(0, "OrderCreated", "r500-1", "r500-o1"))
	waitUntil(t, "the record was processed", func() bool { return r.events.count("") == 1 })

	if got := r.events.all()[0].Outcome; got != "Delivered" {
		t.Fatalf("outcome %s, want Delivered after the retry", got)
	}
	ds := s.deliveries()
	if len(ds) != 2 || ds[0].Status != 500 || ds[1].Status != 204 {
		t.Fatalf("sink saw %+v, want one 500 then one 204", ds)
	}
	if letters := testenv.ReadTopic(t, seeds, "orders.dlq"); len(letters) != 0 {
		t.Fatalf("%d dead letters for a message that was delivered", len(letters))
	}
}

func TestSinkDownFailsToDeadLetterAndTheRetryCommandProcessesIt(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	var down atomic.Bool
	down.Store(true)
	s := newSink(t, func(id string, attempt int) int {
		if down.Load() {
			return 503
		}
		return 200
	})
	inbox := testInbox(t, seeds, "g-down", s.srv.URL, sinkOpts{retries: 1})
	r := startConsumer(t, inbox, "down-1")
	testenv.Produce(t, seeds, event(0, "OrderCreated", "down-1", "down-o1"), event(0, "OrderPaid", "down-2", "down-o1"))
	waitUntil(t, "both records were processed", func() bool { return r.events.count("") == 2 })
	if got := r.events.all()[0].Outcome; got != "Failed" {
		t.Fatalf("outcome of Created with the sink down: %s, want Failed", got)
	}
	if got := r.events.all()[1].Outcome; got != "Buffered" {
		t.Fatalf("outcome of Paid after a failed Created: %s, want Buffered", got)
	}
	letters := testenv.ReadTopic(t, seeds, "orders.dlq")
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	if l := deadletter.Read(letters[0]); l.Reason != deadletter.ReasonListenerFailed || l.Sequence != "order" || l.ContextID != "down-o1" {
		t.Fatalf("dead letter %+v, want ListenerFailed of order/down-o1", l)
	}

	down.Store(false)
	conn, err := ConnectionOptions(&inbox.Spec.Kafka, Kafka{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := deadletter.Retry(context.Background(), conn, deadletter.RetryOptions{
		Topic: "orders.dlq", Group: deadletter.RetryGroup("g-down", ""),
	})
	if err != nil || rep.Total() != 1 {
		t.Fatalf("retry: %+v, %v; want 1 re-published", rep, err)
	}
	waitUntil(t, "the re-published record was processed", func() bool { return r.events.count("") == 3 })
	waitUntil(t, "Paid was released", func() bool { return s.accepted()["down-2"] == 1 })
	if got := r.events.all()[2]; got.Outcome != "Delivered" || got.Released != 1 {
		t.Fatalf("re-published record: %+v, want Delivered releasing the buffered Paid", got)
	}
	if got := s.acceptedOrder("down-o1"); !slices.Equal(got, []string{"OrderCreated", "OrderPaid"}) {
		t.Fatalf("order down-o1 reached the sink as %v", got)
	}
}

func TestGracefulShutdownDrainsWithoutLosingOrRepeatingADelivery(t *testing.T) {
	database(t)
	seeds := cluster(t, 3)
	s := newSink(t, nil)
	const records = 600
	var recs []*kgo.Record
	for i := range records {
		order := fmt.Sprintf("drain-o%d", i)
		recs = append(recs, event(int32(i%3), "OrderCreated", order+"-created", order))
	}
	testenv.Produce(t, seeds, recs...)
	inbox := testInbox(t, seeds, "g-drain", s.srv.URL, sinkOpts{})

	first := startConsumer(t, inbox, "drain-1")
	waitUntil(t, "the first consumer processed some records", func() bool { return first.events.count("") >= records/5 })
	if err := first.stop(t); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	processedByFirst := first.events.count("")
	// The first consumer committed, per partition, at least the prefix of offsets it finished.
	// Records of a partition run concurrently (a record or a batch of records in each place): one
	// that finished after a record of the same partition was abandoned (not yet in the engine
	// when the stop came) lies beyond that prefix and is read again, and skipped.
	finished := map[int32]map[int64]bool{}
	for _, e := range first.events.all() {
		if finished[e.Origin.Partition] == nil {
			finished[e.Origin.Partition] = map[int64]bool{}
		}
		finished[e.Origin.Partition][e.Origin.Offset] = true
	}
	committed, err := testenv.CommittedOffsets(seeds, "g-drain", "orders")
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(3) {
		prefix := int64(0)
		for finished[p][prefix] {
			prefix++
		}
		if committed[p] < prefix {
			t.Errorf("partition %d: committed offset %d, but the first consumer finished offsets 0 to %d: it did not commit what it finished", p, committed[p], prefix-1)
		}
	}
	if processedByFirst == records {
		t.Fatalf("the first consumer processed everything before it was stopped; the test proves nothing")
	}
	second := startConsumer(t, inbox, "drain-2")
	waitUntil(t, "every record reached the sink", func() bool { return len(s.accepted()) == records })
	waitUntil(t, "the second consumer processed the rest", func() bool { return second.events.count("") >= records-processedByFirst })

	for id, n := range s.accepted() {
		if n != 1 {
			t.Errorf("%s accepted %d times, want once", id, n)
		}
	}
	if n := len(s.deliveries()); n != records {
		t.Errorf("the sink received %d requests for %d records", n, records)
	}
}

func TestKilledMidDeliveryLeavesTheMessageToTheOtherConsumer(t *testing.T) {
	pool := database(t)
	seeds := cluster(t, 1)
	s := newSink(t, func(id string, attempt int) int {
		if id == "kill-1" && attempt == 1 {
			return 0 // hang until the killed consumer's request goes away
		}
		return 200
	})
	so := sinkOpts{timeout: 8 * time.Second}
	a := startConsumer(t, testInbox(t, seeds, "g-kill-a", s.srv.URL, so), "kill-a")
	testenv.Produce(t, seeds, event(0, "OrderCreated", "kill-1", "kill-o1"))
	waitUntil(t, "the first consumer's delivery hangs in the sink", func() bool { return s.hanging("kill-1") })

	b := startConsumer(t, testInbox(t, seeds, "g-kill-b", s.srv.URL, so), "kill-b")
	waitUntil(t, "the second consumer's claim waits for the first one's", func() bool {
		var waiting int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%sequential_inbox_idempotence%'`).Scan(&waiting)
		return err == nil && waiting == 1
	})
	a.c.Kill()
	if err := a.stop(t); !errors.Is(err, ErrKilled) {
		t.Fatalf("Run of the killed consumer returned %v, want ErrKilled", err)
	}
	waitUntil(t, "the second consumer processed the message", func() bool { return b.events.count("") == 1 })

	if got := b.events.all()[0].Outcome; got != "Delivered" {
		t.Fatalf("second consumer: %s, want Delivered (it took the claim over)", got)
	}
	ds := s.deliveries()
	if len(ds) != 2 || ds[0].Status != 0 || ds[1].Status != 200 {
		t.Fatalf("sink saw %+v, want the killed consumer's abandoned request, then one accepted delivery", ds)
	}
	if a.events.count("") != 0 {
		t.Fatalf("the killed consumer reported %v", a.events.all())
	}
	if lag := committedLag(t, seeds, "g-kill-a"); lag[0] != 1 {
		t.Fatalf("the killed consumer's group lags %d, want 1: it must not commit the record it abandoned", lag[0])
	}
}

func TestFailedDeadLetterProduceHoldsTheRecordItsKeyAndTheCommittedOffset(t *testing.T) {
	database(t)
	seeds := testenv.Kafka(t, 1, "orders") // no dead-letter topic yet: every produce to it fails
	s := newSink(t, nil)
	r := startConsumer(t, testInbox(t, seeds, "g-dlqdown", s.srv.URL, sinkOpts{}), "dlqdown-1")
	// The poison record, a record of another order (runs meanwhile), and a record of the poison
	// record's Kafka key (waits for it).
	testenv.Produce(t, seeds, event(0, "InvoiceSent", "dd-poison", "dd-o1"), event(0, "OrderCreated", "dd-good", "dd-o2"),
		event(0, "OrderCreated", "dd-same-key", "dd-o1"))
	waitUntil(t, "the dead-letter produce failed and is retried, and the other order's record was delivered", func() bool {
		return gauge(t, r.c, "seqinbox_record_retries_total", "cause", "DeadLetter") >= 1 && s.accepted()["dd-good"] == 1
	})
	// A session that ends meanwhile (the machine is slow) reads dd-good again, as a duplicate.
	for _, e := range r.events.all() {
		if e.IdempotenceID != "dd-good" {
			t.Fatalf("%s reported %s while the poison record's dead letter is not stored", e.IdempotenceID, e.Outcome)
		}
	}
	if n := s.accepted()["dd-same-key"]; n != 0 {
		t.Fatalf("the record behind the poison one with its Kafka key was delivered before it: key order broken")
	}
	waitUntil(t, "the consumer is not ready and says the dead-letter topic is missing", func() bool {
		ready, reason := r.c.Ready()
		return !ready && strings.Contains(reason, "dead-letter topic orders.dlq is missing")
	})
	if lag := committedLag(t, seeds, "g-dlqdown"); lag[0] != 3 {
		t.Fatalf("committed lag %d, want 3: no offset may be committed before the dead letter is stored", lag[0])
	}

	createTopic(t, seeds, "orders.dlq")
	waitUntil(t, "every record was processed", func() bool {
		return r.events.count(OutcomeDeadLettered) >= 1 && s.accepted()["dd-same-key"] == 1
	})
	r.waitReady(t)
	if letters := testenv.ReadTopic(t, seeds, "orders.dlq"); len(letters) != 1 || deadletter.Read(letters[0]).Reason != decode.ClassUndeclaredType {
		t.Fatalf("dead letters %v, want the one UndeclaredType letter", letters)
	}
	if a := s.accepted(); a["dd-good"] != 1 || a["dd-same-key"] != 1 {
		t.Fatalf("the good records were not delivered once each: %v", a)
	}
	waitUntil(t, "every offset is committed", func() bool { return committedLag(t, seeds, "g-dlqdown")[0] == 0 })
}

func TestOperatorActionsRunInTheConsumer(t *testing.T) {
	pool := database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	r := startConsumer(t, testInbox(t, seeds, "g-actions", s.srv.URL, sinkOpts{}), "actions-1",
		func(c *Config) { c.ActionsInterval = 50 * time.Millisecond })
	testenv.Produce(t, seeds, event(0, "OrderPaid", "act-paid", "act-o1"), event(0, "OrderShipped", "act-shipped", "act-o2"))
	waitUntil(t, "both messages are buffered", func() bool { return r.events.count("Buffered") == 2 })

	ctx := context.Background()
	if err := inbox.RequestMessageAction(ctx, pool, "", "OrderPaid", "act-paid", inbox.ActionConsume); err != nil {
		t.Fatal(err)
	}
	if err := inbox.RequestInstanceAction(ctx, pool, "", "order", "act-o2", inbox.ActionClose); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "CONSUME delivered the buffered message", func() bool { return s.accepted()["act-paid"] == 1 })
	waitUntil(t, "CLOSE dead-lettered the buffered message", func() bool { return len(testenv.ReadTopic(t, seeds, "orders.dlq")) == 1 })
	l := deadletter.Read(testenv.ReadTopic(t, seeds, "orders.dlq")[0])
	if l.Reason != deadletter.ReasonOperatorAction || l.Sequence != "order" || l.ContextID != "act-o2" || l.Origin.Offset != 1 {
		t.Fatalf("dead letter %+v, want OperatorAction of order/act-o2 from offset 1", l)
	}
	if s.accepted()["act-shipped"] != 0 {
		t.Fatalf("CLOSE delivered the buffered message")
	}
}

func createTopic(t testing.TB, seeds []string, topic string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
}

func TestStructuredModeRecordReachesTheSinkInBinaryMode(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	r := startConsumer(t, testInbox(t, seeds, "g-structured", s.srv.URL, sinkOpts{}), "structured-1")
	testenv.Produce(t, seeds, &kgo.Record{
		Topic: "orders", Key: []byte("st-o1"),
		Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}},
		Value: []byte(`{"specversion":"1.0","id":"st-1","source":"/shop","type":"OrderCreated",
			"datacontenttype":"application/json","data":{"orderId":"st-o1","total":12.5}}`),
	})
	waitUntil(t, "the record was processed", func() bool { return r.events.count("") == 1 })
	ds := s.deliveries()
	if len(ds) != 1 {
		t.Fatalf("sink saw %d requests, want 1", len(ds))
	}
	d := ds[0]
	if d.ID != "st-1" || d.Type != "OrderCreated" || d.ContextID != "st-o1" || d.ContentType != "application/json" ||
		d.Body != `{"orderId":"st-o1","total":12.5}` {
		t.Fatalf("delivery %+v, want the event's data as body with its attributes as ce- headers", d)
	}
}

func TestBufferedMessageWhoseReleaseFailsIsDeadLettered(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, func(id string, attempt int) int {
		if id == "rf-paid" {
			return 422 // final: not retried
		}
		return 200
	})
	r := startConsumer(t, testInbox(t, seeds, "g-relfail", s.srv.URL, sinkOpts{retries: 2}), "relfail-1")
	testenv.Produce(t, seeds, event(0, "OrderPaid", "rf-paid", "rf-o1"), event(0, "OrderCreated", "rf-created", "rf-o1"))
	waitUntil(t, "both records were processed", func() bool { return r.events.count("") == 2 })

	created := r.events.all()[1]
	if created.Outcome != "Delivered" || created.ReleaseFailures != 1 || created.Released != 0 {
		t.Fatalf("Created: %+v, want Delivered with one failed release", created)
	}
	letters := testenv.ReadTopic(t, seeds, "orders.dlq")
	if len(letters) != 1 {
		t.Fatalf("%d dead letters, want 1", len(letters))
	}
	l := deadletter.Read(letters[0])
	if l.Reason != deadletter.ReasonReleaseFailed || l.Origin.Offset != 0 || l.Sequence != "order" || l.ContextID != "rf-o1" ||
		headerOf(letters[0], "ce_id") != "rf-paid" || string(letters[0].Value) != `{"orderId":"rf-o1"}` {
		t.Fatalf("dead letter %+v (ce_id %q), want the buffered Paid record from offset 0 as ReleaseFailed", l, headerOf(letters[0], "ce_id"))
	}
	if n := len(s.deliveries()); n != 2 {
		t.Fatalf("sink saw %d requests, want 2 (Created, and Paid once: a 422 is final)", n)
	}
}
