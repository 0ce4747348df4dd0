// Package docs_test keeps the documentation in step with the code: every metric, dead-letter
// header and reason, and condition reason the code defines is documented (and nothing else), the
// README's schema version is the build's, and every link stays inside the repository.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// sourceMatches returns the first group of every match of re in the non-test Go files under dirs
// (relative to the repository root), sorted and without duplicates.
func sourceMatches(t *testing.T, re *regexp.Regexp, dirs ...string) []string {
	t.Helper()
	root := repoRoot(t)
	var found []string
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			for _, m := range re.FindAllStringSubmatch(readFile(t, path), -1) {
				found = append(found, m[1])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(found)
	return slices.Compact(found)
}

// tableNames returns the backticked names that start the rows of the Markdown tables of a page.
func tableNames(page string) []string {
	var names []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([^`]+)` \\|").FindAllStringSubmatch(page, -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// compare reports names of the code missing from the page and names of the page the code lacks.
func compare(t *testing.T, page string, code, documented []string) {
	t.Helper()
	if len(code) == 0 {
		t.Fatalf("found no names in the code for %s: the test's pattern no longer matches the code", page)
	}
	for _, name := range code {
		if !slices.Contains(documented, name) {
			t.Errorf("%s does not document %s", page, name)
		}
	}
	for _, name := range documented {
		if !slices.Contains(code, name) {
			t.Errorf("%s documents %s, which the code does not define", page, name)
		}
	}
}

func TestMetricsReferenceNamesEveryMetric(t *testing.T) {
	code := sourceMatches(t, regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(seqinbox_[a-z_]+)"`), "internal")
	page := readFile(t, filepath.Join(repoRoot(t), "docs", "metrics.md"))
	compare(t, "docs/metrics.md", code, tableNames(page))
}

func TestDeadLetterReferenceNamesEveryHeaderAndReason(t *testing.T) {
	root := repoRoot(t)
	page := readFile(t, filepath.Join(root, "docs", "dead-letters.md"))
	documented := tableNames(page)

	prefix := regexp.MustCompile(`HeaderPrefix\s*=\s*"([a-z-]+)"`).FindStringSubmatch(readFile(t, filepath.Join(root, "internal", "deadletter", "deadletter.go")))
	if prefix == nil {
		t.Fatal("internal/deadletter defines no HeaderPrefix")
	}
	var code []string
	for _, h := range sourceMatches(t, regexp.MustCompile(`Header\w+\s*=\s*HeaderPrefix \+ "([a-z-]+)"`), "internal/deadletter") {
		code = append(code, prefix[1]+h)
	}
	code = append(code, sourceMatches(t, regexp.MustCompile(`(?m)^\s*Reason\w+\s*=\s*"([A-Za-z]+)"`), "internal/deadletter")...)
	code = append(code, sourceMatches(t, regexp.MustCompile(`(?m)^\s*Class\w+\s*=\s*"([A-Za-z]+)"`), "internal/decode")...)
	slices.Sort(code)
	compare(t, "docs/dead-letters.md", code, documented)
}

// TestEveryDeadLetterReasonIsInTheListThatRetryAccepts checks deadletter.Reasons, the reasons
// `deadletters retry --filter-reason` accepts, against the reason constants of the code.
func TestEveryDeadLetterReasonIsInTheListThatRetryAccepts(t *testing.T) {
	code := append(sourceMatches(t, regexp.MustCompile(`(?m)^\s*Reason\w+\s*=\s*"([A-Za-z]+)"`), "internal/deadletter"),
		sourceMatches(t, regexp.MustCompile(`(?m)^\s*Class\w+\s*=\s*"([A-Za-z]+)"`), "internal/decode")...)
	slices.Sort(code)
	if got := deadletter.Reasons(); !slices.Equal(got, code) {
		t.Errorf("deadletter.Reasons() = %v, want every reason constant %v", got, code)
	}
}

func TestTroubleshootingNamesEveryConditionAndReason(t *testing.T) {
	code := sourceMatches(t, regexp.MustCompile(`(?m)^\s*(?:const\s+)?(?:Condition\w+|\w+Reason|reason\w+)\s*=\s*"([A-Z][A-Za-z]+)"`), "api", "internal/controller")
	page := readFile(t, filepath.Join(repoRoot(t), "docs", "troubleshooting.md"))
	_, reasons, ok := strings.Cut(page, "\n## Conditions and reasons\n")
	if !ok {
		t.Fatal("docs/troubleshooting.md has no section Conditions and reasons")
	}
	compare(t, "docs/troubleshooting.md", code, tableNames(reasons))
}

func TestEveryReasonConstantIsNamedAsItsValue(t *testing.T) {
	re := regexp.MustCompile(`(?m)^\s*(?:const\s+)?(\w+)Reason\s*=\s*"(\w+)"`)
	data := readFile(t, filepath.Join(repoRoot(t), "api", "v1alpha1", "conditions.go"))
	matches := re.FindAllStringSubmatch(data, -1)
	if len(matches) == 0 {
		t.Fatal("api/v1alpha1/conditions.go defines no …Reason constants")
	}
	for _, m := range matches {
		if m[1] != m[2] {
			t.Errorf("%sReason = %q: name a reason constant as its value (%sReason)", m[1], m[2], m[2])
		}
	}
}

func TestReadmeShowsTheSchemaVersionOfThisBuild(t *testing.T) {
	readme := readFile(t, filepath.Join(repoRoot(t), "README.md"))
	versions := regexp.MustCompile(`schema version (\d+)`).FindAllStringSubmatch(readme, -1)
	if len(versions) == 0 {
		t.Fatal("README.md shows no schema version")
	}
	for _, v := range versions {
		if v[1] != strconv.Itoa(migrations.Latest()) {
			t.Errorf("README.md says %q; this build migrates to schema version %d", v[0], migrations.Latest())
		}
	}
}

func TestEveryLinkStaysInsideTheRepositoryAndResolves(t *testing.T) {
	root := repoRoot(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	code := regexp.MustCompile("`[^`\n]*`")
	for _, file := range testenv.DocPages(t) {
		for _, m := range link.FindAllStringSubmatch(code.ReplaceAllString(readFile(t, file), ""), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" {
				continue
			}
			rel, _ := filepath.Rel(root, file)
			// The generated reference links the Kubernetes types it embeds (ObjectMeta, Duration)
			// to their upstream API reference; every other page stays inside the repository.
			if rel == filepath.Join("docs", "reference.md") && strings.HasPrefix(target, "https://kubernetes.io/docs/reference/") {
				continue
			}
			if strings.Contains(target, "://") {
				t.Errorf("%s links outside the repository: %s", rel, m[1])
				continue
			}
			path := filepath.Join(filepath.Dir(file), target)
			if inside, err := filepath.Rel(root, path); err != nil || strings.HasPrefix(inside, "..") {
				t.Errorf("%s links outside the repository: %s", rel, m[1])
			} else if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, m[1])
			}
		}
	}
}

func TestTheDocsIndexLinksEveryPage(t *testing.T) {
	root := repoRoot(t)
	index := readFile(t, filepath.Join(root, "docs", "README.md"))
	for _, page := range testenv.DocPages(t)[1:] {
		name := filepath.Base(page)
		if name != "README.md" && !strings.Contains(index, "]("+name+")") {
			t.Errorf("docs/README.md does not link docs/%s", name)
		}
	}
}

// TestTheProducerGuideShowsItsExampleAsItIs checks that the Go program docs/producers.md shows is
// docs/examples/producer/main.go, the file its test runs against a broker, byte for byte.
func TestTheProducerGuideShowsItsExampleAsItIs(t *testing.T) {
	root := repoRoot(t)
	page := readFile(t, filepath.Join(root, "docs", "producers.md"))
	_, block, ok := strings.Cut(page, "```go\n")
	if !ok {
		t.Fatal("docs/producers.md shows no Go example")
	}
	block, _, _ = strings.Cut(block, "```")
	if want := readFile(t, filepath.Join(root, "docs", "examples", "producer", "main.go")); block != want {
		t.Errorf("the Go example of docs/producers.md differs from docs/examples/producer/main.go; copy the file into the page")
	}
}

// TestTheArchitecturePageDrawsItsDiagrams checks that docs/architecture.md carries the picture of
// the parts and the one of a message's life as Mermaid blocks, which render where users read the
// repository, each opening with a diagram type Mermaid knows.
func TestTheArchitecturePageDrawsItsDiagrams(t *testing.T) {
	page := readFile(t, filepath.Join(repoRoot(t), "docs", "architecture.md"))
	blocks := regexp.MustCompile("(?m)^```mermaid\n([a-zA-Z]+)").FindAllStringSubmatch(page, -1)
	var kinds []string
	for _, b := range blocks {
		kinds = append(kinds, b[1])
	}
	if !slices.Equal(kinds, []string{"flowchart", "sequenceDiagram"}) {
		t.Errorf("docs/architecture.md draws %v, want a flowchart of the parts and a sequenceDiagram of a message's life", kinds)
	}
}

// TestTheCompatibilityPageNamesTheVersionsTheTestsUse checks docs/compatibility.md against the
// versions the repository pins: Kubernetes in hack/envtest.sh and hack/cluster/lib.sh, and the
// client libraries in go.mod.
func TestTheCompatibilityPageNamesTheVersionsTheTestsUse(t *testing.T) {
	root := repoRoot(t)
	page := readFile(t, filepath.Join(root, "docs", "compatibility.md"))
	for _, script := range []string{filepath.Join("hack", "envtest.sh"), filepath.Join("hack", "cluster", "lib.sh")} {
		m := regexp.MustCompile(`(?m)^K8S_VERSION=(v[0-9.]+)$`).FindStringSubmatch(readFile(t, filepath.Join(root, script)))
		if m == nil {
			t.Fatalf("%s sets no K8S_VERSION", script)
		}
		if !strings.Contains(page, "| Kubernetes | "+m[1]+" |") {
			t.Errorf("docs/compatibility.md does not name Kubernetes %s, which %s runs", m[1], script)
		}
	}
	gomod := readFile(t, filepath.Join(root, "go.mod"))
	for module, name := range map[string]string{
		"k8s.io/client-go": "client-go", "sigs.k8s.io/controller-runtime": "controller-runtime",
		"github.com/jackc/pgx/v5": "pgx", "github.com/twmb/franz-go": "franz-go",
	} {
		m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(module) + ` (v[0-9.]+)$`).FindStringSubmatch(gomod)
		if m == nil {
			t.Fatalf("go.mod requires no %s", module)
		}
		if !strings.Contains(page, name+" "+m[1]) {
			t.Errorf("docs/compatibility.md does not name %s %s, which go.mod requires", name, m[1])
		}
	}
}
