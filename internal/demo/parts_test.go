package demo

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// post sends a CloudEvent in binary mode to the sink, as a consumer does.
func post(t *testing.T, url, id string, mutate func(*http.Request)) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"orderId":"order-1003"}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": id, "ce-type": "OrderPaid", "ce-source": Source,
		"Content-Type": "application/json", "ce-seqinboxsequence": "order", "ce-seqinboxcontextid": "order-1003"} {
		req.Header.Set(k, v)
	}
	if mutate != nil {
		mutate(req)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func TestSinkRejectsTheChosenIDOnceAndRecordsEveryRequest(t *testing.T) {
	sink, err := StartSink("evt-1003-paid")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sink.Close() }()

	statuses := []int{
		post(t, sink.URL("a"), "evt-1003-paid", nil),
		post(t, sink.URL("b"), "evt-1003-paid", nil),
		post(t, sink.URL("a"), "evt-1003-created", nil),
		post(t, sink.URL("a"), "evt-1003-shipped", func(r *http.Request) { r.Header.Del("ce-specversion") }),
	}
	want := []int{http.StatusInternalServerError, http.StatusNoContent, http.StatusNoContent, http.StatusBadRequest}
	if !reflect.DeepEqual(statuses, want) {
		t.Fatalf("sink answered %v, want %v (500 only the first time for the chosen id, 400 for a malformed event)", statuses, want)
	}
	got := sink.Deliveries()
	if len(got) != 4 {
		t.Fatalf("sink recorded %d requests, want 4", len(got))
	}
	first := got[0]
	if first.Via != "a" || first.ID != "evt-1003-paid" || first.Sequence != "order" || first.ContextID != "order-1003" ||
		first.OrderID != "order-1003" || first.Accepted() {
		t.Errorf("first delivery recorded as %+v", first)
	}
	if !got[1].Accepted() || got[1].Via != "b" {
		t.Errorf("the retry was recorded as %+v, want accepted via b", got[1])
	}
	if got[3].Problem == "" || got[3].Accepted() {
		t.Errorf("the malformed request was recorded as %+v, want a problem and no acceptance", got[3])
	}
}

func TestConsumerCopyChangesOnlyGroupSinkAndBrokers(t *testing.T) {
	original, _ := sample(t)
	data, err := os.ReadFile(samplePath(t))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "inbox-a.yaml")
	seeds := []string{"127.0.0.1:1111", "127.0.0.1:2222"}
	if err := consumerCopy(data, path, "order-inbox-a", "http://127.0.0.1:9/events?via=a", seeds); err != nil {
		t.Fatal(err)
	}
	copied, err := manifest.Load(path)
	if err != nil {
		t.Fatalf("the copy is not a valid manifest: %v", err)
	}
	if copied.Spec.Kafka.ConsumerGroup != "order-inbox-a" || copied.Spec.Sink.URL != "http://127.0.0.1:9/events?via=a" ||
		!reflect.DeepEqual(copied.Spec.Kafka.BootstrapServers, seeds) {
		t.Fatalf("copy has group %q, sink %q, brokers %v", copied.Spec.Kafka.ConsumerGroup, copied.Spec.Sink.URL, copied.Spec.Kafka.BootstrapServers)
	}
	copied.Spec.Kafka.ConsumerGroup = original.Spec.Kafka.ConsumerGroup
	copied.Spec.Sink.URL = original.Spec.Sink.URL
	copied.Spec.Kafka.BootstrapServers = original.Spec.Kafka.BootstrapServers
	if !reflect.DeepEqual(copied, original) {
		t.Errorf("the copy differs from the sample beyond group, sink and brokers:\n%+v\n%+v", copied.Spec, original.Spec)
	}
}

// TestScenarioRecordsDecodeAsIntended proves that the scenario means what the report says it
// means, with the consumer's own decoder: events decode to their type, ID and order; the test
// order is not sequenced; the poison records fail with the dead-letter reason the report names.
func TestScenarioRecordsDecodeAsIntended(t *testing.T) {
	_, set := sample(t)
	dec, err := decode.New(set)
	if err != nil {
		t.Fatal(err)
	}
	sc := OrderScenario("orders")
	records := sc.Records()
	wantPoison := map[string]string{"evt-1005-paid": decode.ClassInvalidJSON, "evt-1004-validated": decode.ClassInvalidSubtype}
	for i, s := range sc.Sends {
		rec, err := dec.Decode(records[i], time.Now())
		if s.Poison != nil {
			var de *decode.Error
			if !errors.As(err, &de) || de.Class != wantPoison[s.Poison.ID] {
				t.Errorf("poison %s decoded with error %v, want class %s", s.Poison.ID, err, wantPoison[s.Poison.ID])
			}
			continue
		}
		e := s.Event
		if err != nil {
			t.Errorf("%s: %v", e.ID, err)
			continue
		}
		if rec.IdempotenceID != e.ID || rec.Type != e.Type || rec.Subtype != e.Subtype || records[i].Partition != s.Partition {
			t.Errorf("%s decoded as %s/%s id %s on partition %d", e.ID, rec.Type, rec.Subtype, rec.IdempotenceID, records[i].Partition)
		}
		if rec.Sequenced == e.Test {
			t.Errorf("%s: sequenced = %v, but test = %v (the sample's filter sequences exactly the non-test orders)", e.ID, rec.Sequenced, e.Test)
		}
		if !e.Test && rec.ContextID != e.OrderID {
			t.Errorf("%s: context %q, want %q", e.ID, rec.ContextID, e.OrderID)
		}
	}
	duplicates := 0
	partitionsOf := map[string]map[int32]bool{}
	for _, s := range sc.Sends {
		if s.Event == nil {
			continue
		}
		if partitionsOf[s.Event.ID] == nil {
			partitionsOf[s.Event.ID] = map[int32]bool{}
		} else {
			duplicates++
		}
		partitionsOf[s.Event.ID][s.Partition] = true
	}
	acrossPartitions := 0
	for _, ps := range partitionsOf {
		if len(ps) > 1 {
			acrossPartitions++
		}
	}
	if duplicates < 3 || acrossPartitions < 2 {
		t.Errorf("scenario has %d duplicates, %d across partitions; the demo must show duplicates racing across partitions", duplicates, acrossPartitions)
	}
}

func TestKafkaHelpersReadLagAndDeadLetters(t *testing.T) {
	seeds := testenv.Kafka(t, 3, "orders", "orders.dlq")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sc := OrderScenario("orders")
	if err := Produce(ctx, seeds, sc); err != nil {
		t.Fatal(err)
	}
	left, err := Unprocessed(ctx, seeds, "orders", []string{"nobody"})
	if err != nil {
		t.Fatal(err)
	}
	if left["nobody"] != int64(len(sc.Sends)) {
		t.Fatalf("a group without commits has %d records left, want all %d", left["nobody"], len(sc.Sends))
	}

	group, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("reader"), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	for read := 0; read < len(sc.Sends); {
		fetches := group.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records before the deadline", read, len(sc.Sends))
		}
		read += fetches.NumRecords()
	}
	if err := group.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatal(err)
	}
	left, err = Unprocessed(ctx, seeds, "orders", []string{"reader", "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	if left["reader"] != 0 || left["nobody"] != int64(len(sc.Sends)) {
		t.Fatalf("after the reader committed everything: left = %v, want reader 0 and nobody %d", left, len(sc.Sends))
	}

	none, err := ReadDeadLetters(ctx, seeds, "orders.dlq")
	if err != nil || len(none) != 0 {
		t.Fatalf("empty dead-letter topic read as %v, %v", none, err)
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	// franz-go owns a record while producing it: the two copies must be two records.
	deadLetter := func() *kgo.Record {
		return &kgo.Record{Topic: "orders.dlq", Value: []byte("{"), Headers: []kgo.RecordHeader{
			{Key: "ce_id", Value: []byte("evt-1005-paid")}, {Key: "ce_type", Value: []byte("OrderPaid")},
			{Key: "seqinbox-dlq-reason", Value: []byte("InvalidJSON")}, {Key: "seqinbox-dlq-message", Value: []byte("unexpected end")},
			{Key: "seqinbox-dlq-original-topic", Value: []byte("orders")}, {Key: "seqinbox-dlq-original-partition", Value: []byte("1")},
			{Key: "seqinbox-dlq-original-offset", Value: []byte("12")}, {Key: "other", Value: []byte("x")},
		}}
	}
	if err := producer.ProduceSync(ctx, deadLetter(), deadLetter()).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadDeadLetters(ctx, seeds, "orders.dlq")
	if err != nil {
		t.Fatal(err)
	}
	want := DeadLetter{ID: "evt-1005-paid", Type: "OrderPaid", Reason: "InvalidJSON", Message: "unexpected end", Origin: "orders[1]@12",
		Headers: map[string]string{"seqinbox-dlq-reason": "InvalidJSON", "seqinbox-dlq-message": "unexpected end",
			"seqinbox-dlq-original-topic": "orders", "seqinbox-dlq-original-partition": "1", "seqinbox-dlq-original-offset": "12"}}
	if len(got) != 2 || !reflect.DeepEqual(got[0], want) || !reflect.DeepEqual(got[1], want) {
		t.Fatalf("dead letters = %+v, want twice %+v", got, want)
	}
}

func TestCounterSumsSelectedSeriesOfAScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	records := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seqinbox_records_total"}, []string{"outcome"})
	claims := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "seqinbox_claims_total"}, []string{"result"})
	waiting := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "seqinbox_message_waiting_seconds"}, []string{"sequence", "type"})
	reg.MustRegister(records, claims, waiting)
	records.WithLabelValues("Delivered").Add(4)
	records.WithLabelValues("Duplicate").Add(6)
	claims.WithLabelValues("Won").Add(5)
	claims.WithLabelValues("Lost").Add(7)
	waiting.WithLabelValues("order", "OrderPaid").Observe(0.1)
	waiting.WithLabelValues("order", "OrderShipped").Observe(0.2)
	waiting.WithLabelValues("order", "OrderShipped").Observe(0.3)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	families, err := Scrape(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, c := range engineCounters() {
		if v := c.Value(families); v != 0 {
			got[strings.TrimSpace(c.Label)] = v
		}
	}
	want := map[string]float64{
		"records read": 10, "delivered at once (claim won, condition held)": 4, "skipped as duplicates": 6,
		"claims won": 5, "claims lost (another delivery held the claim)": 7, "released from the buffer later": 3,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("non-zero counters = %v, want %v (a missing family counts zero)", got, want)
	}
}

func TestReportShowsOrdersSinkMetricsAndDeadLetters(t *testing.T) {
	_, set := sample(t)
	sc := OrderScenario("orders")
	ds, dead := inOrder(t, set, sc, 2)
	r := &Report{Scenario: sc, Counters: engineCounters(), Deliveries: ds, DeadLetterTopic: "orders.dlq", DeadLetters: dead,
		Consumers: []ConsumerStats{
			{Name: "consumer-a", Values: []float64{22, 6, 3, 10, 1, 2, 3, 9, 10, 10, 1, 0}},
			{Name: "consumer-b", Values: []float64{22, 5, 2, 12, 1, 2, 2, 7, 12, 8, 0, 0}}},
		Verdict: Check(set, sc, ds, dead, 2)}
	var out bytes.Buffer
	if err := r.Write(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"order-1001  sent      OrderDelivered  OrderShipped  OrderValidated.STOCK_AVAILABLE  OrderPaid  OrderCreated",
		"received  OrderCreated → OrderValidated.STOCK_AVAILABLE → OrderPaid → OrderShipped → OrderDelivered",
		"OrderCreated×2",
		"✗OrderPaid",
		"test order",
		"  buffered (claim won, waiting for predecessors)",
		"Dead-letter topic orders.dlq: 4 records",
		"OrderPaid evt-1005-paid from orders[1]@18 ×2 — its payload is truncated JSON",
		"VERDICT: holds",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "FAILED") {
		t.Errorf("report of a correct run says FAILED:\n%s", text)
	}
}
