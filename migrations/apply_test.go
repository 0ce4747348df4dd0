package migrations_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/migrations"
)

// contractTables are the tables other packages code against (SPEC §2).
var contractTables = []string{
	"buffered_message", "consumer_registry", migrations.LedgerTable, "sequence_instance", "sequenced_message",
	"sequential_inbox_idempotence",
}

func allVersions() []int {
	vs := make([]int, migrations.Latest())
	for i := range vs {
		vs[i] = i + 1
	}
	return vs
}

func tables(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY table_name COLLATE "C"`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestApplyOnEmptyDatabaseCreatesEveryTableAndRecordsEveryFile(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)

	res, err := migrations.Apply(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if res.Before != 0 || res.After != migrations.Latest() || !slices.Equal(res.Applied, allVersions()) {
		t.Fatalf("result = %+v, want 0 -> %d applying %v", res, migrations.Latest(), allVersions())
	}
	if got := tables(t, pool); !slices.Equal(got, contractTables) {
		t.Fatalf("tables = %v, want exactly %v", got, contractTables)
	}
	rows, err := pool.Query(ctx, `SELECT version, name, checksum FROM `+migrations.LedgerTable+` ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Version        int
		Name, Checksum string
	}
	ledger, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	var want []row
	for _, m := range migrations.All() {
		want = append(want, row{m.Version, m.Name, m.Checksum})
	}
	if !slices.Equal(ledger, want) {
		t.Fatalf("ledger = %v, want %v", ledger, want)
	}
	if v, err := migrations.Current(ctx, pool); err != nil || v != migrations.Latest() {
		t.Fatalf("Current = %d, %v; want %d", v, err, migrations.Latest())
	}
}

func TestApplyTwiceAppliesNothingTheSecondTime(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}

	res, err := migrations.Apply(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) != 0 || res.Before != migrations.Latest() || res.After != migrations.Latest() {
		t.Fatalf("second Apply = %+v, want nothing applied at version %d", res, migrations.Latest())
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+migrations.LedgerTable).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != migrations.Latest() {
		t.Fatalf("ledger has %d rows, want %d (one per file)", n, migrations.Latest())
	}
}
