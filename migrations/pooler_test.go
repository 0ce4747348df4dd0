package migrations_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/migrations"
)

// execPool opens a pool on url whose statements are never prepared, as a migrator behind
// PgBouncer without prepared-statement support must run; closed when the test ends.
func execPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrationLocks counts the advisory locks on the migrators' key in the database of pool, held
// or awaited, by any session of the server (behind a pooler, the pool's own sessions are not the
// ones that took them).
func migrationLocks(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory'
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((classid::bigint << 32) | objid::bigint) = $1`, migrations.AdvisoryLockKey).Scan(&n)
	return n, err
}

// TestConcurrentMigratorsOnAFreshDatabaseEndCleanBehindAPoolerInTransactionMode races four
// migrators on a fresh database, ten rounds. Run through PgBouncer in transaction mode (as `make
// test` does), any statement may run on any server connection: a session-level lock is taken on
// one and released on another (or never), so migrators race on CREATE TABLE and a later one
// hangs on the leaked lock. Each round must end within its deadline with every file applied
// exactly once, no migrator failing and no lock left.
func TestConcurrentMigratorsOnAFreshDatabaseEndCleanBehindAPoolerInTransactionMode(t *testing.T) {
	const rounds, migrators = 10, 4
	for round := range rounds {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			url := newDatabaseURL(t)
			pools := make([]*pgxpool.Pool, migrators)
			for i := range pools {
				pools[i] = execPool(t, url)
			}
			results := make([]migrations.Result, migrators)
			errs := make([]error, migrators)
			var ready, wg sync.WaitGroup
			start := make(chan struct{})
			ready.Add(migrators)
			for i := range migrators {
				wg.Go(func() {
					// A connection each before the start, so that the migrators' first statements race.
					if errs[i] = pools[i].Ping(ctx); errs[i] != nil {
						ready.Done()
						return
					}
					ready.Done()
					<-start
					results[i], errs[i] = migrations.Apply(ctx, pools[i])
				})
			}
			ready.Wait()
			close(start)
			wg.Wait()

			requireEachVersionAppliedOnce(t, errs, results)
			observer := execPool(t, url)
			check, cancelCheck := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancelCheck()
			if v, err := migrations.Current(check, observer); err != nil || v != migrations.Latest() {
				t.Errorf("Current = %d, %v; want %d", v, err, migrations.Latest())
			}
			if got := tables(t, observer); !slices.Equal(got, contractTables) {
				t.Errorf("tables = %v, want exactly %v", got, contractTables)
			}
			if n, err := migrationLocks(check, observer); err != nil || n != 0 {
				t.Errorf("%d advisory locks on the migration key remain after every migrator returned (%v), want none", n, err)
			}
		})
	}
}
