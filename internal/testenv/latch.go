package testenv

import (
	"context"
	"sync"
)

// Latch holds the requests of a test server until their client goes away or the test opens it;
// open, it lets every waiting and later request through.
type Latch struct {
	open chan struct{}
	once sync.Once
}

// NewLatch returns a closed latch.
func NewLatch() *Latch {
	return &Latch{open: make(chan struct{})}
}

// Wait blocks until the latch opens (true) or ctx ends first (false).
func (l *Latch) Wait(ctx context.Context) bool {
	select {
	case <-l.open:
		return true
	case <-ctx.Done():
		return false
	}
}

// Open lets every waiting and later request through; opening it again does nothing.
func (l *Latch) Open() {
	l.once.Do(func() { close(l.open) })
}
