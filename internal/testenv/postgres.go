package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/dbconn"
)

// DatabaseURLEnv names the variable that points tests at a PostgreSQL server (any database on it;
// tests create their own). hack/postgres.sh sets it up for `make test`.
const DatabaseURLEnv = "SEQINBOX_TEST_DATABASE_URL"

// defaultServerURL is the server a developer machine is expected to run (see
// docs/design.md#development-environment).
const defaultServerURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ServerURL returns the URL of the PostgreSQL server the tests use, checking that it answers.
func ServerURL(ctx context.Context) (string, error) {
	candidate := os.Getenv(DatabaseURLEnv)
	if candidate == "" {
		candidate = defaultServerURL
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, candidate)
	if err != nil {
		return "", fmt.Errorf("no PostgreSQL for tests at %s (%w); run `make test`, which provides one "+
			"through hack/postgres.sh, or set %s to a server where the user may create databases",
			redact(candidate), err, DatabaseURLEnv)
	}
	_ = conn.Close(ctx)
	return candidate, nil
}

// NewDatabase creates a fresh, uniquely named database on the test server and returns its URL
// and a function that drops it (terminating leftover sessions first).
func NewDatabase(ctx context.Context, prefix string) (dbURL string, drop func(), err error) {
	server, err := ServerURL(ctx)
	if err != nil {
		return "", nil, err
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := sanitize("seqinbox_" + prefix + "_" + hex.EncodeToString(suffix))
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", redact(server), err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create test database %s: %w", name, err)
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", nil, fmt.Errorf("parse %s: %w", DatabaseURLEnv, err)
	}
	u.Path = "/" + name
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testenv: cannot drop database %s: %v\n", name, err)
			return
		}
		defer func() { _ = c.Close(ctx) }()
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: drop database %s: %v\n", name, err)
		}
	}
	return u.String(), drop, nil
}

// RunWithDatabase is a TestMain body: it creates the package's own database, stores its URL in
// *dbURL, runs the tests and drops the database. It fails the run when no server is available.
func RunWithDatabase(m *testing.M, dbURL *string) int {
	wd, _ := os.Getwd()
	u, drop, err := NewDatabase(context.Background(), filepath.Base(wd))
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 2
	}
	defer drop()
	*dbURL = u
	return m.Run()
}

func sanitize(s string) string {
	s = strings.ToLower(s)
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// FreshDatabase creates an empty database for one test (for tests that need a schema of their
// own) and drops it when the test ends.
func FreshDatabase(t testing.TB, prefix string) string {
	t.Helper()
	dbURL, drop, err := NewDatabase(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return dbURL
}

// Pool opens a pgx pool on dbURL for one test and closes it when the test ends.
func Pool(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := dbconn.PoolConfig(dbURL, logr.Discard())
	if err != nil {
		t.Fatalf("parse the test database URL: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open a pool on the test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
