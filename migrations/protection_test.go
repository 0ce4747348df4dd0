package migrations_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/migrations"
)

// TestUpgradeToDuplicateProtectionKeepsEveryInstance upgrades a database that holds a closed
// instance (no remove_after: housekeeping gives it its window afterwards), an open one and an open
// one marked for removal, and checks that the migration keeps every row as it was and leaves the
// housekeeping indexes split by state.
func TestUpgradeToDuplicateProtectionKeepsEveryInstance(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	i := slices.IndexFunc(migrations.All(), func(m migrations.Migration) bool {
		return strings.HasSuffix(m.Name, "_duplicate_protection.sql")
	})
	if i < 0 {
		t.Fatal("no duplicate-protection migration embedded")
	}
	version := migrations.All()[i].Version
	if _, err := migrations.ApplyUpTo(ctx, pool, version-1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sequence_instance (name, context_id, state, closed_at, retain_until, remove_after) VALUES
		('order', 'closed', 'CLOSED', now(), now() + interval '1 day', NULL),
		('order', 'open', 'OPEN', NULL, now() + interval '1 day', NULL),
		('order', 'expired', 'OPEN', NULL, now() - interval '1 hour', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	const rowsSQL = `SELECT context_id || ' ' || state || ' ' || coalesce(closed_at::text, '-') || ' ' ||
		retain_until::text || ' ' || coalesce(remove_after::text, '-') FROM sequence_instance ORDER BY id`
	before := strings.Join(collect(t, pool, rowsSQL), "\n")

	res, err := migrations.ApplyUpTo(ctx, pool, version)
	if err != nil || !slices.Equal(res.Applied, []int{version}) {
		t.Fatalf("upgrade = %+v, %v; want version %d applied", res, err, version)
	}
	if after := strings.Join(collect(t, pool, rowsSQL), "\n"); after != before {
		t.Fatalf("instances after the upgrade:\n%s\nwant as before:\n%s", after, before)
	}
	indexes := collect(t, pool, `SELECT indexname::text FROM pg_indexes
		WHERE tablename = 'sequence_instance' AND indexname LIKE '%remove_after' OR indexname = 'sequence_instance_closed'
		ORDER BY indexname`)
	if want := []string{"sequence_instance_closed_remove_after", "sequence_instance_expired_remove_after"}; !slices.Equal(indexes, want) {
		t.Fatalf("removal indexes = %v, want %v", indexes, want)
	}
}

// collect runs a query of a single text column.
func collect(t *testing.T, pool *pgxpool.Pool, sql string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}
