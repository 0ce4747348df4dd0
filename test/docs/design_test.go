package docs_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// oldSpecCitation is how the code once cited a design text that is not in the repository, by
// section number (the word SPEC, then the section sign and the number, or the sign alone); the
// sign is written as an escape, so that this file does not cite it.
var oldSpecCitation = regexp.MustCompile("\u00a7 ?[0-9]")

// oldCitationsAllowed are the tracked files that may still cite the old text by number
// (docs/design.md itself reads the old numbers in its last section): migrations that are applied
// in databases, whose checksums are in every ledger, so that an edit would make those databases
// refuse the binary; docs/design.md#old-section-numbers reads their numbers.
//
// A listed file that no longer cites it fails the test, so the list only shrinks.
var oldCitationsAllowed = []string{
	"migrations/0001_base.sql",
	"migrations/0003_consumer_registry.sql",
	"migrations/0005_operator_actions.sql",
	"migrations/0006_duplicate_protection.sql",
	"migrations/0007_inbox_owner.sql",
	"migrations/0008_consumer_blocked_record.sql",
}

// trackedFiles returns the repository's tracked files (relative paths) with their content.
func trackedFiles(t *testing.T) map[string]string {
	t.Helper()
	root := repoRoot(t)
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := map[string]string{}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		data, err := os.ReadFile(filepath.Join(root, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(data, 0) >= 0 {
			continue // binary
		}
		files[name] = string(data)
	}
	if len(files) == 0 {
		t.Fatal("git ls-files listed no files")
	}
	return files
}

func TestNoFileCitesTheDesignTextOutsideTheRepository(t *testing.T) {
	citing := map[string]bool{}
	for name, data := range trackedFiles(t) {
		for i, line := range strings.Split(data, "\n") {
			if !oldSpecCitation.MatchString(line) || name == "docs/design.md" {
				continue
			}
			citing[name] = true
			if !slices.Contains(oldCitationsAllowed, name) {
				t.Errorf("%s:%d cites a section by number (%s), of a text users do not have: cite the section of docs/design.md (docs/design.md#<anchor>)",
					name, i+1, oldSpecCitation.FindString(line))
			}
		}
	}
	for _, name := range oldCitationsAllowed {
		if !citing[name] {
			t.Errorf("%s no longer cites a section by number: remove it from oldCitationsAllowed", name)
		}
	}
}

// anchors returns the anchors of a Markdown page's headings as GitHub renders them: lower case,
// punctuation dropped, spaces as hyphens, a repeated heading numbered from -1.
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		m := regexp.MustCompile(`^#{1,6} +(.+?) *$`).FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchor := b.String()
		for n := 1; out[anchor]; n++ {
			anchor = b.String() + "-" + strconv.Itoa(n)
		}
		out[anchor] = true
	}
	return out
}

func TestAnchorsFollowTheHeadings(t *testing.T) {
	got := anchors("# Design\n## Claim transaction T1\n```sh\n# not a heading\n```\n### `ce-type` and more, too\n## Design\n")
	for _, want := range []string{"design", "claim-transaction-t1", "ce-type-and-more-too", "design-1"} {
		if !got[want] {
			t.Errorf("anchors lack %q: %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a comment in a code block counted as a heading: %v", got)
	}
}

// TestEveryDesignCitationResolves checks every citation of a docs/design.md section in a tracked
// file (docs/design.md#<anchor> in code, design.md#<anchor> in a page, #<anchor> inside design.md
// itself) against the headings of the page.
func TestEveryDesignCitationResolves(t *testing.T) {
	files := trackedFiles(t)
	design, ok := files["docs/design.md"]
	if !ok {
		t.Fatal("docs/design.md is not tracked")
	}
	have := anchors(design)
	cited := 0
	check := func(name string, re *regexp.Regexp, data string) {
		for i, line := range strings.Split(data, "\n") {
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				cited++
				if !have[m[1]] {
					t.Errorf("%s:%d cites docs/design.md#%s, which is no heading of docs/design.md", name, i+1, m[1])
				}
			}
		}
	}
	for name, data := range files {
		check(name, regexp.MustCompile(`design\.md#([A-Za-z0-9_-]+)`), data)
	}
	check("docs/design.md", regexp.MustCompile(`\]\(#([A-Za-z0-9_-]+)\)`), design)
	if cited < 40 {
		t.Errorf("found %d citations of docs/design.md; the code cites it in more places: the test's pattern no longer matches", cited)
	}
}
