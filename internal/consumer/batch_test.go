package consumer

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestRecordsWaitingBehindEachOtherGoToTheEngineAsOneBatch produces the messages of each order
// next to each other on one partition, so that a record waits for the one before it. Waiting
// records go to the engine together: claims share a claim transaction, every message reaches the
// sink once, each order in sequence order, and every offset is committed.
func TestRecordsWaitingBehindEachOtherGoToTheEngineAsOneBatch(t *testing.T) {
	pool := database(t)
	seeds := cluster(t, 1)
	s := newSink(t, func(string, int) int { return 200 })
	const orders = 40
	types := []string{"OrderCreated", "OrderPaid", "OrderShipped"}
	var recs []*kgo.Record
	for i := range orders {
		order := fmt.Sprintf("batch-o%d", i)
		for _, typ := range types {
			recs = append(recs, event(0, typ, order+"-"+typ, order))
		}
	}
	testenv.Produce(t, seeds, recs...)
	r := startConsumer(t, testInbox(t, seeds, "g-batch", s.srv.URL, sinkOpts{}), "batch-1")
	waitUntil(t, "every record was processed", func() bool {
		return r.events.count("Delivered")+r.events.count("Duplicate") == len(recs)
	})

	for id, n := range s.accepted() {
		if n != 1 {
			t.Errorf("%s accepted %d times, want once", id, n)
		}
	}
	for i := range orders {
		order := fmt.Sprintf("batch-o%d", i)
		if got := s.acceptedOrder(order); !slices.Equal(got, types) {
			t.Errorf("order %s reached the sink as %v, want %v", order, got, types)
		}
	}
	var claims, transactions int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT xmin::text) FROM sequential_inbox_idempotence WHERE idempotence_id LIKE 'batch-o%'`,
	).Scan(&claims, &transactions); err != nil {
		t.Fatal(err)
	}
	if claims != len(recs) || transactions >= claims {
		t.Fatalf("%d claims in %d claim transactions, want %d claims in fewer transactions (batches)", claims, transactions, len(recs))
	}
	t.Logf("%d claims in %d claim transactions", claims, transactions)
	waitUntil(t, "every offset is committed", func() bool { return committedLag(t, seeds, "g-batch")[0] == 0 })
}
