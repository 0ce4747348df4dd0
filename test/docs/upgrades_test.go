package docs_test

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestTheBundleUpdatesTheCRDsBeforeTheOperator checks what docs/upgrades.md says of the install
// bundle (`kustomize build config/default`, as `make build-installer` writes it): the namespace
// and the CRDs come first, the operator's Deployment last, and the operator runs with leader
// election, so one apply updates the schemas before a new operator starts and two operators
// never reconcile at once.
func TestTheBundleUpdatesTheCRDsBeforeTheOperator(t *testing.T) {
	root := repoRoot(t)
	cmd := exec.CommandContext(t.Context(), "go", "tool", "-modfile=hack/tools/go.mod", "kustomize", "build", "config/default")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build config/default: %v", err)
	}
	var kinds []string
	for _, m := range regexp.MustCompile(`(?m)^kind: (\w+)$`).FindAllStringSubmatch(string(out), -1) {
		kinds = append(kinds, m[1])
	}
	if len(kinds) < 4 || kinds[0] != "Namespace" || kinds[1] != "CustomResourceDefinition" || kinds[2] != "CustomResourceDefinition" {
		t.Errorf("the bundle begins with %v, want the Namespace and the two CRDs", kinds[:min(3, len(kinds))])
	}
	if slices.Index(kinds, "Deployment") != len(kinds)-1 || strings.Count(strings.Join(kinds, " "), "Deployment") != 1 {
		t.Errorf("the bundle holds %v, want the operator's Deployment last", kinds)
	}
	if !strings.Contains(string(out), "- --leader-elect\n") {
		t.Error("the operator's Deployment does not pass --leader-elect")
	}
	page := readFile(t, root+"/docs/upgrades.md")
	for _, claim := range []string{"the namespace and the CRDs first and the operator's Deployment last", "`--leader-elect`"} {
		if !strings.Contains(page, claim) {
			t.Errorf("docs/upgrades.md no longer says %q; keep the page and this test together", claim)
		}
	}
}
