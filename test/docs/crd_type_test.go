package docs_test

import (
	"path/filepath"
	"regexp"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/declaration"
)

// TestTheCRDAndTheDeclarationAcceptTheSameMessageTypes checks the pattern that the generated CRD
// gives spec.sequences[].messages[].type (the API server matches it with Go's regexp package, as
// here) against the semantic validation: CloudEvents types with dots and spaces are accepted by
// both, control characters refused by both, so a type the operator would accept is never
// refused by kubectl apply, and the other way round.
func TestTheCRDAndTheDeclarationAcceptTheSameMessageTypes(t *testing.T) {
	var crd apiextensionsv1.CustomResourceDefinition
	data := readFile(t, filepath.Join(repoRoot(t), "config", "crd", "bases", "inbox.seqinbox.dev_sequentialinboxes.yaml"))
	if err := yaml.Unmarshal([]byte(data), &crd); err != nil {
		t.Fatal(err)
	}
	messages := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["sequences"].Items.Schema.Properties["messages"].Items.Schema
	pattern := regexp.MustCompile(messages.Properties["type"].Pattern)
	for typ, valid := range map[string]bool{
		"OrderCreated":              true,
		"com.example.order.created": true,
		"com.example.order.paid v2": true,
		"ørder.créé":                true,
		"Order\tCreated":            false,
		"Order\nCreated":            false,
		"Order\u0085Created":        false,
	} {
		if got := pattern.MatchString(typ); got != valid {
			t.Errorf("the CRD's pattern %s matches %q: %v, want %v", pattern, typ, got, valid)
		}
		spec := &v1alpha1.SequentialInboxSpec{Sequences: []v1alpha1.SequenceSpec{{
			Name: "s", Retention: v1alpha1.Duration{Duration: declaration.MinRetention},
			Messages: []v1alpha1.MessageSpec{{Type: typ}},
		}}}
		if _, errs := declaration.Compile(spec); (len(errs) == 0) != valid {
			t.Errorf("Compile of type %q: %v, want valid %v", typ, errs.ToAggregate(), valid)
		}
	}
}
