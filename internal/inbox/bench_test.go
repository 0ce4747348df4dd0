package inbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// noopListener accepts everything at once and counts the calls.
type noopListener struct{ calls atomic.Int64 }

func (l *noopListener) Deliver(context.Context, Message) error {
	l.calls.Add(1)
	return nil
}

// runWorkers runs op for i in [0, n) on the given number of workers and returns the wall time.
func runWorkers(workers, n int, op func(worker, i int) error) (time.Duration, error) {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		firstErr error
		errOnce  sync.Once
	)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := op(w, i); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// runWritersSQL counts the distinct transactions that wrote the rows of a run which are still
// in their first version: the writing transactions per message of the steady variant, where no
// row is updated or deleted later. Unlike the cluster's transaction id counter it does not count
// the sessions of other processes on the same server.
const runWritersSQL = `SELECT count(DISTINCT x) FROM (
  SELECT xmin::text AS x FROM sequence_instance WHERE context_id LIKE $1
  UNION ALL SELECT xmin::text FROM sequenced_message WHERE idempotence_id LIKE $1
  UNION ALL SELECT xmin::text FROM sequential_inbox_idempotence WHERE idempotence_id LIKE $1
  UNION ALL SELECT b.xmin::text FROM buffered_message b JOIN sequenced_message m ON m.id = b.sequenced_message_id
    WHERE m.idempotence_id LIKE $1) w`

// runWriters reads runWritersSQL for the rows whose ids start with run.
func runWriters(b *testing.B, pool *pgxpool.Pool, run string) int64 {
	b.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), runWritersSQL, run+"-%").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// reportLatency reports the 50th and 99th percentile of the latencies in milliseconds.
func reportLatency(b *testing.B, latencies []time.Duration) {
	b.Helper()
	slices.Sort(latencies)
	at := func(q float64) float64 {
		return float64(latencies[int(q*float64(len(latencies)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

var (
	benchRun atomic.Int64
	// benchWorkers is the concurrency of the running throughput benchmark.
	benchWorkers atomic.Int64
)

// benchVariant produces the record of message i of a worker.
type benchVariant struct {
	name string
	set  func() *sequence.Set
	rec  func(run string, worker, i int) Record
	// batch > 1 hands each worker that many consecutive messages at once (ProcessBatch), as a
	// partition's queue holds several records.
	batch int
}

// steadyRecord is a message of the steady variants.
func steadyRecord(run string, w, i int) Record {
	return benchRecord("A", fmt.Sprintf("%s-%d", run, i), fmt.Sprintf("%s-w%d-%d", run, w, i/(10*int(benchWorkers.Load()))))
}

var benchVariants = []benchVariant{
	// Each worker sends A messages to its own contexts, about ten to each; B never comes, so no
	// message completes its instance: the steady state of two commits per message, plus the
	// instance creation for one message in ten.
	{name: "steady", set: twoTypeSet, rec: steadyRecord},
	// steady, 16 consecutive messages per ProcessBatch call.
	{name: "steady-batch16", set: twoTypeSet, rec: steadyRecord, batch: 16},
	// A then B on a new context per pair: the instance is created by A and closed by B.
	{name: "pairs", set: twoTypeSet, rec: func(run string, _, i int) Record {
		typ := [2]string{"A", "B"}[i%2]
		return benchRecord(typ, fmt.Sprintf("%s-%d", run, i), fmt.Sprintf("%s-p%d", run, i/2))
	}},
	// One message per new context, which it completes: instance, claim, state, close.
	{name: "single", set: func() *sequence.Set { return sequence.NewSet([]*sequence.Sequence{seqOf("bench1", mt("S", "", nil))}) },
		rec: func(run string, _, i int) Record {
			return benchRecord("S", fmt.Sprintf("%s-%d", run, i), fmt.Sprintf("%s-s%d", run, i))
		}},
}

func twoTypeSet() *sequence.Set {
	return sequence.NewSet([]*sequence.Sequence{seqOf("bench2", mt("A", "", nil), mt("B", "", sequence.Predecessor("A")))})
}

func benchRecord(typ, id, contextID string) Record {
	return Record{
		Type: typ, IdempotenceID: id, ContextID: contextID, Sequenced: true,
		Key: []byte(contextID), Value: []byte(`{"orderId":"` + contextID + `","amount":42}`),
		Headers: []Header{{Key: "ce_type", Value: []byte(typ)}, {Key: "ce_id", Value: []byte(id)}},
		Origin:  Origin{Topic: "bench", Partition: 0, Offset: 1, MessageID: id},
	}
}

const ceilingTableSQL = `CREATE TABLE IF NOT EXISTS bench_ceiling (k text PRIMARY KEY)`
const ceilingInsertSQL = `INSERT INTO bench_ceiling (k) VALUES ($1) ON CONFLICT DO NOTHING`

// BenchmarkThroughput measures engine messages/s with a no-op listener on distinct contexts, and
// in the same run the raw ceiling: single-row INSERT … ON CONFLICT DO NOTHING commits/s at the
// same concurrency on the same database, and of-ceiling, the one divided by the other. b.N
// messages and b.N ceiling inserts per round; ns/op covers both and is not the figure to read.
func BenchmarkThroughput(b *testing.B) {
	for _, workers := range []int{1, 4, 16} {
		for _, v := range benchVariants {
			b.Run(fmt.Sprintf("workers=%d/%s", workers, v.name), func(b *testing.B) {
				benchWorkers.Store(int64(workers))
				pool := newPool(b, dbURL, int32(2*workers+1))
				if _, err := pool.Exec(context.Background(), ceilingTableSQL); err != nil {
					b.Fatal(err)
				}
				l := &noopListener{}
				e, err := New(pool, v.set(), l, Config{ListenerDeadline: time.Minute, IdleLockTimeout: time.Minute,
					Maintenance: newPool(b, dbURL, MaintenanceConnections)}, nil)
				if err != nil {
					b.Fatal(err)
				}
				run := fmt.Sprintf("r%d-%d", benchRun.Add(1), time.Now().UnixNano())
				ctx := context.Background()

				// Engine and ceiling alternate in about ten chunks each, so that load from other
				// processes on the machine weighs on both alike. A chunk is a whole number of
				// rounds of batches on all workers, so that no worker idles behind a last batch.
				var engine, ceiling time.Duration
				latencies := make([]time.Duration, b.N)
				round := workers * max(v.batch, 1)
				chunk := (max(b.N/10, 1) + round - 1) / round * round
				b.ResetTimer()
				for from := 0; from < b.N; from += chunk {
					n := min(chunk, b.N-from)
					batch := max(v.batch, 1)
					d, err := runWorkers(workers, (n+batch-1)/batch, func(w, j int) error {
						first := from + j*batch
						recs := make([]Record, 0, batch)
						for i := first; i < min(first+batch, from+n); i++ {
							recs = append(recs, v.rec(run, w, i))
						}
						start := time.Now()
						for done := 0; done < len(recs); {
							var res []Result
							var err error
							if v.batch > 1 {
								res, err = e.ProcessBatch(ctx, recs[done:])
							} else {
								var r Result
								r, err = e.Process(ctx, recs[done])
								res = []Result{r}
							}
							if err != nil {
								return err
							}
							for _, r := range res {
								latencies[first+done] = time.Since(start)
								// A pair's B may overtake its A on another worker and wait for it.
								if r.Outcome != Delivered && r.Outcome != Buffered {
									return fmt.Errorf("message %d: %v", first+done, r.Outcome)
								}
								done++
							}
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
					engine += d
					d, err = runWorkers(workers, n, func(_, i int) error {
						_, err := pool.Exec(ctx, ceilingInsertSQL, fmt.Sprintf("%s-%d", run, from+i))
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					ceiling += d
				}
				b.StopTimer()

				if got := l.calls.Load(); got != int64(b.N) {
					b.Fatalf("listener calls = %d, want %d", got, b.N)
				}
				rate, ceilingRate := float64(b.N)/engine.Seconds(), float64(b.N)/ceiling.Seconds()
				b.ReportMetric(rate, "msgs/s")
				b.ReportMetric(ceilingRate, "ceiling-commits/s")
				b.ReportMetric(rate/ceilingRate, "of-ceiling")
				if strings.HasPrefix(v.name, "steady") {
					b.ReportMetric(float64(runWriters(b, pool, run))/float64(b.N), "writing-tx/msg")
				}
				reportLatency(b, latencies)
			})
		}
	}
}

// BenchmarkDuplicateStorm delivers 1,000 logical messages (500 contexts × A, B) 8 times each to
// 16 workers, so that the copies race. single: one record per Process call, the 8 copies of a
// message next to each other in the queue. batch16: 16 records per ProcessBatch call, each group
// of 16 messages 8 times in a row, every other time in the opposite order, so that 8 batches of
// the same messages race. One op is one storm; exactly 1,000 listener calls per storm.
func BenchmarkDuplicateStorm(b *testing.B) {
	for _, batch := range []int{1, 16} {
		name := "single"
		if batch > 1 {
			name = fmt.Sprintf("batch%d", batch)
		}
		b.Run(name, func(b *testing.B) { duplicateStorm(b, batch) })
	}
}

func duplicateStorm(b *testing.B, batch int) {
	const logical, copies, workers = 1000, 8, 16
	pool := newPool(b, dbURL, 2*workers+1)
	l := &noopListener{}
	e, err := New(pool, twoTypeSet(), l, Config{ListenerDeadline: time.Minute, IdleLockTimeout: time.Minute,
		Maintenance: newPool(b, dbURL, MaintenanceConnections)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		run := fmt.Sprintf("storm%d-%d", benchRun.Add(1), time.Now().UnixNano())
		recs := make([]Record, 0, logical*copies)
		for first := 0; first < logical; first += batch {
			group := make([]Record, 0, batch)
			for i := first; i < min(first+batch, logical); i++ {
				group = append(group, benchRecord([2]string{"A", "B"}[i%2], fmt.Sprintf("%s-%d", run, i), fmt.Sprintf("%s-c%d", run, i/2)))
			}
			for c := range copies {
				for k := range group {
					if c%2 == 1 {
						k = len(group) - 1 - k
					}
					recs = append(recs, group[k])
				}
			}
		}
		before := l.calls.Load()
		if _, err := runWorkers(workers, (len(recs)+batch-1)/batch, func(_, j int) error {
			chunk := recs[j*batch : min((j+1)*batch, len(recs))]
			if batch == 1 {
				_, err := e.Process(ctx, chunk[0])
				return err
			}
			for len(chunk) > 0 {
				res, err := e.ProcessBatch(ctx, chunk)
				if err != nil {
					return err
				}
				chunk = chunk[len(res):]
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		if got := l.calls.Load() - before; got != logical {
			b.Fatalf("listener calls = %d, want exactly %d", got, logical)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(logical*copies*b.N)/b.Elapsed().Seconds(), "deliveries/s")
}
