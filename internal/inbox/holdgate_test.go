package inbox

import (
	"context"
	"testing"
	"time"
)

// TestTheHoldGateHalvesAfterATimeoutAndGrowsBackOneHolderPerLimitHolds admits 4 holders, halves
// to 2 and then 1 after holds that timed out (a fifth, third and second holder wait), and grows
// back by about one holder per limit successful holds, never beyond 4 and never below 1.
// A waiting holder gives up when its context ends.
func TestTheHoldGateHalvesAfterATimeoutAndGrowsBackOneHolderPerLimitHolds(t *testing.T) {
	ctx := context.Background()
	g := newHoldGate(4)
	admits := func() bool {
		wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := g.enter(wctx); err != nil {
			return false
		}
		return true
	}
	// admitted tries up to tries holders and counts those let in.
	admitted := func(tries int) int {
		n := 0
		for range tries {
			if admits() {
				n++
			}
		}
		return n
	}
	for i := range 4 {
		if !admits() {
			t.Fatalf("holder %d not admitted under a limit of 4", i+1)
		}
	}
	if admits() {
		t.Fatal("a fifth holder admitted under a limit of 4")
	}
	g.narrow()
	for range 4 {
		g.leave()
	}
	if n := admitted(3); n != 2 {
		t.Fatalf("after one timeout: %d holders admitted, want exactly 2", n)
	}
	g.narrow()
	g.narrow()
	g.leave()
	g.leave()
	if n := admitted(2); n != 1 {
		t.Fatalf("after three timeouts: %d holders admitted, want exactly 1, never 0", n)
	}
	// One successful hold at a limit of 1 grows it to 2; at 2 each adds 1/limit (2.5, 2.9, 3.24):
	// the third holder comes with the third.
	g.widen()
	if n := admitted(2); n != 1 {
		t.Fatalf("after one successful hold at a limit of 1: %d more holders admitted, want 1", n)
	}
	g.widen()
	g.widen()
	if admits() {
		t.Fatal("after two successful holds at a limit of 2: want no third holder yet")
	}
	g.widen()
	if !admits() {
		t.Fatal("after three successful holds at a limit of 2: want a third holder admitted")
	}
	for range 20 {
		g.widen()
	}
	if n := admitted(2); n != 1 {
		t.Fatalf("after many successful holds: %d more holders admitted beside 3, want 1: the limit stops at 4", n)
	}
	var none *holdGate
	if err := none.enter(ctx); err != nil {
		t.Fatalf("a nil gate (directly connected) refused a holder: %v", err)
	}
}
