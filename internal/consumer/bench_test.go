package consumer

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/sink"
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

func noopSink(b *testing.B) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	b.Cleanup(srv.Close)
	return srv.URL
}

func benchRecords(partitions int32, n int) []*kgo.Record {
	nonce := time.Now().UnixNano()
	recs := make([]*kgo.Record, n)
	for i := range n {
		order := fmt.Sprintf("bench-%d-%d", nonce, i)
		recs[i] = event(int32(i)%partitions, "OrderCreated", order, order)
	}
	return recs
}

func benchEndToEnd(b *testing.B, partitions int32) {
	database(b)
	seeds := cluster(b, partitions)
	group := fmt.Sprintf("g-bench-%d", time.Now().UnixNano())
	var processed atomic.Int64
	r := startConsumer(b, testInbox(b, seeds, group, noopSink(b), sinkOpts{}), group, func(c *Config) {
		c.OnRecord = func(Event) { processed.Add(1) }
		c.Log = c.Log.V(1)
	})
	r.waitReady(b)
	recs := benchRecords(partitions, b.N)

	b.ResetTimer()
	produce(b, seeds, recs...)
	waitUntil(b, "every record was processed", func() bool { return processed.Load() == int64(b.N) })
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func benchEngineOnly(b *testing.B, partitions int32) {
	database(b)
	inbox0 := testInbox(b, []string{"unused:9092"}, "unused", noopSink(b), sinkOpts{})
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
	engine, err := inbox.New(pool, set, listener, inbox.Config{ListenerDeadline: 5 * time.Second, IdleLockTimeout: 5 * time.Second}, nil)
	if err != nil {
		b.Fatal(err)
	}
	byPartition := make([][]inbox.Record, partitions)
	for _, r := range benchRecords(partitions, b.N) {
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
}
