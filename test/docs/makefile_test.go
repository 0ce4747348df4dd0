package docs_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMakeHelpListsEveryDescribedTarget runs `make help` and checks that it lists every target
// that the Makefile describes with a ## comment, whatever characters its name holds (e2e).
func TestMakeHelpListsEveryDescribedTarget(t *testing.T) {
	root := repoRoot(t)
	described := regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+):[^#\n]*##`).FindAllStringSubmatch(readFile(t, filepath.Join(root, "Makefile")), -1)
	if len(described) < 10 {
		t.Fatalf("found %d described targets in the Makefile; the pattern no longer matches it", len(described))
	}
	cmd := exec.Command("make", "--no-print-directory", "help")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make help: %v", err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if fields := strings.Fields(line); strings.HasPrefix(line, "  ") && len(fields) > 1 {
			listed[fields[0]] = true
		}
	}
	for _, m := range described {
		if !listed[m[1]] {
			t.Errorf("make help does not list the target %s:\n%s", m[1], out)
		}
	}
}
