package testenv

import (
	"testing"
	"time"
)

// pollInterval is how often WaitUntil re-checks its condition.
const pollInterval = 10 * time.Millisecond

// WaitUntil polls cond until it holds and fails the test when it does not within timeout: tests
// await an observable condition instead of sleeping a fixed time.
func WaitUntil(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(pollInterval)
	}
}
