package migrations_test

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// packageDB is the package's own database; the tests create a fresh one each with newDatabase,
// because they need an empty schema.
var packageDB string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithDatabase(m, &packageDB))
}

// newDatabaseURL creates an empty database for one test, dropped when the test ends.
func newDatabaseURL(t *testing.T) string {
	t.Helper()
	return testenv.FreshDatabase(t, "migrations")
}

// newPool opens a pool on url, closed when the test ends.
func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	return testenv.Pool(t, url)
}

// newDatabase creates an empty database for one test and returns a pool on it.
func newDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return newPool(t, newDatabaseURL(t))
}
