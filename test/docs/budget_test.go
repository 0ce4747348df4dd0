package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestTheConnectionBudgetHasOneFormula checks every place that states what a consumer counts
// against spec.database.connectionBudget (the docs and the API's comments, from which the
// reference is generated): poolSize plus v1alpha1.MaintenanceConnections, never poolSize alone.
func TestTheConnectionBudgetHasOneFormula(t *testing.T) {
	root := repoRoot(t)
	files := testenv.DocPages(t)
	api, err := filepath.Glob(filepath.Join(root, "api", "v1alpha1", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	plus := regexp.MustCompile("poolSize`?\\s*\\+\\s*(\\d+)")
	alone := regexp.MustCompile("×\\s*`?(?:spec\\.database\\.)?poolSize`?(?:\\s*[^\\s+`]|\\s*$)")
	found := 0
	for _, file := range append(files, api...) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, m := range plus.FindAllStringSubmatch(string(data), -1) {
			found++
			if n, _ := strconv.Atoi(m[1]); n != v1alpha1.MaintenanceConnections {
				t.Errorf("%s: %q counts %d connections besides the pool; a consumer holds %d", rel, m[0], n, v1alpha1.MaintenanceConnections)
			}
		}
		for _, m := range alone.FindAllString(string(data), -1) {
			t.Errorf("%s: %q counts the pool alone; a consumer also holds %d maintenance connections", rel, m, v1alpha1.MaintenanceConnections)
		}
	}
	if found == 0 {
		t.Fatal("no page states the budget formula; the pattern no longer matches the docs")
	}
}
