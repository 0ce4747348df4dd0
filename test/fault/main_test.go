// Package fault is the fault suite of issue 10: each test does one fault for real (kill -9 of a
// `seqinbox consume` process, PostgreSQL stopped and started, the broker paused, a hung sink, a
// missing dead-letter topic, large records behind a hung sink) against kfake, real PostgreSQL and
// a recording HTTP sink, and asserts that nothing is lost, nothing stalls and no logical message
// is delivered twice beyond what the spec allows. Each test logs, per fault, messages sent,
// delivered exactly once, delivered twice, lost and stalled, and the recovery time.
package fault

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"testing"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// binary is the `seqinbox` built from this checkout by TestMain.
var binary string

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault:", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "seqinbox-fault-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault:", err)
		return 2
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binary = filepath.Join(dir, "seqinbox")
	build := exec.Command("go", "build", "-o", binary, "./cmd/seqinbox")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "fault: build seqinbox:", err)
		return 2
	}
	return m.Run()
}
