// Package pooler tests hack/pgbouncer.sh, which puts PgBouncer in transaction pooling mode in front
// of the test server so that `make test` can run the engine's racing tests and the migrators
// through it.
package pooler

import (
	"context"
	"fmt"
	"net"
	neturl "net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// script runs hack/pgbouncer.sh with args on port, pool size poolSize, and returns its stdout.
func script(t *testing.T, port, poolSize int, args ...string) (string, error) {
	t.Helper()
	return testenv.PgBouncerScript(port, poolSize, args...)
}

// freePort returns a loopback port that nothing listens on, so the test never touches the
// PgBouncer that other packages' tests use on the default port.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// connect opens a connection through url with the simple protocol, which prepares nothing.
func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return pgx.ConnectConfig(ctx, cfg)
}

// TestPgBouncerServesMoreClientsThanServerConnectionsInTransactionModeAndStops starts PgBouncer
// with a pool of 3 server connections and keeps 9 client connections open at once: in
// transaction mode each statement borrows a server connection only while it runs, so all 9 are
// served by at most 3 backends (in session mode the fourth client would wait for a free one). A
// database created through PgBouncer is served too, and `stop` stops it.
func TestPgBouncerServesMoreClientsThanServerConnectionsInTransactionModeAndStops(t *testing.T) {
	const poolSize, clients = 3, 9
	port := freePort(t)
	t.Cleanup(func() {
		if _, err := script(t, port, poolSize, "stop"); err != nil {
			t.Error(err)
		}
	})
	url, err := script(t, port, poolSize)
	if err != nil {
		t.Fatal(err)
	}
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatalf("hack/pgbouncer.sh printed %q, not a URL: %v", url, err)
	}
	if want := "127.0.0.1:" + strconv.Itoa(port); u.Host != want {
		t.Fatalf("URL %s, want host %s", u.Redacted(), want)
	}
	if again, err := script(t, port, poolSize); err != nil || again != url {
		t.Fatalf("second call printed %q, %v; want the same URL %q (the running PgBouncer)", again, err, url)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conns := make([]*pgx.Conn, clients)
	for i := range conns {
		if conns[i], err = connect(ctx, url); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		defer func() { _ = conns[i].Close(context.Background()) }()
	}
	backends := map[int]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, clients)
	for round := range 3 {
		for i, c := range conns {
			wg.Go(func() {
				var pid int
				if err := c.QueryRow(ctx, `SELECT pg_backend_pid() FROM pg_sleep(0.05)`).Scan(&pid); err != nil {
					errs[i] = fmt.Errorf("round %d, client %d: %w", round, i, err)
					return
				}
				mu.Lock()
				backends[pid] = true
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(backends) == 0 || len(backends) > poolSize {
		t.Fatalf("%d clients were served by %d backends, want 1 to %d", clients, len(backends), poolSize)
	}

	name := "seqinbox_pooler_" + strconv.Itoa(port)
	if _, err := conns[0].Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := connect(context.Background(), url)
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = c.Close(context.Background()) }()
		if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	other := *u
	other.Path = "/" + name
	c, err := connect(ctx, other.String())
	if err != nil {
		t.Fatalf("a database created through PgBouncer is not served: %v", err)
	}
	var db string
	err = c.QueryRow(ctx, `SELECT current_database()`).Scan(&db)
	_ = c.Close(ctx)
	if err != nil || db != name {
		t.Fatalf("current_database() = %q, %v; want %s", db, err, name)
	}

	for _, c := range conns {
		_ = c.Close(ctx)
	}
	if _, err := script(t, port, poolSize, "stop"); err != nil {
		t.Fatal(err)
	}
	if c, err := connect(ctx, url); err == nil {
		_ = c.Close(ctx)
		t.Fatalf("PgBouncer still answers on port %d after stop", port)
	}
	// Start it again for the cleanup, which drops the test database through it.
	if _, err := script(t, port, poolSize); err != nil {
		t.Fatal(err)
	}
}
