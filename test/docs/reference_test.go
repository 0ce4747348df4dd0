package docs_test

import (
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// validationMessages returns the message of every CEL rule (x-kubernetes-validations) of a
// schema tree.
func validationMessages(node any) []string {
	var found []string
	switch n := node.(type) {
	case map[string]any:
		if rules, ok := n["x-kubernetes-validations"].([]any); ok {
			for _, r := range rules {
				if m, ok := r.(map[string]any)["message"].(string); ok {
					found = append(found, m)
				}
			}
		}
		for _, v := range n {
			found = append(found, validationMessages(v)...)
		}
	case []any:
		for _, v := range n {
			found = append(found, validationMessages(v)...)
		}
	}
	return found
}

// TestTheReferenceStatesEveryRuleOfTheCRDs checks that docs/reference.md states every CEL rule
// of the generated CRDs by its message (the cross-field rules, such as the length of the name or
// url and service, live nowhere else), and renders no type as a Go struct literal.
func TestTheReferenceStatesEveryRuleOfTheCRDs(t *testing.T) {
	root := repoRoot(t)
	reference := readFile(t, filepath.Join(root, "docs", "reference.md"))
	crds, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	rules := 0
	for _, file := range crds {
		var crd map[string]any
		if err := yaml.Unmarshal([]byte(readFile(t, file)), &crd); err != nil {
			t.Fatal(err)
		}
		for _, message := range validationMessages(crd) {
			rules++
			if !strings.Contains(reference, message) {
				t.Errorf("docs/reference.md does not state the rule %q of %s", message, filepath.Base(file))
			}
		}
	}
	if rules < 10 {
		t.Fatalf("found %d rules in the CRDs; the test no longer reads them", rules)
	}
	if strings.Contains(reference, "struct{") {
		t.Error("docs/reference.md renders a type as a Go struct literal: raise crd-ref-docs' --max-depth in the Makefile")
	}
}
