//go:build legacy

package inbox

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestLegacyEngineDeliversRacingDuplicatesTwice shows what claim protocol 0 does with two
// concurrent deliveries of one logical message: both find no row, both call the listener, both
// insert a row. The listener waits until both calls arrived (or a minute passed, which is what
// the claim engine's loser would cause); under the legacy protocol both arrive.
// Run: go test -tags legacy -run '^TestLegacy' ./internal/inbox/
func TestLegacyEngineDeliversRacingDuplicatesTwice(t *testing.T) {
	h := newHarness(t, chainSet())
	var (
		arrived sync.WaitGroup
		both    = make(chan struct{})
	)
	arrived.Add(2)
	go func() { arrived.Wait(); close(both) }()
	h.listener.setBehaviour(func(ctx context.Context, _ Message) error {
		arrived.Done()
		select {
		case <-both:
		case <-time.After(time.Minute):
		}
		return nil
	})
	rec := h.rec("A", "a1", "ctx1")
	errs := raceAll([]func() error{
		func() error { _, err := h.engine.Process(context.Background(), rec); return err },
		func() error { _, err := h.engine.Process(context.Background(), rec); return err },
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := h.listener.callCount(); n != 2 {
		t.Fatalf("listener calls %d; want 2 (both duplicates delivered)", n)
	}
	if s := h.states("A", "a1"); !slices.Equal(s, []string{stateProcessed, stateProcessed}) {
		t.Fatalf("rows %v; want two PROCESSED rows", s)
	}
	if n := h.claims("A", "a1"); n != 0 {
		t.Fatalf("claims %d; want none under claim protocol 0", n)
	}
	if ClaimProtocol != "check-then-insert-v0" {
		t.Fatalf("ClaimProtocol %q; want check-then-insert-v0", ClaimProtocol)
	}
}
