package testenv

import (
	"path/filepath"
	"testing"
)

// DocPages are the README and every page under docs/, as absolute paths, README first: the
// pages that the docs tests read for commands, links and references.
func DocPages(t testing.TB) []string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(root, "README.md")}, pages...)
}
