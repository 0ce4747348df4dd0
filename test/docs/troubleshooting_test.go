package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// codeTexts returns the non-test Go sources under dirs, concatenated: where the texts a consumer
// writes to /readyz and its log are defined.
func codeTexts(t *testing.T, dirs ...string) string {
	t.Helper()
	root := repoRoot(t)
	var b strings.Builder
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				b.WriteString(readFile(t, path))
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// symptomTexts returns the backticked texts of the first column of the tables in a section of
// docs/troubleshooting.md (from its heading to the next heading).
func symptomTexts(t *testing.T, page, heading string) []string {
	t.Helper()
	_, section, ok := strings.Cut(page, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/troubleshooting.md has no section %q", heading)
	}
	if i := strings.Index(section, "\n#"); i >= 0 {
		section = section[:i]
	}
	var texts []string
	for _, row := range regexp.MustCompile(`(?m)^\| ([^|]+?) \|`).FindAllStringSubmatch(section, -1) {
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(row[1], -1) {
			texts = append(texts, m[1])
		}
	}
	return texts
}

// TestEveryTroubleshootingSymptomIsATextTheCodeWrites checks that each readiness text and log
// line that docs/troubleshooting.md quotes is written by the code: every part between the `…`
// that stand for what varies occurs in the sources, so a changed message fails here instead of
// leaving the page describing a line nobody sees.
func TestEveryTroubleshootingSymptomIsATextTheCodeWrites(t *testing.T) {
	page := readFile(t, filepath.Join(repoRoot(t), "docs", "troubleshooting.md"))
	code := codeTexts(t, "internal", "cmd", "migrations")
	for _, heading := range []string{"### A consumer is not ready", "### Log lines"} {
		texts := symptomTexts(t, page, heading)
		if len(texts) < 10 {
			t.Fatalf("found %d quoted texts in %q of docs/troubleshooting.md; the test's pattern no longer matches the page", len(texts), heading)
		}
		for _, text := range texts {
			for _, part := range strings.Split(text, "…") {
				if part = strings.TrimSpace(part); part != "" && !strings.Contains(code, part) {
					t.Errorf("docs/troubleshooting.md (%s) quotes %q, but no source writes %q", strings.TrimLeft(heading, "# "), text, part)
				}
			}
		}
	}
}

func TestSymptomTextsAreTheFirstColumnsQuotes(t *testing.T) {
	page := "\n## X\n\n| Says | Cause |\n|---|---|\n| `a` / `b …` | `not this` |\n| `c` … | x |\n| none | x |\n\n## Y\n| `d` | x |\n"
	if got := symptomTexts(t, page, "## X"); strings.Join(got, ",") != "a,b …,c" {
		t.Errorf("symptomTexts = %q, want a, b …, c", got)
	}
}
