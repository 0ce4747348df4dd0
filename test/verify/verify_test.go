// Package verify_test proves that `make verify` (hack/verify.sh) catches stale generated files.
package verify_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// copyTree copies the project into dst, leaving out version control and build output.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() && (rel == ".git" || rel == "bin" || rel == "dist") {
			return filepath.SkipDir
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		info, _ := d.Info()
		return os.WriteFile(target, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("copy the project: %v", err)
	}
}

func runVerify(t *testing.T, dir string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "hack/verify.sh")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestVerifyPassesOnCurrentTreeAndFailsOnStaleCRD(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyTree(t, root, dir)

	if out, err := runVerify(t, dir); err != nil {
		t.Fatalf("verify fails on the committed tree (regenerate with `make manifests generate`): %v\n%s", err, out)
	}

	crd := filepath.Join(dir, "config", "crd", "bases", "inbox.seqinbox.dev_sequentialinboxes.yaml")
	data, err := os.ReadFile(crd)
	if err != nil {
		t.Fatal(err)
	}
	stale := strings.Replace(string(data), "shortNames:\n    - sqi", "shortNames:\n    - stale", 1)
	if stale == string(data) {
		t.Fatal("the CRD has no short name sqi to make stale")
	}
	if err := os.WriteFile(crd, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runVerify(t, dir)
	if err == nil {
		t.Fatalf("verify passed with a stale CRD:\n%s", out)
	}
	if !strings.Contains(out, "config/crd/bases is stale") {
		t.Errorf("verify output does not name the stale CRD directory:\n%s", out)
	}
}

func TestVerifyFailsOnAStaleConfigurationReference(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyTree(t, root, dir)
	reference := filepath.Join(dir, "docs", "reference.md")
	data, err := os.ReadFile(reference)
	if err != nil {
		t.Fatal(err)
	}
	stale := strings.Replace(string(data), "| `poolSize` _integer_ |", "| `poolSize` _string_ |", 1)
	if stale == string(data) {
		t.Fatal("docs/reference.md has no poolSize row to make stale")
	}
	if err := os.WriteFile(reference, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runVerify(t, dir)
	if err == nil || !strings.Contains(out, "docs/reference.md is stale") {
		t.Fatalf("verify with a stale docs/reference.md: %v\n%s\nwant a failure naming docs/reference.md", err, out)
	}
}
