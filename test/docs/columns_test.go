package docs_test

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestTheColumnsOfKubectlGetAreDocumented checks the table of the columns of `kubectl get sqi`
// in docs/troubleshooting.md against the printer columns of the CRD: every column, in order,
// shown always (priority 0) or only with -o wide.
func TestTheColumnsOfKubectlGetAreDocumented(t *testing.T) {
	root := repoRoot(t)
	var crd struct {
		Spec struct {
			Versions []struct {
				Columns []struct {
					Name     string `json:"name"`
					Priority int    `json:"priority"`
				} `json:"additionalPrinterColumns"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(root, "config", "crd", "bases", "inbox.seqinbox.dev_sequentialinboxes.yaml"))), &crd); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range crd.Spec.Versions[0].Columns {
		shown := "always"
		if c.Priority > 0 {
			shown = "`-o wide`"
		}
		want = append(want, c.Name+" | "+shown)
	}
	page := readFile(t, filepath.Join(root, "docs", "troubleshooting.md"))
	_, section, ok := strings.Cut(page, "## The columns of `kubectl get sqi`\n")
	if !ok {
		t.Fatal("docs/troubleshooting.md has no section on the columns of kubectl get sqi")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^\| ([A-Z][A-Za-z-]*) \| ([^|]+) \|`).FindAllStringSubmatch(section, -1) {
		if m[1] == "Column" {
			continue // the header
		}
		got = append(got, m[1]+" | "+strings.TrimSpace(m[2]))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("docs/troubleshooting.md lists the columns\n%s\nthe CRD has\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
