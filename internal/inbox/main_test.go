package inbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/seqinbox/seqinbox/internal/dbconn"
	"github.com/seqinbox/seqinbox/internal/sequence"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithDatabase(m, &dbURL))
}

var (
	schemaOnce sync.Once
	schemaErr  error
)

// newPool opens a pool on the package's database, migrated once per package; params are
// run-time parameters of its sessions.
func newPool(tb testing.TB, url string, maxConns int32, params ...map[string]string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := dbconn.PoolConfig(url, logr.Discard())
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = maxConns
	for _, p := range params {
		maps.Copy(cfg.ConnConfig.RuntimeParams, p)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if url == dbURL {
		schemaOnce.Do(func() { _, schemaErr = migrations.Apply(context.Background(), pool) })
		if schemaErr != nil {
			tb.Fatal(schemaErr)
		}
	} else if _, err := migrations.Apply(context.Background(), pool); err != nil {
		tb.Fatal(err)
	}
	return pool
}

func newFakeClock() *testingclock.FakeClock {
	return testingclock.NewFakeClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
}

// testListener records every call, tracks calls in flight per claim key, and behaves as told.
type testListener struct {
	mu        sync.Mutex
	calls     []Message
	delivered []Message
	inFlight  map[string]int
	overlaps  []string
	behave    func(ctx context.Context, m Message) error
}

func newTestListener() *testListener { return &testListener{inFlight: map[string]int{}} }

func claimKey(m Message) string { return m.QualifiedType + "/" + m.Record.IdempotenceID }

func (l *testListener) Deliver(ctx context.Context, m Message) error {
	key := claimKey(m)
	l.mu.Lock()
	l.inFlight[key]++
	if l.inFlight[key] > 1 {
		l.overlaps = append(l.overlaps, key)
	}
	l.calls = append(l.calls, m)
	behave := l.behave
	l.mu.Unlock()
	var err error
	if behave != nil {
		err = behave(ctx, m)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight[key]--
	if err == nil {
		l.delivered = append(l.delivered, m)
	}
	return err
}

func (l *testListener) setBehaviour(f func(ctx context.Context, m Message) error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.behave = f
}

func (l *testListener) callCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.calls)
}

// deliveredTypes lists the qualified types delivered successfully, in order, for one context.
func (l *testListener) deliveredTypes(contextID string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, m := range l.delivered {
		if m.ContextID == contextID {
			out = append(out, m.QualifiedType)
		}
	}
	return out
}

func (l *testListener) concurrentCalls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.overlaps)
}

// recordingDeadLetterer collects dead letters.
type recordingDeadLetterer struct {
	mu      sync.Mutex
	letters []deadLetter
}

type deadLetter struct {
	msg    Message
	reason string
}

func (d *recordingDeadLetterer) DeadLetter(_ context.Context, m Message, reason string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.letters = append(d.letters, deadLetter{m, reason})
	return nil
}

// mt declares a qualified type; cond may be nil.
func mt(typ, subtype string, cond sequence.Condition) *sequence.MessageType {
	return &sequence.MessageType{Type: typ, Subtype: subtype, Qualified: sequence.Qualify(typ, subtype), Condition: cond}
}

func seqOf(name string, types ...*sequence.MessageType) *sequence.Sequence {
	return &sequence.Sequence{Name: name, Retention: time.Hour, Types: types}
}

// chainSet is the sequence used by most tests: A, then B after A, then C after B.
func chainSet() *sequence.Set {
	return sequence.NewSet([]*sequence.Sequence{seqOf("chain",
		mt("A", "", nil),
		mt("B", "", sequence.Predecessor("A")),
		mt("C", "", sequence.Predecessor("B")),
	)})
}

// keepingChainSet is chainSet with the records of delivered messages kept for replay.
func keepingChainSet() *sequence.Set {
	set := chainSet()
	seq, _ := set.Sequence("chain")
	seq.KeepDeliveredRecords = true
	return set
}

// harness is one test's engine on the shared database. Idempotence and context IDs carry a
// prefix unique to the test, so tests never share claims or instances.
type harness struct {
	t        *testing.T
	pool     *pgxpool.Pool
	engine   *Engine
	listener *testListener
	clock    *testingclock.FakeClock
	prefix   string
}

// harnessSettings are the engine's Config and the size of the records' pool.
type harnessSettings struct {
	Config
	recordsConns int32
	// recordsParams are run-time parameters of the records' pool sessions.
	recordsParams map[string]string
	// metrics are the engine's collectors; nil: its own, unregistered.
	metrics *Metrics
}

type harnessOption func(*harnessSettings)

// withRecordsPool sizes the records' pool.
func withRecordsPool(conns int32) harnessOption {
	return func(s *harnessSettings) { s.recordsConns = conns }
}

// withRecordsSessionParams sets run-time parameters of the records' pool sessions.
func withRecordsSessionParams(params map[string]string) harnessOption {
	return func(s *harnessSettings) { s.recordsParams = params }
}

func newHarness(t *testing.T, set *sequence.Set, opts ...harnessOption) *harness {
	t.Helper()
	return newHarnessOn(t, dbURL, set, opts...)
}

var prefixCounter atomic.Int64

func newHarnessOn(t *testing.T, url string, set *sequence.Set, opts ...harnessOption) *harness {
	t.Helper()
	h := &harness{
		t:        t,
		listener: newTestListener(),
		clock:    newFakeClock(),
		prefix:   fmt.Sprintf("%s-%d-", regexp.MustCompile(`\W+`).ReplaceAllString(t.Name(), "_"), prefixCounter.Add(1)),
	}
	s := harnessSettings{Config: Config{ListenerDeadline: 30 * time.Second, IdleLockTimeout: 30 * time.Second, Clock: h.clock}, recordsConns: 20}
	for _, o := range opts {
		o(&s)
	}
	h.pool = newPool(t, url, s.recordsConns, s.recordsParams)
	if s.Maintenance == nil {
		s.Maintenance = newPool(t, url, MaintenanceConnections)
	}
	e, err := New(h.pool, set, h.listener, s.Config, s.metrics)
	if err != nil {
		t.Fatal(err)
	}
	// A leading engine holds a maintenance connection until it resigns; the pools close after.
	t.Cleanup(e.ResignHousekeeping)
	h.engine = e
	return h
}

func (h *harness) ctxID(c string) string { return h.prefix + c }

// rec builds a sequenced record with distinct key, value and headers.
func (h *harness) rec(qualified, idem, contextID string) Record {
	typ, subtype, _ := strings.Cut(qualified, ".")
	return Record{
		Type: typ, Subtype: subtype, IdempotenceID: h.prefix + idem, ContextID: h.ctxID(contextID), Sequenced: true,
		Key:     []byte("key-" + idem),
		Value:   []byte(`{"id":"` + idem + `"}`),
		Headers: []Header{{Key: "ce_type", Value: []byte(typ)}, {Key: "ce_id", Value: []byte(idem)}},
		Origin:  Origin{Topic: "orders", Partition: 1, Offset: 42, MessageID: idem},
	}
}

func (h *harness) process(rec Record) Result {
	h.t.Helper()
	res, err := h.engine.Process(context.Background(), rec)
	if err != nil {
		h.t.Fatalf("process %s/%s: %v", rec.Type, rec.IdempotenceID, err)
	}
	return res
}

// states lists the states of the stored rows of a logical message, oldest first.
func (h *harness) states(qualified, idem string) []string {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(),
		`SELECT state FROM sequenced_message WHERE message_type = $1 AND idempotence_id = $2 ORDER BY id`,
		qualified, h.prefix+idem)
	if err != nil {
		h.t.Fatal(err)
	}
	s, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// claims counts the claims of a logical message (0 or 1).
func (h *harness) claims(qualified, idem string) int {
	h.t.Helper()
	return h.count(`SELECT count(*) FROM sequential_inbox_idempotence WHERE message_type = $1 AND idempotence_id = $2`,
		qualified, h.prefix+idem)
}

func (h *harness) count(sql string, args ...any) int {
	h.t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// instanceState returns the state of the instance (sequence, context), or "" without one.
func (h *harness) instanceState(seq, contextID string) string {
	h.t.Helper()
	var s string
	err := h.pool.QueryRow(context.Background(),
		`SELECT state FROM sequence_instance WHERE name = $1 AND context_id = $2`, seq, h.ctxID(contextID)).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitUntil(t, what, 20*time.Second, cond)
}

// blockedClaimInserts returns the backends of this database whose claim insert waits for a lock
// held by another backend.
func (h *harness) blockedClaimInserts() []int32 {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `
SELECT a.pid FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
  AND a.query LIKE 'INSERT INTO sequential_inbox_idempotence%'
  AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND NOT l.granted)
  AND cardinality(pg_blocking_pids(a.pid)) > 0`)
	if err != nil {
		h.t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		h.t.Fatal(err)
	}
	return pids
}

func types(ms []Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.QualifiedType
	}
	return out
}

func counterValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}
