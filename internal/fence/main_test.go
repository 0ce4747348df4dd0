package fence_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// manualClock is a fence.Clock that moves only when the test advances it.
type manualClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []clockWaiter
}

type clockWaiter struct {
	at time.Time
	ch chan time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, clockWaiter{at: c.now.Add(d), ch: ch})
	return ch
}

// awaitWaiter polls until someone waits on the clock, i.e. the fence loop finished its pass.
func (c *manualClock) awaitWaiter(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		n := len(c.waiters)
		c.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nobody waits on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// Advance waits until the loop waits on the clock, then moves the clock by d and fires the
// waiters that are due.
func (c *manualClock) Advance(t *testing.T, d time.Duration) {
	t.Helper()
	c.awaitWaiter(t)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waiters = kept
}
