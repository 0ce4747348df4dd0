package testenv

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BuildSeqinbox builds ./cmd/seqinbox with the given build tags (none: the release binary) into a
// temporary directory of t and returns its path, for the tests that run the binary as a user, the
// demo or `make demo` do.
func BuildSeqinbox(t testing.TB, tags ...string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "seqinbox")
	args := []string{"build"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, "-o", bin, "./cmd/seqinbox")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}
