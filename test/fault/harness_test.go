package fault

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

// waitTimeout bounds every wait: generous, so that a loaded machine slows the suite down but
// does not fail it. Nothing is asserted about how long a step takes.
const waitTimeout = 4 * time.Minute

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.WaitUntil(t, what, waitTimeout, cond)
}

// Topics of every test.
const (
	topic    = "orders"
	dlqTopic = "orders.dlq"
)

// kafka starts kfake with the orders topic and, when withDLQ, its dead-letter topic.
func kafka(t testing.TB, partitions int32, withDLQ bool) (*kfake.Cluster, []string) {
	t.Helper()
	topics := []string{topic}
	if withDLQ {
		topics = append(topics, dlqTopic)
	}
	return testenv.KafkaCluster(t, partitions, topics...)
}

// migratedDatabase returns a fresh database on the tests' PostgreSQL server, migrated.
func migratedDatabase(t testing.TB) string {
	t.Helper()
	url := testenv.FreshDatabase(t, "fault")
	migrate(t, url)
	return url
}

func migrate(t testing.TB, url string) {
	t.Helper()
	if _, err := migrations.Apply(context.Background(), testenv.Pool(t, url)); err != nil {
		t.Fatalf("migrate: %v", err)
	}
}

// inbox is what a test's manifest varies.
type inbox struct {
	group             string
	sinkURL           string
	maxPollIntervalMs int
	sinkTimeout       time.Duration
	sinkRetries       int
	poolSize          int
}

// sessionTimeoutMs is the Kafka session of the test consumers: the shortest kfake accepts, so
// that a killed consumer's partitions move on soon, and within every test's maxPollIntervalMs.
const sessionTimeoutMs = 6000

// manifestYAML declares the order sequence Created → Paid, context ID /orderId.
const manifestYAML = `apiVersion: inbox.seqinbox.dev/v1alpha1
kind: SequentialInbox
metadata: {name: fault-inbox}
spec:
  kafka:
    bootstrapServers: [placeholder:9092]
    topics: [orders]
    consumerGroup: %s
    maxPollIntervalMs: %d
    sessionTimeoutMs: %d
    heartbeatIntervalMs: 1000
  database:
    urlSecretRef: {name: db, key: url}
    poolSize: %d
    idleLockTimeout: 5s
  sink:
    url: %s
    timeout: %s
    retries: %d
    initialBackoff: 50ms
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
`

func (in inbox) write(t testing.TB) string {
	t.Helper()
	if in.maxPollIntervalMs == 0 {
		in.maxPollIntervalMs = 20000
	}
	if in.sinkTimeout == 0 {
		in.sinkTimeout = 5 * time.Second
	}
	if in.poolSize == 0 {
		in.poolSize = 6
	}
	path := filepath.Join(t.TempDir(), "inbox.yaml")
	data := fmt.Sprintf(manifestYAML, in.group, in.maxPollIntervalMs, sessionTimeoutMs, in.poolSize, in.sinkURL, in.sinkTimeout, in.sinkRetries)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// process is one `seqinbox consume` subprocess.
type process struct {
	name, health, metrics, logPath string
	cmd                            *exec.Cmd
	done                           chan struct{}
}

// startConsumer runs `seqinbox consume` for the manifest until the test ends (SIGTERM then), with
// env (NAME=value) added to the test's environment.
func startConsumer(t testing.TB, name, manifest, databaseURL string, seeds []string, env ...string) *process {
	t.Helper()
	p := &process{name: name, health: freeAddr(t), metrics: freeAddr(t), logPath: filepath.Join(t.TempDir(), name+".log"), done: make(chan struct{})}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(binary, "consume", "-f", manifest, "--database-url", databaseURL,
		"--bootstrap-servers", strings.Join(seeds, ","), "--instance-id", name,
		"--metrics-bind-address", p.metrics, "--health-probe-bind-address", p.health)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.terminate()
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, p.logTail(40))
		}
	})
	return p
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

// ready asks /readyz; the body says why not.
func (p *process) ready() (bool, string) {
	resp, err := http.Get("http://" + p.health + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(body))
}

func (p *process) waitReady(t testing.TB) {
	t.Helper()
	waitUntil(t, p.name+" is ready", func() bool { ok, _ := p.ready(); return ok })
}

// metric sums the samples of a metric family on /metrics (-1 when it cannot be read).
func (p *process) metric(name string) float64 {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	sum := 0.0
	scanner := bufio.NewScanner(resp.Body)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	for scanner.Scan() {
		line := scanner.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// kill9 kills the process as a crash does: no signal handler runs.
func (p *process) kill9(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s: %v", p.name, err)
	}
	<-p.done
}

// terminate stops the process with SIGTERM (SIGKILL after a minute).
func (p *process) terminate() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// sink is the team's service: it records every request per CloudEvent id, how many of one id
// ran at the same time, and holds the requests hold selects (by id and attempt, from 1) until
// the client goes away (or release opens, then it accepts them).
type sink struct {
	srv *httptest.Server

	mu       sync.Mutex
	hold     func(id string, attempt int) bool
	accepted map[string]int
	attempts map[string]int
	running  map[string]int
	// concurrent counts requests that started while another of the same id was running.
	concurrent int
	held       map[string]bool
	firstOK    map[string]time.Time
	release    *testenv.Latch
}

func newSink(t testing.TB, hold func(id string, attempt int) bool) *sink {
	t.Helper()
	s := &sink{hold: hold, accepted: map[string]int{}, attempts: map[string]int{}, running: map[string]int{},
		held: map[string]bool{}, firstOK: map[string]time.Time{}, release: testenv.NewLatch()}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.release.Open()
		s.srv.Close()
	})
	return s
}

func (s *sink) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	id := r.Header.Get("ce-id")
	s.mu.Lock()
	s.attempts[id]++
	if s.running[id] > 0 {
		s.concurrent++
	}
	s.running[id]++
	hold := s.hold != nil && s.hold(id, s.attempts[id])
	if hold {
		s.held[id] = true
	}
	s.mu.Unlock()
	ok := true
	if hold {
		ok = s.release.Wait(r.Context())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running[id]--
	delete(s.held, id)
	if !ok {
		return
	}
	s.accepted[id]++
	if _, seen := s.firstOK[id]; !seen {
		s.firstOK[id] = time.Now()
	}
	w.WriteHeader(http.StatusOK)
}

func (s *sink) holding(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[id]
}

func (s *sink) acceptedCount(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted[id]
}

func (s *sink) acceptedAt(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.firstOK[id]
	return at, ok
}

// allAccepted reports whether every id was accepted at least once.
func (s *sink) allAccepted(ids []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.accepted[id] == 0 {
			return false
		}
	}
	return true
}

// orders builds n orders of two messages each (OrderPaid first for odd orders, so that it waits
// for OrderCreated), order i on partition i % partitions, ids prefixed.
func orders(prefix string, n int, partitions int32) (records []*kgo.Record, ids []string) {
	for i := range n {
		order := fmt.Sprintf("%s-o%d", prefix, i)
		created := event(int32(i)%partitions, "OrderCreated", order+"-created", order, nil)
		paid := event(int32(i)%partitions, "OrderPaid", order+"-paid", order, nil)
		if i%2 == 1 {
			records = append(records, paid, created)
		} else {
			records = append(records, created, paid)
		}
		ids = append(ids, order+"-created", order+"-paid")
	}
	return records, ids
}

// event is a binary-mode CloudEvent record; value nil means the JSON {"orderId": order}.
func event(partition int32, typ, id, order string, value []byte) *kgo.Record {
	if value == nil {
		value = fmt.Appendf(nil, `{"orderId":%q}`, order)
	}
	return &kgo.Record{
		Topic: topic, Partition: partition, Key: []byte(order), Value: value,
		Headers: []kgo.RecordHeader{
			{Key: "ce_specversion", Value: []byte("1.0")},
			{Key: "ce_id", Value: []byte(id)},
			{Key: "ce_source", Value: []byte("/fault")},
			{Key: "ce_type", Value: []byte(typ)},
			{Key: "content-type", Value: []byte("application/json")},
		},
	}
}

// uncommitted is the number of records of the orders topic the group has not committed (-1 when
// it cannot be read).
func uncommitted(seeds []string, group string) int64 {
	lag, err := testenv.CommittedLag(seeds, group, topic)
	if err != nil {
		return -1
	}
	var sum int64
	for _, n := range lag {
		sum += n
	}
	return sum
}

// deadLetters reads every letter of the dead-letter topic up to its current end.
func deadLetters(t testing.TB, seeds []string) []deadletter.Letter {
	t.Helper()
	var out []deadletter.Letter
	for _, r := range testenv.ReadTopic(t, seeds, dlqTopic) {
		out = append(out, deadletter.Read(r))
	}
	return out
}

// tally is the closing count of one fault: what the sink accepted of the sent messages.
type tally struct {
	sent, once, twice, lost int
	stalled                 int64
}

func count(t testing.TB, s *sink, ids []string, seeds []string, group string) tally {
	t.Helper()
	r := tally{sent: len(ids), stalled: uncommitted(seeds, group)}
	for _, id := range ids {
		switch s.acceptedCount(id) {
		case 0:
			r.lost++
		case 1:
			r.once++
		default:
			r.twice++
		}
	}
	return r
}

// report logs the closing count of a fault, the line the closing note quotes.
func (r tally) report(t testing.TB, fault string, recovery time.Duration) {
	t.Helper()
	t.Logf("FAULT %s: sent %d, delivered exactly once %d, delivered twice %d, lost %d, stalled %d; recovery %s",
		fault, r.sent, r.once, r.twice, r.lost, r.stalled, recovery.Round(time.Millisecond))
}
