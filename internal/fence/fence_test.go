package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/migrations"
)

func identity(instance, group, protocol string) fence.Identity {
	return fence.Identity{InstanceID: instance, ConsumerGroup: group, EngineVersion: "v-" + protocol, ClaimProtocol: protocol}
}

func newFence(t *testing.T, pool *pgxpool.Pool, id fence.Identity, clk clock.Clock) *fence.Fence {
	t.Helper()
	f, err := fence.New(pool, id, fence.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func registered(t *testing.T, pool *pgxpool.Pool, id fence.Identity) *fence.Fence {
	t.Helper()
	f := newFence(t, pool, id, nil)
	if err := f.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f
}

func instances(cs []fence.Consumer) []string {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.InstanceID
	}
	return ids
}

func conflicts(t *testing.T, f *fence.Fence) []string {
	t.Helper()
	cs, err := f.Conflicts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return instances(cs)
}

// ageHeartbeat moves a consumer's heartbeat into the past by the database clock.
func ageHeartbeat(t *testing.T, pool *pgxpool.Pool, instance string, age time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(),
		`UPDATE consumer_registry SET heartbeat_at = now() - $2 * interval '1 microsecond' WHERE instance_id = $1`,
		instance, age.Microseconds())
	if err != nil {
		t.Fatal(err)
	}
}

func TestLiveConsumerOfAnotherProtocolInTheSameGroupConflictsBothWays(t *testing.T) {
	pool := migratedDatabase(t, 0)
	a := registered(t, pool, identity("a", "orders", "proto-a"))
	b := registered(t, pool, identity("b", "orders", "proto-b"))
	registered(t, pool, identity("a2", "orders", "proto-a"))

	cs, err := a.Conflicts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Identity != identity("b", "orders", "proto-b") {
		t.Fatalf("conflicts of a = %+v, want exactly b with its identity (not a2, which speaks a's protocol)", cs)
	}
	if cs[0].HeartbeatAt.IsZero() || cs[0].StartedAt.IsZero() {
		t.Fatalf("conflict %+v lacks its timestamps", cs[0])
	}
	if got := conflicts(t, b); len(got) != 2 || got[0] != "a" || got[1] != "a2" {
		t.Fatalf("conflicts of b = %v, want [a a2]", got)
	}
}

func TestConsumerOfAnotherGroupDoesNotConflict(t *testing.T) {
	pool := migratedDatabase(t, 0)
	a := registered(t, pool, identity("a", "orders", "proto-a"))
	registered(t, pool, identity("b", "payments", "proto-b"))

	if got := conflicts(t, a); len(got) != 0 {
		t.Fatalf("conflicts of a = %v, want none: b consumes another group", got)
	}
}

func TestStaleHeartbeatDoesNotConflictButOneInsideTheWindowDoes(t *testing.T) {
	pool := migratedDatabase(t, 0)
	a := registered(t, pool, identity("a", "orders", "proto-a"))
	registered(t, pool, identity("stale", "orders", "proto-b"))
	registered(t, pool, identity("recent", "orders", "proto-b"))
	ageHeartbeat(t, pool, "stale", fence.DefaultLivenessWindow+time.Second)
	ageHeartbeat(t, pool, "recent", fence.DefaultLivenessWindow-5*time.Second)

	if got := conflicts(t, a); len(got) != 1 || got[0] != "recent" {
		t.Fatalf("conflicts of a = %v, want only the consumer inside the liveness window", got)
	}
	live, err := fence.LiveConsumers(context.Background(), pool, fence.DefaultLivenessWindow)
	if err != nil {
		t.Fatal(err)
	}
	if got := instances(live); len(got) != 2 || got[0] != "a" || got[1] != "recent" {
		t.Fatalf("live consumers = %v, want [a recent] without the stale one", got)
	}
}

func TestDeregistrationClearsTheConflict(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	a := registered(t, pool, identity("a", "orders", "proto-a"))
	b := registered(t, pool, identity("b", "orders", "proto-b"))
	if got := conflicts(t, a); len(got) != 1 {
		t.Fatalf("conflicts before deregistration = %v, want b", got)
	}

	if err := b.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	if got := conflicts(t, a); len(got) != 0 {
		t.Fatalf("conflicts after deregistration = %v, want none", got)
	}
}

func TestHeartbeatRegistersAgainAfterTheRowWasDeleted(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	a := registered(t, pool, identity("a", "orders", "proto-a"))
	b := registered(t, pool, identity("b", "orders", "proto-b"))
	if _, err := pool.Exec(ctx, `DELETE FROM consumer_registry WHERE instance_id = 'b'`); err != nil {
		t.Fatal(err)
	}

	if err := b.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if got := conflicts(t, a); len(got) != 1 || got[0] != "b" {
		t.Fatalf("conflicts after b's heartbeat = %v, want b registered again", got)
	}
}

func TestRegisterDeletesRowsStaleForLong(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	registered(t, pool, identity("old", "orders", "proto-a"))
	registered(t, pool, identity("recent", "orders", "proto-a"))
	ageHeartbeat(t, pool, "old", 2*time.Hour)
	ageHeartbeat(t, pool, "recent", time.Minute)

	registered(t, pool, identity("new", "orders", "proto-a"))

	var ids []string
	rows, err := pool.Query(ctx, `SELECT instance_id FROM consumer_registry ORDER BY instance_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if rows.Err() != nil || len(ids) != 2 || ids[0] != "new" || ids[1] != "recent" {
		t.Fatalf("rows = %v (%v), want [new recent]: only the long-stale row deleted", ids, rows.Err())
	}
}

func TestRacingRegistrationsDoNotError(t *testing.T) {
	const racers = 8
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	for iteration := range 20 {
		start := make(chan struct{})
		errs := make([]error, 2*racers)
		var wg sync.WaitGroup
		for i := range racers {
			same := newFence(t, pool, identity("same", "orders", "proto-a"), nil)
			own := newFence(t, pool, identity("own-"+string(rune('a'+i)), "orders", "proto-a"), nil)
			wg.Go(func() { <-start; errs[2*i] = same.Register(ctx) })
			wg.Go(func() { <-start; errs[2*i+1] = own.Register(ctx) })
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("iteration %d: %v", iteration, err)
		}
		live, err := fence.LiveConsumers(ctx, pool, fence.DefaultLivenessWindow)
		if err != nil {
			t.Fatal(err)
		}
		if len(live) != racers+1 {
			t.Fatalf("iteration %d: %d rows, want %d (one per instance ID)", iteration, len(live), racers+1)
		}
	}
}

func TestRacingRegistrationsOfDifferentProtocolsNeverBothMissEachOther(t *testing.T) {
	ctx := context.Background()
	pool := migratedDatabase(t, 0)
	a := newFence(t, pool, identity("a", "orders", "proto-a"), nil)
	b := newFence(t, pool, identity("b", "orders", "proto-b"), nil)
	registerThenCheck := func(f *fence.Fence, start <-chan struct{}, seen *int, err *error) {
		<-start
		if *err = f.Register(ctx); *err != nil {
			return
		}
		var cs []fence.Consumer
		cs, *err = f.Conflicts(ctx)
		*seen = len(cs)
	}
	for iteration := range 100 {
		start := make(chan struct{})
		var seenA, seenB int
		var errA, errB error
		var wg sync.WaitGroup
		wg.Go(func() { registerThenCheck(a, start, &seenA, &errA) })
		wg.Go(func() { registerThenCheck(b, start, &seenB, &errB) })
		close(start)
		wg.Wait()
		if errA != nil || errB != nil {
			t.Fatalf("iteration %d: %v, %v", iteration, errA, errB)
		}
		if seenA == 0 && seenB == 0 {
			t.Fatalf("iteration %d: both consumers registered and neither saw the other: both would process", iteration)
		}
		if err := errors.Join(a.Deregister(ctx), b.Deregister(ctx)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCheckSchema(t *testing.T) {
	ctx := context.Background()
	current := migratedDatabase(t, 0)
	older := migratedDatabase(t, migrations.Latest()-1)
	newer := migratedDatabase(t, 0)
	if _, err := newer.Exec(ctx, `INSERT INTO `+migrations.LedgerTable+` (version, name, checksum) VALUES ($1, '9999_future.sql', 'x')`,
		migrations.Latest()+1); err != nil {
		t.Fatal(err)
	}

	if v, err := fence.CheckSchema(ctx, current); err != nil || v != migrations.Latest() {
		t.Fatalf("current schema: %d, %v; want %d, no error", v, err, migrations.Latest())
	}
	_, err := fence.CheckSchema(ctx, older)
	if !errors.Is(err, fence.ErrSchemaOlder) {
		t.Fatalf("older schema: %v, want ErrSchemaOlder", err)
	}
	for _, want := range []string{fmt.Sprintf("version %d is older than version %d", migrations.Latest()-1, migrations.Latest()), "run `seqinbox migrate`"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("older schema error %q does not say %q", err, want)
		}
	}
	if _, err := fence.CheckSchema(ctx, newer); !errors.Is(err, migrations.ErrSchemaNewer) || errors.Is(err, fence.ErrSchemaOlder) {
		t.Fatalf("newer schema: %v, want ErrSchemaNewer only", err)
	}
}

func TestNewRejectsIncompleteIdentityAndWindowNotAboveInterval(t *testing.T) {
	tests := []struct {
		name string
		id   fence.Identity
		cfg  fence.Config
		ok   bool
	}{
		{"defaults", identity("a", "g", "p"), fence.Config{}, true},
		{"no instance", identity("", "g", "p"), fence.Config{}, false},
		{"no group", identity("a", "", "p"), fence.Config{}, false},
		{"no protocol", identity("a", "g", ""), fence.Config{}, false},
		{"window equals interval", identity("a", "g", "p"), fence.Config{HeartbeatInterval: time.Second, LivenessWindow: time.Second}, false},
		{"window below default interval", identity("a", "g", "p"), fence.Config{LivenessWindow: 5 * time.Second}, false},
		{"negative interval", identity("a", "g", "p"), fence.Config{HeartbeatInterval: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fence.New(nil, tt.id, tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("New error = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestLiveConsumersOfADatabaseWithoutRegistryAreNone(t *testing.T) {
	pool := migratedDatabase(t, 2)

	live, err := fence.LiveConsumers(context.Background(), pool, fence.DefaultLivenessWindow)
	if err != nil || len(live) != 0 {
		t.Fatalf("LiveConsumers before the registry migration = %v, %v; want none, no error", live, err)
	}
}
