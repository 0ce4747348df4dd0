package inbox

import (
	"context"
	"sync"
)

// A holdGate admits the holders of an engine behind a connection pooler (stateConn). Each holder
// needs two server connections of the pooler at once, its holding transaction's and its state
// connection's, and takes them one after the other: when holders of all consumers together take
// every server connection for their first one, all of them wait for a second, until holdTimeout.
// The gate narrows to half the holders after such a timeout and widens by one holder per limit
// successful holds (additive increase, multiplicative decrease, as TCP does for a link of unknown
// capacity), so that an undersized pooler slows the consumer down instead of stalling it.
// A nil gate (directly connected) admits everyone.
type holdGate struct {
	mu sync.Mutex
	// limit is how many holders may be inside at once (its integer part, at least 1); most is
	// the most it widens to: the pool cannot serve more holders.
	limit, most float64
	inside      int
	// changed is closed and replaced when a holder leaves or the limit grows.
	changed chan struct{}
}

// newHoldGate admits up to most holders at first.
func newHoldGate(most int) *holdGate {
	m := float64(max(most, 1))
	return &holdGate{limit: m, most: m, changed: make(chan struct{})}
}

// enter waits until the gate admits one more holder or ctx ends.
func (g *holdGate) enter(ctx context.Context) error {
	if g == nil {
		return nil
	}
	for {
		g.mu.Lock()
		if g.inside < int(g.limit) {
			g.inside++
			g.mu.Unlock()
			return nil
		}
		changed := g.changed
		g.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// leave lets the next holder in.
func (g *holdGate) leave() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inside--
	g.signal()
}

// narrow halves the limit after a hold that timed out.
func (g *holdGate) narrow() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit = max(1, g.limit/2)
}

// widen grows the limit by 1/limit after a successful hold.
func (g *holdGate) widen() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	before := int(g.limit)
	g.limit = min(g.most, g.limit+1/g.limit)
	if int(g.limit) > before {
		g.signal()
	}
}

// signal wakes the waiting holders; under mu.
func (g *holdGate) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}
