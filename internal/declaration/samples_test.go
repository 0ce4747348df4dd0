package declaration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

const samplesDir = "../../config/samples"

// documentSeparator splits a multi-document YAML file.
var documentSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// TestEverySampleCompiles keeps the samples that users, the consumer and the demo start from
// valid: every SequentialInbox under config/samples must parse strictly and compile.
func TestEverySampleCompiles(t *testing.T) {
	inboxes := samples(t)
	if len(inboxes) == 0 {
		t.Fatalf("no SequentialInbox under %s; the sample test would prove nothing", samplesDir)
	}
	for name, inbox := range inboxes {
		t.Run(name, func(t *testing.T) {
			set, errs := Compile(&inbox.Spec)
			if len(errs) > 0 {
				t.Fatalf("sample does not compile:\n%v", errs.ToAggregate())
			}
			if len(set.Sequences()) != len(inbox.Spec.Sequences) {
				t.Errorf("compiled %d sequences, the sample declares %d", len(set.Sequences()), len(inbox.Spec.Sequences))
			}
		})
	}
}

// TestOrderSampleReleasesInBusinessOrder pins what the demo relies on: the order sample's types,
// their release conditions and the longest release chain.
func TestOrderSampleReleasesInBusinessOrder(t *testing.T) {
	inbox, ok := samples(t)["inbox_v1alpha1_sequentialinbox.yaml/order-inbox"]
	if !ok {
		t.Fatal("the order-inbox sample is missing")
	}
	set, errs := Compile(&inbox.Spec)
	if len(errs) > 0 {
		t.Fatalf("sample does not compile: %v", errs.ToAggregate())
	}
	order, ok := set.Sequence("order")
	if !ok {
		t.Fatal("sequence order is missing")
	}
	var types []string
	for _, mt := range order.Types {
		types = append(types, mt.Qualified)
	}
	want := []string{"OrderCreated", "OrderValidated.STOCK_AVAILABLE", "OrderPaid", "OrderShipped", "OrderDelivered"}
	if len(types) != len(want) {
		t.Fatalf("types = %v, want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("types = %v, want %v", types, want)
		}
	}

	shipped := mustLookup(t, set, "OrderShipped")
	paidOnly := map[string]bool{"OrderCreated": true, "OrderPaid": true}
	if shipped.Condition.Holds(paidOnly) {
		t.Error("OrderShipped is released before the stock was validated")
	}
	paidAndValidated := map[string]bool{"OrderCreated": true, "OrderPaid": true, "OrderValidated.STOCK_AVAILABLE": true}
	if !shipped.Condition.Holds(paidAndValidated) {
		t.Error("OrderShipped is not released after OrderPaid and OrderValidated.STOCK_AVAILABLE")
	}
	if created := mustLookup(t, set, "OrderCreated"); created.Filter == "" || created.Condition != nil {
		t.Errorf("OrderCreated = %+v, want a test-order filter and no condition", created)
	}
	if got := LongestChain(set); got != 5 {
		t.Errorf("LongestChain = %d, want 5: a late OrderCreated releases itself and all four waiting types", got)
	}
}

// samples reads every SequentialInbox document under config/samples, keyed by "file/name".
func samples(t *testing.T) map[string]v1alpha1.SequentialInbox {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]v1alpha1.SequentialInbox{}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range documentSeparator.Split(string(raw), -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if meta.Kind != "SequentialInbox" {
				continue
			}
			if meta.APIVersion != v1alpha1.GroupVersion.String() {
				t.Fatalf("%s: apiVersion %q, want %q", file, meta.APIVersion, v1alpha1.GroupVersion)
			}
			var inbox v1alpha1.SequentialInbox
			if err := yaml.UnmarshalStrict([]byte(doc), &inbox); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			out[filepath.Base(file)+"/"+inbox.Name] = inbox
		}
	}
	return out
}
