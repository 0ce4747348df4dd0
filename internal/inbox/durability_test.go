package inbox

import (
	"context"
	"testing"
)

// The PROCESSED state of a delivered message and a new instance commit without waiting for their
// WAL flush (T1's commit, which follows, flushes them); a FAILED state, after which T1 rolls
// back, keeps the server's setting. Either way the setting ends with the state's own transaction.
func TestProcessedStateSkipsItsOwnFlushFailedStateKeepsIt(t *testing.T) {
	h := newHarness(t, chainSet())
	ctx := context.Background()
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var serverDefault string
	if err := conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&serverDefault); err != nil {
		t.Fatal(err)
	}
	if serverDefault == "off" {
		t.Skip("the server commits asynchronously anyway")
	}
	var (
		instanceID int64
		during     string
	)
	if err := conn.QueryRow(ctx, insertInstanceSQL, "chain", h.ctxID("c1"), h.clock.Now()).Scan(&instanceID, &during); err != nil {
		t.Fatal(err)
	}
	if during != "off" {
		t.Errorf("instance: synchronous_commit %q at its commit, want off", during)
	}
	for _, c := range []struct{ state, idem, want string }{
		{stateProcessed, "m1", "off"},
		{stateFailed, "m2", serverDefault},
	} {
		var after string
		err := conn.QueryRow(ctx, insertStateSQL, instanceID, "A", h.prefix+c.idem, c.idem, "orders", 0, 1, c.state, nil,
			[]byte("key"), []byte("value"), []byte("[]"), true).Scan(&during)
		if err != nil {
			t.Fatalf("store %s: %v", c.state, err)
		}
		if err := conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if during != c.want || after != serverDefault {
			t.Errorf("%s: synchronous_commit %q at its commit and %q after, want %q and %q", c.state, during, after, c.want, serverDefault)
		}
		if got := h.states("A", c.idem); len(got) != 1 || got[0] != c.state {
			t.Errorf("%s: stored %v", c.state, got)
		}
	}
}
