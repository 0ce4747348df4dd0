package pooler

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/dbconn"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// sharedPgBouncer returns the URL of the PgBouncer of hack/pgbouncer.sh on its default port (the
// one `make test` uses; left running), with the query of the server URL plus extra.
func sharedPgBouncer(t *testing.T, extra string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", filepath.Join(root, "hack", "pgbouncer.sh")).Output()
	if err != nil {
		t.Fatalf("hack/pgbouncer.sh: %v", err)
	}
	url := strings.TrimSpace(string(out))
	if extra == "" {
		return url
	}
	if strings.Contains(url, "?") {
		return url + "&" + extra
	}
	return url + "?" + extra
}

// hammer runs distinct statements with arguments from 8 goroutines on pool, 20 each, and returns
// the errors; behind PgBouncer each may run on another server connection.
func hammer(ctx context.Context, pool *pgxpool.Pool) []error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				var n int
				sql := fmt.Sprintf(`SELECT $1::int + %d`, i%5)
				if err := pool.QueryRow(ctx, sql, g).Scan(&n); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// sqlstates counts the errors by SQLSTATE.
func sqlstates(errs []error) map[string]int {
	codes := map[string]int{}
	for _, err := range errs {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			codes[pgErr.Code]++
		} else {
			codes[err.Error()]++
		}
	}
	return codes
}

func pool(t *testing.T, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	cfg.MaxConns = 8
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestStatementsSurvivePgBouncerInTransactionModeAndArePreparedDirect runs the same statements
// through PgBouncer 1.18 in transaction mode with pgx's defaults, which prepare them on whatever
// server connection serves each one (SQLSTATE 42P05 or 26000), and with dbconn, which sees the
// pooler, prepares nothing and logs what to set; direct, dbconn keeps preparing them; and a
// statement mode named in the URL is kept, even where it fails.
func TestStatementsSurvivePgBouncerInTransactionModeAndArePreparedDirect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bouncer := sharedPgBouncer(t, "")

	plain, err := pgxpool.ParseConfig(bouncer)
	if err != nil {
		t.Fatal(err)
	}
	if codes := sqlstates(hammer(ctx, pool(t, plain))); codes["42P05"]+codes["26000"] == 0 {
		t.Fatalf("pgx's defaults through PgBouncer in transaction mode failed with %v, want prepared statements colliding or missing (42P05, 26000): the test no longer shows what dbconn avoids", codes)
	}

	var logged []string
	var mu sync.Mutex
	log := funcr.New(func(_, args string) { mu.Lock(); logged = append(logged, args); mu.Unlock() }, funcr.Options{})
	cfg, err := dbconn.PoolConfig(bouncer, log)
	if err != nil {
		t.Fatal(err)
	}
	if errs := hammer(ctx, pool(t, cfg)); len(errs) > 0 {
		t.Fatalf("through PgBouncer with dbconn: %d statements failed: %v", len(errs), sqlstates(errs))
	}
	mu.Lock()
	if len(logged) != 1 || !strings.Contains(logged[0], dbconn.ModeParam+"=cache_statement") {
		t.Errorf("logged %q, want one line naming %s=cache_statement", logged, dbconn.ModeParam)
	}
	mu.Unlock()
	conn, err := dbconn.Connect(ctx, bouncer, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		var n int
		if err := conn.QueryRow(ctx, `SELECT $1::int`, i).Scan(&n); err != nil {
			t.Fatalf("through PgBouncer with dbconn.Connect: %v", err)
		}
	}
	_ = conn.Close(ctx)

	named, err := dbconn.PoolConfig(sharedPgBouncer(t, dbconn.ModeParam+"=cache_statement"), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if codes := sqlstates(hammer(ctx, pool(t, named))); codes["42P05"]+codes["26000"] == 0 {
		t.Fatalf("with %s=cache_statement in the URL statements failed with %v, want them prepared as the URL says (42P05, 26000 behind PgBouncer 1.18)", dbconn.ModeParam, codes)
	}

	server, err := testenv.ServerURL(ctx)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := dbconn.Connect(ctx, server, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = direct.Close(ctx) }()
	var n, prepared int
	if err := direct.QueryRow(ctx, `SELECT $1::int`, 1).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements`).Scan(&prepared); err != nil {
		t.Fatal(err)
	}
	if prepared == 0 {
		t.Fatal("direct, dbconn.Connect prepared no statement: the cost of exec mode is paid where nothing needs it")
	}
}
