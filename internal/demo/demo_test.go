package demo

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// databaseExists reports whether the server of dbURL has a database of that name.
func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

// processesOf lists the running processes whose executable is bin (Linux /proc).
func processesOf(t *testing.T, bin string) []string {
	t.Helper()
	exes, err := filepath.Glob("/proc/[0-9]*/exe")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, exe := range exes {
		if target, err := os.Readlink(exe); err == nil && target == bin {
			pids = append(pids, filepath.Base(filepath.Dir(exe)))
		}
	}
	return pids
}

// TestDemoDeliversEveryMessageOnceInSequenceOrder runs `make demo`'s code path: the built binary's
// consumers in two consumer groups against the embedded broker and a temporary database.
func TestDemoDeliversEveryMessageOnceInSequenceOrder(t *testing.T) {
	bin := testenv.BuildSeqinbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	report, err := Run(ctx, Options{Binary: bin, DatabaseURL: dbURL, Manifest: samplePath(t), Out: &progress, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("demo did not run: %v\nprogress:\n%s", err, progress.String())
	}
	var text bytes.Buffer
	_ = report.Write(&text)
	if !report.Verdict.Holds() {
		t.Fatalf("verdict does not hold:\n%s\nprogress:\n%s", text.String(), progress.String())
	}

	// The engine's metrics agree with the sink's log and the scenario: every record was read by
	// both groups, each sequenced message was delivered once (at once or from the buffer), every
	// buffered message was released, and the one rejection was absorbed by a retry.
	total := map[string]float64{}
	for i, c := range report.Counters {
		for _, cs := range report.Consumers {
			total[strings.TrimSpace(c.Label)] += cs.Values[i]
		}
	}
	accepted, rejected := 0, 0
	for _, d := range report.Deliveries {
		switch {
		case d.Accepted():
			accepted++
		case d.ID == report.Scenario.RejectOnce:
			rejected++
		default:
			t.Errorf("unexpected non-2xx delivery %+v", d)
		}
	}
	if rejected != 1 {
		t.Errorf("the sink rejected %s %d times, want exactly once", report.Scenario.RejectOnce, rejected)
	}
	sequencedSends, unsequencedSends, poison := 0, 0, 0
	for _, s := range report.Scenario.Sends {
		switch {
		case s.Poison != nil:
			poison++
		case s.Event.Test:
			unsequencedSends++
		default:
			sequencedSends++
		}
	}
	const groups = 2
	want := map[string]float64{
		"records read": float64(groups * len(report.Scenario.Sends)),
		"delivered without sequencing (filtered)": float64(groups * unsequencedSends),
		"dead-lettered":                       float64(groups * poison),
		"sink calls accepted":                 float64(accepted),
		"sink calls failed after all retries": 0,
	}
	for label, w := range want {
		if total[label] != w {
			t.Errorf("%s: %g, want %g", label, total[label], w)
		}
	}
	if got := total["delivered at once (claim won, condition held)"] + total["released from the buffer later"]; got != float64(report.Verdict.Sequenced) {
		t.Errorf("the engines delivered %g sequenced messages (at once or released), want each of %d once", got, report.Verdict.Sequenced)
	}
	if b := total["buffered (claim won, waiting for predecessors)"]; b == 0 || b != total["released from the buffer later"] {
		t.Errorf("buffered %g, released %g: want buffering and every buffered message released", b, total["released from the buffer later"])
	}
	won, lost := total["claims won"], total["claims lost (another delivery held the claim)"]
	if won < float64(report.Verdict.Sequenced) || won+lost != float64(groups*sequencedSends) {
		t.Errorf("claims won %g, lost %g: want won ≥ %d and one claim per sequenced record and group (%d)",
			won, lost, report.Verdict.Sequenced, groups*sequencedSends)
	}
	if total["sink attempts retried"] < 1 {
		t.Errorf("no sink attempt was retried, yet the sink rejected %s once", report.Scenario.RejectOnce)
	}

	if databaseExists(t, report.Database) {
		t.Errorf("temporary database %s still exists after the demo", report.Database)
	}
	if pids := processesOf(t, bin); len(pids) > 0 {
		t.Errorf("consumer processes %v still run after the demo", pids)
	}
}

// cancelOn cancels a context when a progress line contains a marker, as Ctrl-C would at that point.
type cancelOn struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	if strings.Contains(c.buf.String(), c.marker) {
		c.cancel()
	}
	return len(p), nil
}

func TestDemoInterruptedStopsConsumersAndDropsItsDatabase(t *testing.T) {
	bin := testenv.BuildSeqinbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	interrupt, stop := context.WithCancel(ctx)
	defer stop()
	progress := &cancelOn{marker: "consumers ready", cancel: stop}
	_, err := Run(interrupt, Options{Binary: bin, DatabaseURL: dbURL, Manifest: samplePath(t), Out: progress, Timeout: 2 * time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("an interrupted demo returned %v, want context.Canceled\nprogress:\n%s", err, progress.buf.String())
	}
	name := regexp.MustCompile(`temporary database (seqinbox_demo_[0-9a-f]+)`).FindStringSubmatch(progress.buf.String())
	if name == nil {
		t.Fatalf("the progress never named the temporary database:\n%s", progress.buf.String())
	}
	if databaseExists(t, name[1]) {
		t.Errorf("temporary database %s still exists after the interruption", name[1])
	}
	if pids := processesOf(t, bin); len(pids) > 0 {
		t.Errorf("consumer processes %v still run after the interruption", pids)
	}
}
