package consumer

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/sink"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// BenchmarkThroughput reports records/s end to end (kfake → decode → claim engine → HTTP sink,
// offsets committed) next to the engine alone (Engine.Process called directly with the same
// HTTP sink, on the same database, with one goroutine per partition). Every record is an
// OrderCreated of its own order: delivered at once, two commits.
func BenchmarkThroughput(b *testing.B) {
	for _, partitions := range []int32{1, 4} {
		b.Run(fmt.Sprintf("end-to-end/partitions=%d", partitions), func(b *testing.B) { benchEndToEnd(b, partitions) })
		b.Run(fmt.Sprintf("engine-only/partitions=%d", partitions), func(b *testing.B) { benchEngineOnly(b, partitions) })
	}
}

// latencies pairs the time each record was fetched (returned by a poll) with the time the sink
// accepted it, by CloudEvents id.
type latencies struct {
	mu                sync.Mutex
	fetched, accepted map[string]time.Time
}

func newLatencies() *latencies {
	return &latencies{fetched: map[string]time.Time{}, accepted: map[string]time.Time{}}
}

// OnFetchRecordUnbuffered implements kgo.HookFetchRecordUnbuffered.
func (l *latencies) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if polled {
		l.mark(l.fetched, headerOf(r, "ce_id"))
	}
}

func (l *latencies) mark(m map[string]time.Time, id string) {
	now := time.Now()
	l.mu.Lock()
	if _, ok := m[id]; !ok {
		m[id] = now
	}
	l.mu.Unlock()
}

// report reports the 50th and 99th percentile of fetched → accepted in milliseconds.
func (l *latencies) report(b *testing.B) {
	l.mu.Lock()
	var ds []time.Duration
	for id, at := range l.accepted {
		if from, ok := l.fetched[id]; ok {
			ds = append(ds, at.Sub(from))
		}
	}
	l.mu.Unlock()
	if len(ds) == 0 {
		b.Fatal("no latency measured")
	}
	slices.Sort(ds)
	at := func(q float64) float64 { return float64(ds[int(q*float64(len(ds)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(at(0.50), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// noopSink accepts every request at once; with l it notes when it accepted each id.
func noopSink(b *testing.B, l *latencies) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l != nil {
			l.mark(l.accepted, r.Header.Get("ce-id"))
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

func benchRecords(partitions int32, n int) (string, []*kgo.Record) {
	run := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	recs := make([]*kgo.Record, n)
	for i := range n {
		order := fmt.Sprintf("%s-%d", run, i)
		recs[i] = event(int32(i)%partitions, "OrderCreated", order, order)
	}
	return run, recs
}

// runWritersSQL counts the distinct transactions that wrote the rows of a run (ids starting
// with $1): every row of this benchmark stays in its first version, so this is the number of
// writing transactions, and sessions of other processes on the same server do not add to it.
const runWritersSQL = `SELECT count(DISTINCT x) FROM (
  SELECT xmin::text AS x FROM sequence_instance WHERE context_id LIKE $1
  UNION ALL SELECT xmin::text FROM sequenced_message WHERE idempotence_id LIKE $1
  UNION ALL SELECT xmin::text FROM sequential_inbox_idempotence WHERE idempotence_id LIKE $1) w`

// reportCeiling measures single-row INSERT … ON CONFLICT DO NOTHING commits/s at the given
// concurrency on the benchmark's database, so that a run's throughput can be read next to what
// the machine allowed at that moment.
func reportCeiling(b *testing.B, pool *pgxpool.Pool, run string, concurrency int) {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_ceiling (k text PRIMARY KEY)`); err != nil {
		b.Fatal(err)
	}
	n := min(b.N, 2000)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range concurrency {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := pool.Exec(ctx, `INSERT INTO bench_ceiling (k) VALUES ($1) ON CONFLICT DO NOTHING`, fmt.Sprintf("%s-%d", run, i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "ceiling-commits/s")
}

func reportWriters(b *testing.B, pool *pgxpool.Pool, run string) {
	var n int64
	if err := pool.QueryRow(context.Background(), runWritersSQL, run+"-%").Scan(&n); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n)/float64(b.N), "writing-tx/msg")
}

func benchEndToEnd(b *testing.B, partitions int32) {
	pool := database(b)
	seeds := cluster(b, partitions)
	group := fmt.Sprintf("g-bench-%d", time.Now().UnixNano())
	var processed atomic.Int64
	lat := newLatencies()
	r := startConsumer(b, testInbox(b, seeds, group, noopSink(b, lat), sinkOpts{}), group, func(c *Config) {
		c.OnRecord = func(Event) { processed.Add(1) }
		c.Log = c.Log.V(1)
		c.hooks = []kgo.Hook{lat}
	})
	r.waitReady(b)
	run, recs := benchRecords(partitions, b.N)

	b.ResetTimer()
	testenv.Produce(b, seeds, recs...)
	waitUntil(b, "every record was processed", func() bool { return processed.Load() == int64(b.N) })
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	lat.report(b)
	reportWriters(b, pool, run)
	reportCeiling(b, pool, run, int(partitions))
}

func benchEngineOnly(b *testing.B, partitions int32) {
	database(b)
	inbox0 := testInbox(b, []string{"unused:9092"}, "unused", noopSink(b, nil), sinkOpts{})
	set, errs := declaration.Compile(&inbox0.Spec)
	if len(errs) > 0 {
		b.Fatal(errs.ToAggregate())
	}
	dec, err := decode.New(set)
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = inbox0.Spec.Database.PoolSize
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	listener, err := sink.New(sink.Config{URL: inbox0.Spec.Sink.URL, Timeout: 5 * time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer listener.Close()
	maintenance, err := newPool(context.Background(), dbURL, inbox.MaintenanceConnections, logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	defer maintenance.Close()
	engine, err := inbox.New(pool, set, listener, inbox.Config{ListenerDeadline: 5 * time.Second, IdleLockTimeout: 5 * time.Second,
		Maintenance: maintenance}, nil)
	if err != nil {
		b.Fatal(err)
	}
	byPartition := make([][]inbox.Record, partitions)
	_, recs := benchRecords(partitions, b.N)
	for _, r := range recs {
		rec, err := dec.Decode(r, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		byPartition[r.Partition] = append(byPartition[r.Partition], rec)
	}

	b.ResetTimer()
	var wg sync.WaitGroup
	for _, recs := range byPartition {
		wg.Go(func() {
			for _, rec := range recs {
				res, err := engine.Process(context.Background(), rec)
				if err != nil || res.Outcome != inbox.Delivered {
					b.Errorf("Process: %v %v", res.Outcome, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	reportCeiling(b, pool, fmt.Sprintf("engine-%d", time.Now().UnixNano()), int(partitions))
}
