package migrations_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/migrations"
)

// contractTables are the tables other packages code against (docs/design.md#tables).
var contractTables = []string{
	"buffered_message", "consumer_registry", "housekeeping_lease", "operator_action", migrations.OwnerTable, migrations.LedgerTable, "sequence_instance", "sequenced_message",
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

// waitingForMigrationLock counts sessions of the current database that wait for the migrators'
// advisory lock.
func waitingForMigrationLock(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((classid::bigint << 32) | objid::bigint) = $1`, migrations.AdvisoryLockKey).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitMigratorsQueued polls pg_locks until want sessions wait for the migration lock.
func awaitMigratorsQueued(t *testing.T, pool *pgxpool.Pool, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for n := waitingForMigrationLock(t, pool); n != want; n = waitingForMigrationLock(t, pool) {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions queued on the migration lock, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConcurrentMigratorsApplyEachFileExactlyOnce(t *testing.T) {
	const migrators = 8
	ctx := context.Background()
	url := newDatabaseURL(t)
	observer := newPool(t, url)

	// Hold the migration lock so that every migrator is provably queued on it before any runs.
	holder, err := observer.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrations.AdvisoryLockKey); err != nil {
		t.Fatal(err)
	}

	pools := make([]*pgxpool.Pool, migrators)
	for i := range pools {
		pools[i] = newPool(t, url)
	}
	results := make([]migrations.Result, migrators)
	errs := make([]error, migrators)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range migrators {
		wg.Go(func() {
			<-start
			results[i], errs[i] = migrations.Apply(ctx, pools[i])
		})
	}
	close(start)

	awaitMigratorsQueued(t, observer, migrators)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, migrations.AdvisoryLockKey); err != nil {
		t.Fatal(err)
	}
	holder.Release()
	wg.Wait()

	requireEachVersionAppliedOnce(t, errs, results)
	var rows int
	if err := observer.QueryRow(ctx, `SELECT count(*) FROM `+migrations.LedgerTable).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != migrations.Latest() {
		t.Fatalf("ledger has %d rows, want %d", rows, migrations.Latest())
	}
	if n := waitingForMigrationLock(t, observer); n != 0 {
		t.Fatalf("%d sessions still wait for the migration lock", n)
	}
}

func TestChangedChecksumOfAppliedFileIsRefusedNamingTheFile(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+migrations.LedgerTable+` SET checksum = 'deadbeef' WHERE version = 2`); err != nil {
		t.Fatal(err)
	}

	res, err := migrations.Apply(ctx, pool)
	if !errors.Is(err, migrations.ErrLedgerMismatch) {
		t.Fatalf("Apply error = %v, want ErrLedgerMismatch", err)
	}
	for _, want := range []string{"0002_claims.sql", "deadbeef", "new migration"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if len(res.Applied) != 0 {
		t.Fatalf("Apply applied %v despite the mismatch", res.Applied)
	}
	if _, err := migrations.Inspect(ctx, pool); !errors.Is(err, migrations.ErrLedgerMismatch) {
		t.Fatalf("Inspect error = %v, want ErrLedgerMismatch", err)
	}
}

func TestLedgerWithGapIsRefused(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+migrations.LedgerTable+` WHERE version = 2`); err != nil {
		t.Fatal(err)
	}

	_, err := migrations.Apply(ctx, pool)
	if !errors.Is(err, migrations.ErrLedgerMismatch) || !strings.Contains(err.Error(), "not version 2") {
		t.Fatalf("Apply error = %v, want ErrLedgerMismatch naming the missing version 2", err)
	}
}

func TestDatabaseNewerThanBinaryIsRefused(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	future := migrations.Latest() + 1
	if _, err := pool.Exec(ctx, `INSERT INTO `+migrations.LedgerTable+` (version, name, checksum) VALUES ($1, '9999_from_the_future.sql', 'abc')`, future); err != nil {
		t.Fatal(err)
	}

	res, err := migrations.Apply(ctx, pool)
	if !errors.Is(err, migrations.ErrSchemaNewer) {
		t.Fatalf("Apply error = %v, want ErrSchemaNewer", err)
	}
	if !strings.Contains(err.Error(), "9999_from_the_future.sql") || !strings.Contains(err.Error(), "newer") {
		t.Errorf("error %q should name the unknown file and say the database is newer", err)
	}
	if len(res.Applied) != 0 {
		t.Fatalf("Apply applied %v on a newer database", res.Applied)
	}
	if v, err := migrations.Current(ctx, pool); err != nil || v != future {
		t.Fatalf("Current = %d, %v; want %d (Current reports, it does not verify)", v, err, future)
	}
}

// historicalRow is a sequenced_message row as a release before the claim table wrote it.
type historicalRow struct {
	ID                         int64
	MessageType, IdempotenceID string
	State                      string
	Topic                      string
	Offset                     int64
}

func historicalRows(t *testing.T, pool *pgxpool.Pool) []historicalRow {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT id, message_type, idempotence_id, state, topic, "offset" FROM sequenced_message ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[historicalRow])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestUpgradeKeepsHistoricalDuplicateMessagesAndAddsNoUniqueConstraint(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if res, err := migrations.ApplyUpTo(ctx, pool, 1); err != nil || !slices.Equal(res.Applied, []int{1}) {
		t.Fatalf("ApplyUpTo(1) = %+v, %v; want only version 1 applied", res, err)
	}
	var claimTable bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('sequential_inbox_idempotence') IS NOT NULL`).Scan(&claimTable); err != nil || claimTable {
		t.Fatalf("claim table exists after ApplyUpTo(1): %v, %v", claimTable, err)
	}
	_, err := pool.Exec(ctx, `
		WITH i AS (
		  INSERT INTO sequence_instance (name, context_id, retain_until) VALUES ('order', 'o-1', now() + interval '1 day')
		  RETURNING id)
		INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, state, topic, "offset")
		SELECT id, 'OrderCreated', 'dup-1', 'PROCESSED', 'orders', 10 FROM i
		UNION ALL SELECT id, 'OrderCreated', 'dup-1', 'FAILED', 'orders', 11 FROM i`)
	if err != nil {
		t.Fatal(err)
	}
	before := historicalRows(t, pool)

	res, err := migrations.Apply(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Applied, allVersions()[1:]) || res.Before != 1 {
		t.Fatalf("upgrade = %+v, want versions %v applied on top of 1", res, allVersions()[1:])
	}
	after := historicalRows(t, pool)
	if len(after) != 2 || !slices.Equal(after, before) {
		t.Fatalf("rows after upgrade = %v, want the two historical duplicates untouched: %v", after, before)
	}
	var unique []string
	rows, err := pool.Query(ctx, `
		SELECT indexrelid::regclass::text FROM pg_index
		WHERE indrelid = 'sequenced_message'::regclass AND indisunique AND NOT indisprimary`)
	if err != nil {
		t.Fatal(err)
	}
	if unique, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(unique) != 0 {
		t.Fatalf("sequenced_message has unique indexes %v; the claim migration must not add any", unique)
	}
}

func TestApplyConnMigratesOverASingleConnection(t *testing.T) {
	ctx := context.Background()
	url := newDatabaseURL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	res, err := migrations.ApplyConn(ctx, conn)
	if err != nil || !slices.Equal(res.Applied, allVersions()) {
		t.Fatalf("ApplyConn = %+v, %v; want all versions applied", res, err)
	}
	var held int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Fatalf("the connection still holds %d advisory locks after ApplyConn", held)
	}
}

func TestCancelledMigratorWaitingForTheLockReturnsAndLeavesTheSchemaAlone(t *testing.T) {
	ctx := context.Background()
	url := newDatabaseURL(t)
	observer := newPool(t, url)
	holder, err := observer.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrations.AdvisoryLockKey); err != nil {
		t.Fatal(err)
	}

	waitCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := migrations.Apply(waitCtx, newPool(t, url))
		done <- err
	}()
	awaitMigratorsQueued(t, observer, 1)
	cancel()

	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply error = %v, want context.Canceled", err)
	}
	if v, err := migrations.Current(ctx, observer); err != nil || v != 0 {
		t.Fatalf("Current = %d, %v; want 0: a cancelled migrator applies nothing", v, err)
	}
}

func TestRenamedAppliedFileIsRefused(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+migrations.LedgerTable+` SET name = '0003_registry.sql' WHERE version = 3`); err != nil {
		t.Fatal(err)
	}

	_, err := migrations.Apply(ctx, pool)
	if !errors.Is(err, migrations.ErrLedgerMismatch) || !strings.Contains(err.Error(), "0003_registry.sql") ||
		!strings.Contains(err.Error(), "0003_consumer_registry.sql") {
		t.Fatalf("Apply error = %v, want ErrLedgerMismatch naming both file names", err)
	}
}

// requireEachVersionAppliedOnce fails unless the racing migrators returned without error and,
// together, applied every migration exactly once.
func requireEachVersionAppliedOnce(t *testing.T, errs []error, results []migrations.Result) {
	t.Helper()
	appliedBy := map[int]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("migrator %d: %v", i, err)
		}
		for _, v := range results[i].Applied {
			appliedBy[v]++
		}
	}
	for _, v := range allVersions() {
		if appliedBy[v] != 1 {
			t.Errorf("version %d applied %d times, want exactly once", v, appliedBy[v])
		}
	}
	if len(appliedBy) != migrations.Latest() {
		t.Errorf("applied versions %v, want exactly %v", appliedBy, allVersions())
	}
}
