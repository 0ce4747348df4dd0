package docs_test

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestEveryEnvironmentVariableIsDocumented checks that each SEQINBOX_ variable that the code of
// the binary (cmd, internal) reads or sets is named on a page of the docs or the README, and
// that the pages name no SEQINBOX_ variable that neither the code nor the scripts (hack) know.
func TestEveryEnvironmentVariableIsDocumented(t *testing.T) {
	root := repoRoot(t)
	quoted := regexp.MustCompile(`"(SEQINBOX_[A-Z0-9_]+)"`)
	code := sourceMatches(t, quoted, "cmd", "internal")
	var pages strings.Builder
	for _, page := range testenv.DocPages(t) {
		pages.WriteString(readFile(t, page))
	}
	for _, name := range code {
		if !strings.Contains(pages.String(), "`"+name) {
			t.Errorf("no page of the docs names %s, which the code reads", name)
		}
	}
	scripts, err := filepath.Glob(filepath.Join(root, "hack", "*.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var known strings.Builder
	for _, s := range scripts {
		known.WriteString(readFile(t, s))
	}
	for _, m := range regexp.MustCompile(`\b(SEQINBOX_[A-Z0-9_]*[A-Z0-9])\b`).FindAllStringSubmatch(pages.String(), -1) {
		if !slices.Contains(code, m[1]) && !strings.Contains(known.String(), m[1]) {
			t.Errorf("the docs name %s, which neither the code nor a script of hack/ knows", m[1])
		}
	}
}
