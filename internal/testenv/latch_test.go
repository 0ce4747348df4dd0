package testenv

import (
	"context"
	"testing"
)

func TestLatchHoldsUntilOpenedOrTheClientGoesAway(t *testing.T) {
	l := NewLatch()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if l.Wait(gone) {
		t.Error("a request whose client went away passed a closed latch")
	}
	waited := make(chan bool)
	go func() { waited <- l.Wait(context.Background()) }()
	l.Open()
	l.Open() // again: nothing
	if !<-waited || !l.Wait(context.Background()) {
		t.Error("the open latch held a request")
	}
}
