package inbox

import (
	"context"
	"fmt"
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

// xidNow reads the cluster's next transaction id: the difference of two readings counts the
// transactions that wrote (got an xid, so their commit flushes WAL), plus one for the reading.
// Other sessions on the same server add to it.
func xidNow(b *testing.B, pool *pgxpool.Pool) int64 {
	b.Helper()
	var x int64
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_xact_id()::text::bigint`).Scan(&x); err != nil {
		b.Fatal(err)
	}
	return x
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
}

var benchVariants = []benchVariant{
	// Each worker sends A messages to its own contexts, about ten to each; B never comes, so no
	// message completes its instance: the steady state of two commits per message, plus the
	// instance creation for one message in ten.
	{"steady", twoTypeSet, func(run string, w, i int) Record {
		return benchRecord("A", fmt.Sprintf("%s-%d", run, i), fmt.Sprintf("%s-w%d-%d", run, w, i/(10*int(benchWorkers.Load()))))
	}},
	// A then B on a new context per pair: the instance is created by A and closed by B.
	{"pairs", twoTypeSet, func(run string, _, i int) Record {
		typ := [2]string{"A", "B"}[i%2]
		return benchRecord(typ, fmt.Sprintf("%s-%d", run, i), fmt.Sprintf("%s-p%d", run, i/2))
	}},
	// One message per new context, which it completes: instance, claim, state, close.
	{"single", func() *sequence.Set { return sequence.NewSet([]*sequence.Sequence{seqOf("bench1", mt("S", "", nil))}) },
		func(run string, _, i int) Record {
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
// same concurrency on the same database. b.N messages and b.N ceiling inserts per round; ns/op
// covers both and is not the figure to read.
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

				// Engine and ceiling alternate in ten chunks each, so that load from other
				// processes on the machine weighs on both alike.
				var engine, ceiling time.Duration
				var writing int64
				b.ResetTimer()
				for from, chunk := 0, max(b.N/10, 1); from < b.N; from += chunk {
					n := min(chunk, b.N-from)
					x0 := xidNow(b, pool)
					d, err := runWorkers(workers, n, func(w, i int) error {
						res, err := e.Process(ctx, v.rec(run, w, from+i))
						// A pair's B may overtake its A on another worker and wait for it.
						if err == nil && res.Outcome != Delivered && res.Outcome != Buffered {
							err = fmt.Errorf("message %d: %v", from+i, res.Outcome)
						}
						return err
					})
					writing += xidNow(b, pool) - x0 - 1
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
				b.ReportMetric(rate/(ceilingRate/2), "of-half-ceiling")
				b.ReportMetric(float64(writing)/float64(b.N), "writing-tx/msg")
			})
		}
	}
}

// BenchmarkDuplicateStorm delivers 1,000 logical messages (500 contexts × A, B) 8 times each,
// the 8 copies of a message next to each other in the queue of 16 workers, so that they race.
// One op is one storm; exactly 1,000 listener calls per storm.
func BenchmarkDuplicateStorm(b *testing.B) {
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
		for i := range logical {
			rec := benchRecord([2]string{"A", "B"}[i%2], fmt.Sprintf("%s-%d", run, i), fmt.Sprintf("%s-c%d", run, i/2))
			for range copies {
				recs = append(recs, rec)
			}
		}
		before := l.calls.Load()
		if _, err := runWorkers(workers, len(recs), func(_, i int) error {
			_, err := e.Process(ctx, recs[i])
			return err
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
