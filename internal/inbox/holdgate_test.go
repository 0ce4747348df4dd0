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
	if !admits() || !admits() || admits() {
		t.Fatal("after one timeout: want exactly 2 holders admitted")
	}
	g.narrow()
	g.narrow()
	g.leave()
	g.leave()
	if !admits() || admits() {
		t.Fatal("after three timeouts: want exactly 1 holder admitted, never 0")
	}
	// One successful hold at a limit of 1 grows it to 2; at 2 each adds 1/limit (2.5, 2.9, 3.24):
	// the third holder comes with the third.
	g.widen()
	if !admits() || admits() {
		t.Fatal("after one successful hold at a limit of 1: want one more holder admitted")
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
	if !admits() || admits() {
		t.Fatal("after many successful holds: want the limit to stop at 4")
	}
	var none *holdGate
	if err := none.enter(ctx); err != nil {
		t.Fatalf("a nil gate (directly connected) refused a holder: %v", err)
	}
}
