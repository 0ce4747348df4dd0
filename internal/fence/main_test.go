package fence_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

// packageDB is the package's own database; tests that need an empty schema create their own.
var packageDB string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithDatabase(m, &packageDB))
}

// migratedDatabase creates a fresh database for one test with the schema up to version (0: all).
func migratedDatabase(t *testing.T, version int) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Pool(t, testenv.FreshDatabase(t, "fence"))
	if version == 0 {
		version = migrations.Latest()
	}
	if _, err := migrations.ApplyUpTo(ctx, pool, version); err != nil {
		t.Fatal(err)
	}
	return pool
}

// manualClock is a fake clock that moves only when the test advances it.
type manualClock struct {
	*testingclock.FakeClock
}

func newManualClock() *manualClock {
	return &manualClock{testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
}

// awaitWaiter polls until someone waits on the clock, i.e. the fence loop finished its pass.
func (c *manualClock) awaitWaiter(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !c.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("nobody waits on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// Advance waits until the loop waits on the clock, then moves the clock by d, which fires the
// waiters that are due.
func (c *manualClock) Advance(t *testing.T, d time.Duration) {
	t.Helper()
	c.awaitWaiter(t)
	c.Step(d)
}
