package inbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/sequence"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// storageTables are the tables that hold a closed instance kept for its duplicates, and the name
// of each one's metric.
var storageTables = []string{"sequence_instance", "sequenced_message", "buffered_message", "sequential_inbox_idempotence"}

var storageMetric = map[string]string{"sequence_instance": "instance-B/msg", "sequenced_message": "message-B/msg",
	"buffered_message": "record-B/msg", "sequential_inbox_idempotence": "claim-B/msg"}

// tableSizesSQL reads pg_total_relation_size (heap, indexes, TOAST) of each table.
const tableSizesSQL = `SELECT t, pg_total_relation_size(t::regclass) FROM unnest($1::text[]) AS t`

// BenchmarkRetainedStorage measures what duplicate protection costs in storage: one op is one
// order (OrderCreated, OrderPaid after it, OrderShipped after that) processed in order through the
// engine on a database of its own, which closes the instance; the closed instance, its three
// messages, their raw records and their claims stay for the duplicate-protection window. The
// growth of pg_total_relation_size over the four tables, divided by the messages, is B/msg;
// the per-table figures show where it goes. Each record carries CloudEvents headers, a UUID
// idempotence ID and context ID, and a JSON payload of the size in the name.
func BenchmarkRetainedStorage(b *testing.B) {
	for _, payload := range []int{100, 1000} {
		b.Run(fmt.Sprintf("payload=%dB", payload), func(b *testing.B) {
			url := testenv.FreshDatabase(b, "inbox_storage")
			const workers = 4
			pool := newPool(b, url, 2*workers+1)
			set := sequence.NewSet([]*sequence.Sequence{{Name: "order", Retention: 168 * time.Hour, DuplicateProtection: 168 * time.Hour,
				Types: []*sequence.MessageType{
					mt("OrderCreated", "", nil),
					mt("OrderPaid", "", sequence.Predecessor("OrderCreated")),
					mt("OrderShipped", "", sequence.Predecessor("OrderPaid")),
				}}})
			e, err := New(pool, set, &noopListener{}, Config{ListenerDeadline: time.Minute, IdleLockTimeout: time.Minute,
				Maintenance: newPool(b, url, MaintenanceConnections)}, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			before := tableSizes(b, e)
			b.ResetTimer()
			_, err = runWorkers(workers, b.N, func(_, i int) error {
				order := uuidLike(i, 0)
				for n, typ := range []string{"OrderCreated", "OrderPaid", "OrderShipped"} {
					res, err := e.Process(ctx, storageRecord(typ, uuidLike(i, n+1), order, payload))
					if err == nil && res.Outcome != Delivered {
						err = fmt.Errorf("%s of order %d: %v", typ, i, res.Outcome)
					}
					if err != nil {
						return err
					}
				}
				return nil
			})
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			var closed int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM sequence_instance WHERE state = 'CLOSED' AND remove_after IS NOT NULL`).Scan(&closed); err != nil {
				b.Fatal(err)
			}
			if closed != b.N {
				b.Fatalf("closed instances kept = %d, want %d", closed, b.N)
			}
			after := tableSizes(b, e)
			messages := float64(3 * b.N)
			var total int64
			for _, t := range storageTables {
				total += after[t] - before[t]
				b.ReportMetric(float64(after[t]-before[t])/messages, storageMetric[t])
			}
			b.ReportMetric(float64(total)/messages, "B/msg")
		})
	}
}

// tableSizes reads the size of each storage table.
func tableSizes(b *testing.B, e *Engine) map[string]int64 {
	b.Helper()
	rows, err := e.pool.Query(context.Background(), tableSizesSQL, storageTables)
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	sizes := map[string]int64{}
	for rows.Next() {
		var (
			t string
			n int64
		)
		if err := rows.Scan(&t, &n); err != nil {
			b.Fatal(err)
		}
		sizes[t] = n
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return sizes
}

// uuidLike is a distinct 36-character id in the shape of a UUID, as producers send them.
func uuidLike(i, n int) string {
	return fmt.Sprintf("%08x-%04x-4000-8000-%012x", i, n, i*4+n)
}

// storageRecord is a CloudEvents record in binary mode with a JSON payload of about size bytes.
func storageRecord(typ, id, order string, size int) Record {
	head := `{"orderId":"` + order + `","note":"`
	pad := max(size-len(head)-2, 0)
	value := head + strings.Repeat("x", pad) + `"}`
	return Record{
		Type: typ, IdempotenceID: id, ContextID: order, Sequenced: true,
		Key: []byte(order), Value: []byte(value),
		Headers: []Header{
			{Key: "ce_specversion", Value: []byte("1.0")},
			{Key: "ce_id", Value: []byte(id)},
			{Key: "ce_type", Value: []byte(typ)},
			{Key: "ce_source", Value: []byte("/orders/service")},
			{Key: "ce_time", Value: []byte("2026-11-30T22:00:00Z")},
			{Key: "content-type", Value: []byte("application/json")},
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		},
		Origin: Origin{Topic: "orders", Partition: 3, Offset: 1234567, MessageID: id},
	}
}
