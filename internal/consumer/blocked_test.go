package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// outOfResources makes PostgreSQL refuse the claim of one idempotence ID with SQLSTATE 53000
// (insufficient_resources), an infrastructure error: the record is retried, not dead-lettered.
// The returned function lifts the refusal; the test's end lifts it too.
func outOfResources(t *testing.T, pool *pgxpool.Pool, idempotenceID string) (lift func()) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
CREATE OR REPLACE FUNCTION test_out_of_resources() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'test: the database is out of resources' USING ERRCODE = '53000'; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TRIGGER test_out_of_resources BEFORE INSERT ON sequential_inbox_idempotence
FOR EACH ROW WHEN (NEW.idempotence_id = '`+idempotenceID+`') EXECUTE FUNCTION test_out_of_resources()`); err != nil {
		t.Fatal(err)
	}
	lift = func() {
		if _, err := pool.Exec(ctx, `DROP TRIGGER IF EXISTS test_out_of_resources ON sequential_inbox_idempotence`); err != nil {
			t.Errorf("drop trigger: %v", err)
		}
	}
	t.Cleanup(lift)
	return lift
}

// registryBlocked reads the consumer's blocked record from its registry row as the operator's
// dry run does (fence.LiveConsumers); nil when the row names none. The consumer must be live.
func registryBlocked(t *testing.T, pool *pgxpool.Pool, instance string) *fence.Blocked {
	t.Helper()
	live, err := fence.LiveConsumers(context.Background(), pool, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range live {
		if c.InstanceID == instance {
			return c.Blocked
		}
	}
	t.Fatalf("consumer %s is not live in the registry: %+v", instance, live)
	return nil
}

func TestRecordRetriedAfterAnInfrastructureErrorShowsInTheGaugesAndTheRegistryUntilItIsDelivered(t *testing.T) {
	pool := database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	lift := outOfResources(t, pool, "blk-stuck")
	r := startConsumer(t, testInbox(t, seeds, "g-blocked", s.srv.URL, sinkOpts{}), "blocked-1")
	// Offset 0 is refused by the database; offset 1, of another order and key, runs meanwhile.
	testenv.Produce(t, seeds, event(0, "OrderCreated", "blk-stuck", "blk-o1"), event(0, "OrderCreated", "blk-other", "blk-o2"))

	waitUntil(t, "the refused record is retried and the other one delivered", func() bool {
		return gauge(t, r.c, "seqinbox_record_retries_total", "cause", "Infrastructure") >= 2 && s.accepted()["blk-other"] == 1
	})
	if got := gauge(t, r.c, "seqinbox_partition_blocked_offset", "partition", "0"); got != 0 {
		t.Fatalf("seqinbox_partition_blocked_offset{partition=0} = %v, want 0 (the refused record)", got)
	}
	waitUntil(t, "the blocked record ages", func() bool {
		return gauge(t, r.c, "seqinbox_partition_blocked_seconds", "partition", "0") > 0
	})
	waitUntil(t, "the registry row names the blocked record", func() bool { return registryBlocked(t, pool, "blocked-1") != nil })
	b := registryBlocked(t, pool, "blocked-1")
	if b.Topic != "orders" || b.Partition != 0 || b.Offset != 0 || !strings.Contains(b.Error, "out of resources") || b.Since.IsZero() {
		t.Fatalf("registry names %+v, want orders[0] offset 0 with the database's error", b)
	}
	if n := s.accepted()["blk-stuck"]; n != 0 {
		t.Fatalf("the refused record reached the sink %d times", n)
	}

	lift()
	waitUntil(t, "the record is delivered after the database recovered", func() bool { return s.accepted()["blk-stuck"] == 1 })
	waitUntil(t, "the gauges drop the partition", func() bool {
		return gauge(t, r.c, "seqinbox_partition_blocked_offset", "", "") == -1 &&
			gauge(t, r.c, "seqinbox_partition_blocked_seconds", "", "") == -1
	})
	waitUntil(t, "the registry row names no blocked record", func() bool { return registryBlocked(t, pool, "blocked-1") == nil })
	if n := r.events.count("DeadLettered"); n != 0 {
		t.Fatalf("%d records dead-lettered; an infrastructure error must be retried", n)
	}
}
