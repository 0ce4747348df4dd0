package fence_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

// readiness is one onChange call of Fence.Run.
type readiness struct {
	ready  bool
	reason string
}

// running is a Fence.Run in the background; err is Run's result once done is closed.
type running struct {
	changes chan readiness
	stop    context.CancelFunc
	done    chan struct{}
	err     error
}

func startRun(t *testing.T, f *fence.Fence) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{changes: make(chan readiness, 100), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = f.Run(ctx, func(ready bool, reason string) { r.changes <- readiness{ready, reason} })
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// next returns the next readiness change, failing the test if none comes.
func (r *running) next(t *testing.T) readiness {
	t.Helper()
	select {
	case c := <-r.changes:
		return c
	case <-time.After(30 * time.Second):
		t.Fatal("no readiness change")
		return readiness{}
	}
}

// noChange asserts that the loop, having finished a pass (it waits on the clock again), reported
// nothing new.
func (r *running) noChange(t *testing.T, clock *manualClock) {
	t.Helper()
	clock.awaitWaiter(t)
	select {
	case c := <-r.changes:
		t.Fatalf("unexpected readiness change %+v", c)
	default:
	}
}

func registryRows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM consumer_registry`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRunIsReadyAloneNotReadyNextToAnotherProtocolAndDeregistersOnExit(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	clock := newManualClock()
	f := newFence(t, pool, identity("a", "orders", "proto-a"), clock)
	r := startRun(t, f)

	if c := r.next(t); !c.ready {
		t.Fatalf("first readiness = %+v, want ready: schema current, nobody else", c)
	}
	other := registered(t, pool, identity("b", "orders", "proto-b"))
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	c := r.next(t)
	if c.ready || !strings.Contains(c.reason, "b (group orders, claim protocol proto-b, engine v-proto-b)") {
		t.Fatalf("readiness next to b = %+v, want not ready naming b", c)
	}
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	r.noChange(t, clock)

	if err := other.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	if c := r.next(t); !c.ready {
		t.Fatalf("readiness after b left = %+v, want ready", c)
	}

	r.stop()
	<-r.done
	if r.err != nil {
		t.Fatalf("Run returned %v, want nil on cancellation", r.err)
	}
	if c := r.next(t); c.ready {
		t.Fatalf("last readiness = %+v, want not ready when stopping", c)
	}
	if n := registryRows(t, pool); n != 0 {
		t.Fatalf("%d registry rows after Run returned, want 0: it deregisters", n)
	}
}

func TestRunIsNotReadyOnAnOlderSchemaUntilItIsMigrated(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, migrations.Latest()-1)
	clock := newManualClock()
	r := startRun(t, newFence(t, pool, identity("a", "orders", "proto-a"), clock))

	c := r.next(t)
	if c.ready || !strings.Contains(c.reason, "older than version") || !strings.Contains(c.reason, "seqinbox migrate") {
		t.Fatalf("readiness on an older schema = %+v, want not ready telling to run seqinbox migrate", c)
	}
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	r.noChange(t, clock)

	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	if c := r.next(t); !c.ready {
		t.Fatalf("readiness after migration = %+v, want ready", c)
	}
	if n := registryRows(t, pool); n != 1 {
		t.Fatalf("%d registry rows, want this consumer's one", n)
	}
}

func TestRunTurnsNotReadyWhenItsOwnHeartbeatsKeepFailing(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	clock := newManualClock()
	r := startRun(t, newFence(t, pool, identity("a", "orders", "proto-a"), clock))
	if c := r.next(t); !c.ready {
		t.Fatalf("first readiness = %+v, want ready", c)
	}

	// From now on every heartbeat fails inside the database; reads still work.
	_, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_heartbeat() RETURNS trigger LANGUAGE plpgsql AS
		  $$BEGIN RAISE EXCEPTION 'heartbeat refused by test'; END$$;
		CREATE TRIGGER refuse_heartbeat BEFORE INSERT OR UPDATE ON consumer_registry
		  FOR EACH ROW EXECUTE FUNCTION refuse_heartbeat();`)
	if err != nil {
		t.Fatal(err)
	}
	// One missed heartbeat: the last success is one interval old, others still see this consumer.
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	r.noChange(t, clock)
	// Two missed: the last success is window minus interval old; stop before others see it gone.
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	c := r.next(t)
	if c.ready || !strings.Contains(c.reason, "no successful heartbeat for 20s") || !strings.Contains(c.reason, "heartbeat refused by test") {
		t.Fatalf("readiness after failed heartbeats = %+v, want not ready naming the silence and the error", c)
	}

	if _, err := pool.Exec(ctx, `DROP TRIGGER refuse_heartbeat ON consumer_registry`); err != nil {
		t.Fatal(err)
	}
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	if c := r.next(t); !c.ready {
		t.Fatalf("readiness after heartbeats recovered = %+v, want ready", c)
	}
}

func TestRunKeepsReadinessThroughFailedReadsWithinTheLivenessWindow(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	clock := newManualClock()
	r := startRun(t, newFence(t, pool, identity("a", "orders", "proto-a"), clock))
	if c := r.next(t); !c.ready {
		t.Fatalf("first readiness = %+v, want ready", c)
	}

	// From now on every read of the schema ledger fails inside the database, as a lost or slow
	// connection would make it fail; heartbeats are never reached, so they stop too.
	_, err := pool.Exec(ctx, `
		ALTER TABLE `+migrations.LedgerTable+` RENAME TO ledger_hidden;
		CREATE FUNCTION refuse_read() RETURNS boolean LANGUAGE plpgsql AS
		  $$BEGIN RAISE EXCEPTION 'read refused by test'; END$$;
		CREATE VIEW `+migrations.LedgerTable+` AS SELECT * FROM ledger_hidden WHERE refuse_read();`)
	if err != nil {
		t.Fatal(err)
	}
	// One failed pass: the last heartbeat is one interval old; the consumer keeps processing.
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	r.noChange(t, clock)
	// Two: the last heartbeat is window minus interval old; stop before others take it for gone.
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	c := r.next(t)
	if c.ready || !strings.Contains(c.reason, "read refused by test") {
		t.Fatalf("readiness after failed reads = %+v, want not ready naming the error", c)
	}

	_, err = pool.Exec(ctx, `
		DROP VIEW `+migrations.LedgerTable+`;
		ALTER TABLE ledger_hidden RENAME TO `+migrations.LedgerTable)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	if c := r.next(t); !c.ready {
		t.Fatalf("readiness after reads recovered = %+v, want ready", c)
	}
}

// TestRunRefusesTablesOwnedByAnotherInboxAndClaimsUnownedOnes: a consumer of an inbox on tables
// no inbox owns records its inbox and runs; a consumer of another inbox on the same tables never
// becomes ready and says whose tables they are, and does not register next to the owner's.
func TestRunRefusesTablesOwnedByAnotherInboxAndClaimsUnownedOnes(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	clock := newManualClock()
	owner := identity("orders-0", "orders", "proto-a")
	owner.Inbox = "shop/orders"
	r := startRun(t, newFence(t, pool, owner, clock))
	if c := r.next(t); !c.ready {
		t.Fatalf("readiness of the first inbox's consumer = %+v, want ready", c)
	}
	if got, _, _, err := migrations.Owner(ctx, pool); err != nil || got != "shop/orders" {
		t.Fatalf("owner = %q, %v; want the consumer's inbox shop/orders recorded", got, err)
	}

	otherClock := newManualClock()
	intruder := identity("invoices-0", "invoices", "proto-a")
	intruder.Inbox = "billing/invoices"
	other := startRun(t, newFence(t, pool, intruder, otherClock))
	c := other.next(t)
	if c.ready || !strings.Contains(c.reason, "belong to inbox shop/orders") || !strings.Contains(c.reason, "billing/invoices") {
		t.Fatalf("readiness of another inbox's consumer = %+v, want not ready naming shop/orders", c)
	}
	otherClock.Advance(t, fence.DefaultHeartbeatInterval)
	other.noChange(t, otherClock)
	if n := registryRows(t, pool); n != 1 {
		t.Fatalf("%d registry rows, want only the owner's consumer", n)
	}
	clock.Advance(t, fence.DefaultHeartbeatInterval)
	r.noChange(t, clock)
}

// errorLog is a logger that keeps the messages of its Error calls.
type errorLog struct {
	mu     sync.Mutex
	errors []string
}

func (l *errorLog) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"error"`) || strings.Contains(args, "failed") {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.errors = append(l.errors, args)
		}
	}, funcr.Options{})
}

func (l *errorLog) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errors {
		if strings.Contains(e, s) {
			return true
		}
	}
	return false
}

// TestAConsumerThatNeverRegisteredStopsWithoutADeregisterError stops fences that could not
// register (a database without the schema, and one that cannot be reached): a clean stop logs no
// "deregister failed" for a row that was never written.
func TestAConsumerThatNeverRegisteredStopsWithoutADeregisterError(t *testing.T) {
	for name, url := range map[string]string{
		"unmigrated":  testenv.FreshDatabase(t, "fence_unmigrated"),
		"unreachable": "postgres://seqinbox@127.0.0.1:1/none?connect_timeout=1",
	} {
		t.Run(name, func(t *testing.T) {
			pool, err := pgxpool.New(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			var log errorLog
			clock := newManualClock()
			f, err := fence.New(pool, identity("never", "orders", "proto-a"), fence.Config{Clock: clock, Log: log.logger()})
			if err != nil {
				t.Fatal(err)
			}
			r := startRun(t, f)
			if c := r.next(t); c.ready {
				t.Fatalf("first readiness = %+v, want not ready", c)
			}
			clock.awaitWaiter(t)
			r.stop()
			<-r.done
			if log.has("deregister failed") {
				t.Fatalf("a stop before any registration logged %v", log.errors)
			}
		})
	}
}

// TestRunIsNotReadyWhileTheConnectionResolvesTablesToAnotherSchema runs the fence of a consumer
// whose inbox names schema inbox_a on a database whose tables are in public: it is not ready,
// saying which schema it found and how to set the right one, and registers nowhere.
func TestRunIsNotReadyWhileTheConnectionResolvesTablesToAnotherSchema(t *testing.T) {
	pool := migratedDatabase(t, 0)
	id := identity("a", "orders", "proto-a")
	id.Schema = "inbox_a"
	r := startRun(t, newFence(t, pool, id, newManualClock()))
	c := r.next(t)
	if c.ready || !strings.Contains(c.reason, `"public"`) || !strings.Contains(c.reason, `"inbox_a"`) || !strings.Contains(c.reason, "search_path") {
		t.Fatalf("readiness = %+v; want not ready, naming public, inbox_a and search_path", c)
	}
	if n := registryRows(t, pool); n != 0 {
		t.Fatalf("%d registry rows, want none for a consumer on the wrong schema", n)
	}
}
