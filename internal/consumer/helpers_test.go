package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

var dbURL string

func TestMain(m *testing.M) {
	if os.Getenv(childManifestEnv) != "" {
		os.Exit(runChildConsumer())
	}
	os.Exit(testenv.RunWithDatabase(m, &dbURL))
}

var migrateOnce sync.Once

// database returns a pool on the package's migrated database with empty inbox tables, closed with
// the test.
func database(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Pool(t, dbURL)
	migrateOnce.Do(func() {
		if _, err := migrations.Apply(context.Background(), pool); err != nil {
			t.Fatalf("migrate: %v", err)
		}
	})
	// Each test starts from an empty inbox, so that a repeated run (-count) does not find the
	// claims of the previous one and skip its messages as duplicates.
	if _, err := pool.Exec(context.Background(), `TRUNCATE sequence_instance, sequenced_message, buffered_message,
		sequential_inbox_idempotence, consumer_registry`); err != nil {
		t.Fatalf("empty the inbox tables: %v", err)
	}
	return pool
}

// waitTimeout bounds every wait for a condition; tests poll, they never sleep a fixed time.
const waitTimeout = 90 * time.Second

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.WaitUntil(t, what, waitTimeout, cond)
}

// inboxYAML is the declaration of the tests: an order sequence Created → Paid → Shipped, plus a
// subtyped type, context ID from the payload.
const inboxYAML = `
apiVersion: inbox.seqinbox.dev/v1alpha1
kind: SequentialInbox
metadata: {name: test-inbox}
spec:
  kafka:
    bootstrapServers: [%s]
    topics: [orders]
    consumerGroup: %s
    maxPollIntervalMs: 10000
  database:
    urlSecretRef: {name: db, key: url}
    poolSize: 10
    idleLockTimeout: 5s
  sink:
    url: %s
    timeout: %s
    retries: %d
    initialBackoff: 10ms
  deadLetterTopic: orders.dlq
  housekeeping: {interval: 1h}
  sequences:
  - name: order
    retention: 1h
    messages:
    - type: OrderCreated
      contextId: {jsonPointer: /orderId}
    - type: OrderPaid
      contextId: {jsonPointer: /orderId}
      releaseCondition: {predecessor: OrderCreated}
    - type: OrderShipped
      contextId: {jsonPointer: /orderId}
      releaseCondition: {predecessor: OrderPaid}
    - type: OrderValidated
      subtype: OK
      subtypeFrom: {header: ce_result}
      contextId: {jsonPointer: /orderId}
`

// sinkOpts are the sink settings of a test inbox.
type sinkOpts struct {
	timeout time.Duration
	retries int
}

func testInbox(t testing.TB, seeds []string, group, sinkURL string, so sinkOpts) *v1alpha1.SequentialInbox {
	t.Helper()
	if so.timeout == 0 {
		so.timeout = 5 * time.Second
	}
	inbox, err := manifest.Parse(fmt.Appendf(nil, inboxYAML, strings.Join(seeds, ","), group, sinkURL, so.timeout, so.retries))
	if err != nil {
		t.Fatal(err)
	}
	return inbox
}

// cluster starts kfake with the orders topic (partitions) and its dead-letter topic.
func cluster(t testing.TB, partitions int32) []string {
	return testenv.Kafka(t, partitions, "orders", "orders.dlq")
}

// recorder collects the Events of one consumer.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) add(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

func (r *recorder) count(outcome string) int {
	n := 0
	for _, e := range r.all() {
		if outcome == "" || e.Outcome == outcome {
			n++
		}
	}
	return n
}

// running is a consumer started by a test.
type running struct {
	c      *Consumer
	events *recorder
	cancel context.CancelFunc
	done   chan error
}

// startConsumer runs a consumer until the test ends (or the test stops it earlier).
func startConsumer(t testing.TB, inbox *v1alpha1.SequentialInbox, instance string, tweak ...func(*Config)) *running {
	t.Helper()
	rec := &recorder{}
	cfg := Config{
		Inbox: inbox, DatabaseURL: dbURL, InstanceID: instance,
		Fence:          fence.Config{HeartbeatInterval: 100 * time.Millisecond, LivenessWindow: 3 * time.Second},
		CommitInterval: 100 * time.Millisecond,
		Log:            testr.NewWithInterface(t, testr.Options{Verbosity: 0}).WithName(instance),
		OnRecord:       rec.add,
	}
	for _, f := range tweak {
		f(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{c: c, events: rec, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop shuts the consumer down gracefully (as SIGTERM does) and returns Run's error.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(waitTimeout):
		t.Errorf("consumer did not stop within %s", waitTimeout)
		return errors.New("did not stop")
	}
}

func (r *running) waitReady(t testing.TB) {
	t.Helper()
	waitUntil(t, "the consumer is ready", func() bool { ready, _ := r.c.Ready(); return ready })
}

// delivery is one request the test sink answered (or abandoned).
type delivery struct {
	ID, Type, Sequence, ContextID, ContentType string
	Body                                       string
	Status                                     int // 0: the client went away first
	Header                                     http.Header
}

// testSink records every delivery. answer decides the status per request; 0 holds the request
// until the client goes away or release opens (then 200).
type testSink struct {
	srv     *httptest.Server
	mu      sync.Mutex
	log     []delivery
	answer  func(id string, attempt int) int
	release *testenv.Latch
	inHang  map[string]bool
}

func newSink(t testing.TB, answer func(id string, attempt int) int) *testSink {
	t.Helper()
	s := &testSink{answer: answer, release: testenv.NewLatch(), inHang: map[string]bool{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.release.Open()
		s.srv.Close()
	})
	return s
}

func (s *testSink) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	d := delivery{
		ID: r.Header.Get("ce-id"), Type: r.Header.Get("ce-type"), Sequence: r.Header.Get("ce-seqinboxsequence"),
		ContextID: r.Header.Get("ce-seqinboxcontextid"), ContentType: r.Header.Get("Content-Type"), Body: string(body),
		Header: r.Header,
	}
	s.mu.Lock()
	attempt := 1
	for _, prev := range s.log {
		if prev.ID == d.ID {
			attempt++
		}
	}
	status := 200
	if s.answer != nil {
		status = s.answer(d.ID, attempt)
	}
	if status == 0 {
		s.inHang[d.ID] = true
	}
	s.mu.Unlock()
	if status == 0 {
		if s.release.Wait(r.Context()) {
			status = 200
		}
		s.mu.Lock()
		delete(s.inHang, d.ID)
		s.mu.Unlock()
	}
	d.Status = status
	s.mu.Lock()
	s.log = append(s.log, d)
	s.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
	}
}

func (s *testSink) hanging(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inHang[id]
}

func (s *testSink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.log...)
}

// accepted counts the 2xx answers per ce-id.
func (s *testSink) accepted() map[string]int {
	out := map[string]int{}
	for _, d := range s.deliveries() {
		if d.Status >= 200 && d.Status < 300 {
			out[d.ID]++
		}
	}
	return out
}

// acceptedOrder lists the accepted ce-ids of one context in arrival order.
func (s *testSink) acceptedOrder(contextID string) []string {
	var out []string
	for _, d := range s.deliveries() {
		if d.ContextID == contextID && d.Status >= 200 && d.Status < 300 {
			out = append(out, d.Type)
		}
	}
	return out
}

// event builds a binary-mode CloudEvent record for a partition of the orders topic.
func event(partition int32, typ, id, orderID string, extra ...kgo.RecordHeader) *kgo.Record {
	headers := []kgo.RecordHeader{
		{Key: "ce_specversion", Value: []byte("1.0")},
		{Key: "ce_id", Value: []byte(id)},
		{Key: "ce_source", Value: []byte("/test")},
		{Key: "ce_type", Value: []byte(typ)},
		{Key: "content-type", Value: []byte("application/json")},
	}
	return &kgo.Record{
		Topic: "orders", Partition: partition, Key: []byte(orderID),
		Value:   fmt.Appendf(nil, `{"orderId":%q}`, orderID),
		Headers: append(headers, extra...),
	}
}

// largeRecordBytes is the largest record the tests produce (allowLargeRecords).
const largeRecordBytes = 8 << 20

// allowLargeRecords raises a topic's max.message.bytes to largeRecordBytes.
func allowLargeRecords(t testing.TB, seeds []string, topic string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	limit := strconv.Itoa(largeRecordBytes)
	resp, err := kadm.NewClient(cl).AlterTopicConfigs(context.Background(),
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &limit}}, topic)
	if err == nil {
		var r kadm.AlterConfigsResponse
		if r, err = resp.On(topic, nil); err == nil {
			err = r.Err
		}
	}
	if err != nil {
		t.Fatalf("raise max.message.bytes of %s: %v", topic, err)
	}
}

// committedLag returns, per partition of orders, end offset minus the group's committed offset.
func committedLag(t testing.TB, seeds []string, group string) map[int32]int64 {
	t.Helper()
	lag, err := testenv.CommittedLag(seeds, group, "orders")
	if err != nil {
		t.Fatal(err)
	}
	return lag
}

func headerOf(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
