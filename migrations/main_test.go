package migrations_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// serverDB is the package's own database; most tests create a fresh one with newDatabase instead,
// because they need an empty schema.
var serverDB string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithDatabase(m, &serverDB))
}

// newDatabase creates an empty database for one test and returns a pool on it.
func newDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	url, drop, err := testenv.NewDatabase(ctx, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
