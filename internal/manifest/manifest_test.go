package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/sink"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// minimal is the smallest valid SequentialInbox: every optional field is left to its default.
const minimal = `
apiVersion: inbox.seqinbox.dev/v1alpha1
kind: SequentialInbox
metadata:
  name: orders
spec:
  kafka:
    bootstrapServers: ["localhost:9092"]
    topics: [orders]
    consumerGroup: orders-inbox
  database:
    urlSecretRef: {name: orders-db, key: url}
  sink:
    url: http://orders-service:8080/events
  sequences:
  - name: order
    retention: 24h
    messages:
    - type: OrderCreated
    - type: OrderPaid
      releaseCondition: {predecessor: OrderCreated}
`

// everythingSet sets every defaulted field to a non-default value.
const everythingSet = `
apiVersion: inbox.seqinbox.dev/v1alpha1
kind: SequentialInbox
metadata:
  name: orders
spec:
  kafka:
    bootstrapServers: ["localhost:9092"]
    topics: [orders]
    consumerGroup: orders-inbox
    maxPollIntervalMs: 60000
  database:
    urlSecretRef: {name: orders-db, key: url}
    poolSize: 4
    idleLockTimeout: 5s
  sink:
    url: http://orders-service:8080/events
    timeout: 2s
    retries: 0
    initialBackoff: 50ms
  deadLetterTopic: orders-dead
  housekeeping:
    interval: 1m
    expiryDelay: 10m
    batchSize: 7
    maxDuration: 20s
  replicas: 3
  upgradeStrategy: Supervised
  sequences:
  - name: order
    retention: 24h
    messages:
    - type: OrderCreated
`

func TestDefaultsMatchTheCRD(t *testing.T) {
	schema := crdSchema(t)
	for name, doc := range map[string]string{"minimal": minimal, "everything set": everythingSet} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse([]byte(doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := defaultedByAPIServer(t, schema, doc)
			if !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
				gotYAML, _ := yaml.Marshal(got.Spec)
				wantYAML, _ := yaml.Marshal(want.Spec)
				t.Fatalf("Default differs from the CRD defaulting.\nmanifest.Parse:\n%s\nAPI server:\n%s", gotYAML, wantYAML)
			}
		})
	}
}

func TestParseAppliesDefaultsAndKeepsExplicitValues(t *testing.T) {
	minimalSpec, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatalf("Parse minimal: %v", err)
	}
	explicit, err := Parse([]byte(everythingSet))
	if err != nil {
		t.Fatalf("Parse everythingSet: %v", err)
	}
	tests := []struct {
		name      string
		got, want any
	}{
		{"default maxPollIntervalMs", minimalSpec.Spec.Kafka.MaxPollIntervalMs, int32(300000)},
		{"default poolSize", minimalSpec.Spec.Database.PoolSize, int32(10)},
		{"default sink timeout", minimalSpec.Spec.Sink.Timeout.Duration, 10 * time.Second},
		{"default sink retries", *minimalSpec.Spec.Sink.Retries, int32(3)},
		{"default housekeeping interval", minimalSpec.Spec.Housekeeping.Interval.Duration, 5 * time.Minute},
		{"default dead-letter topic", DeadLetterTopic(&minimalSpec.Spec), "orders-inbox.dlq"},
		{"explicit retries 0 kept", *explicit.Spec.Sink.Retries, int32(0)},
		{"explicit poolSize kept", explicit.Spec.Database.PoolSize, int32(4)},
		{"explicit dead-letter topic kept", DeadLetterTopic(&explicit.Spec), "orders-dead"},
		{"explicit batch size kept", explicit.Spec.Housekeeping.BatchSize, int32(7)},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name, doc, wantErr string
	}{
		{"unknown field", strings.Replace(minimal, "  sink:\n", "  sinc: {}\n  sink:\n", 1), "spec.sinc: unknown field"},
		{"other apiVersion", strings.Replace(minimal, "v1alpha1", "v1beta9", 1), `apiVersion "inbox.seqinbox.dev/v1beta9"`},
		{"no inbox", "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n", "no SequentialInbox"},
		{"two inboxes", minimal + "\n---\n" + minimal, "a second SequentialInbox"},
		{"not YAML", "spec: [", "document 1"},
		{"a field twice", strings.Replace(minimal, "  sink:\n", "  replicas: 2\n  replicas: 3\n  sink:\n", 1), `key "replicas" already set`},
		{"a typo of a nested field", strings.Replace(minimal, "releaseCondition:", "releaseCondtion:", 1), "spec.sequences[0].messages[1].releaseCondtion: unknown field"},
		{"every unknown field", strings.Replace(minimal, "  sink:\n", "  sinc: {}\n  sink:\n    uri: x\n", 1), "spec.sinc: unknown field; docs/reference.md lists the fields of a SequentialInbox, spec.sink.uri: unknown field"},
		{"a CEL rule of the CRD", strings.Replace(minimal, "    url: http://orders-service:8080/events\n", "    url: http://orders-service:8080/events\n    service: {name: orders}\n", 1), "spec.sink: Invalid value: set exactly one of spec.sink.url and spec.sink.service"},
		{"a schema bound of the CRD", strings.Replace(minimal, "retention: 24h", "retention: 10s", 1), `spec.sequences[0].retention: Invalid value: "10s"`},
		{"a rule on the name", strings.Replace(minimal, "name: orders\n", "name: "+strings.Repeat("o", 41)+"\n", 1), "metadata.name must be a DNS label of at most 40 characters"},
		{"no name", strings.Replace(minimal, "name: orders\n", "namespace: shop\n", 1), "metadata.name: Required value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", got)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q does not say %q", err, tt.wantErr)
			}
		})
	}
}

func TestLoadSkipsOtherDocuments(t *testing.T) {
	secret := "apiVersion: v1\nkind: Secret\nmetadata: {name: orders-db}\nstringData: {url: postgres://x}\n"
	path := filepath.Join(t.TempDir(), "inbox.yaml")
	if err := os.WriteFile(path, []byte(secret+"---\n"+minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got.Name != "orders" || got.Spec.Kafka.ConsumerGroup != "orders-inbox" {
		t.Fatalf("loaded the wrong document: %s / %s", got.Name, got.Spec.Kafka.ConsumerGroup)
	}
}

// crdSchema returns the structural schema of the committed CRD, as the API server builds it.
func crdSchema(t *testing.T) *structuralschema.Structural {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "crd", "bases", "inbox.seqinbox.dev_sequentialinboxes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatalf("decode CRD: %v", err)
	}
	var version *apiextensionsv1.CustomResourceDefinitionVersion
	for i := range crd.Spec.Versions {
		if crd.Spec.Versions[i].Name == v1alpha1.GroupVersion.Version {
			version = &crd.Spec.Versions[i]
		}
	}
	if version == nil {
		t.Fatalf("CRD has no version %s", v1alpha1.GroupVersion.Version)
	}
	var internal apiextensionsinternal.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(version.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
		t.Fatalf("convert schema: %v", err)
	}
	structural, err := structuralschema.NewStructural(&internal)
	if err != nil {
		t.Fatalf("structural schema: %v", err)
	}
	return structural
}

// defaultedByAPIServer applies the CRD's defaults to the manifest the way the API server does
// (structural defaulting on the unstructured object) and decodes the result.
func defaultedByAPIServer(t *testing.T, schema *structuralschema.Structural, doc string) *v1alpha1.SequentialInbox {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	defaulting.Default(obj, schema)
	var inbox v1alpha1.SequentialInbox
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &inbox); err != nil {
		t.Fatalf("decode defaulted object: %v", err)
	}
	return &inbox
}

func TestGroupProtocolNamesTheClaimProtocolAndTheEpochButNotTheEngineVersion(t *testing.T) {
	tests := []struct {
		claimProtocol string
		epoch         int32
		want          string
	}{
		{"insert-first-v1", 0, "seqinbox-insert-first-v1"},
		{"insert-first-v1", 2, "seqinbox-insert-first-v1-epoch2"},
		{"legacy-v0", 0, "seqinbox-legacy-v0"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		got := GroupProtocol(tt.claimProtocol, &v1alpha1.KafkaSpec{GroupProtocolEpoch: tt.epoch})
		if got != tt.want {
			t.Errorf("GroupProtocol(%s, epoch %d) = %q, want %q", tt.claimProtocol, tt.epoch, got, tt.want)
		}
		if seen[got] {
			t.Errorf("two claim protocols or epochs share the group protocol %q", got)
		}
		seen[got] = true
		for _, ordinary := range []string{"range", "roundrobin", "sticky", "cooperative-sticky"} {
			if got == ordinary {
				t.Errorf("GroupProtocol = %q, an ordinary assignor any client supports", got)
			}
		}
	}
}

func TestSinkURLOfAServiceReference(t *testing.T) {
	inbox := func(sink v1alpha1.SinkSpec) *v1alpha1.SequentialInbox {
		in := &v1alpha1.SequentialInbox{Spec: v1alpha1.SequentialInboxSpec{Sink: sink}}
		in.Namespace = "shop"
		return in
	}
	cases := []struct {
		name string
		sink v1alpha1.SinkSpec
		want string
	}{
		{"a URL as it is", v1alpha1.SinkSpec{URL: "https://orders.example.com/events"}, "https://orders.example.com/events"},
		{"defaults: same namespace, http, port 80, /", v1alpha1.SinkSpec{Service: &v1alpha1.SinkServiceReference{Name: "orders"}},
			"http://orders.shop.svc:80/"},
		{"TLS makes https on 443", v1alpha1.SinkSpec{Service: &v1alpha1.SinkServiceReference{Name: "orders"}, TLS: &v1alpha1.SinkTLS{}},
			"https://orders.shop.svc:443/"},
		{"everything set", v1alpha1.SinkSpec{Service: &v1alpha1.SinkServiceReference{Name: "orders", Namespace: "billing", Port: 8443, Path: "/events", Scheme: "https"}},
			"https://orders.billing.svc:8443/events"},
		{"explicit http despite TLS settings", v1alpha1.SinkSpec{Service: &v1alpha1.SinkServiceReference{Name: "orders", Port: 8080, Scheme: "http"}, TLS: &v1alpha1.SinkTLS{}},
			"http://orders.shop.svc:8080/"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := SinkURL(inbox(tc.sink)); got != tc.want {
				t.Errorf("SinkURL = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestADefaultedSpecWrittenBackParsesAgain writes each sample inbox back as the operator renders
// the consumer's configuration (the typed spec with its defaults, serialized) and parses it
// again: the CRD's checks accept everything the typed spec serializes, zero values included, so
// a consumer pod never refuses the manifest the operator gave it.
func TestADefaultedSpecWrittenBackParsesAgain(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"inbox_v1alpha1_sequentialinbox.yaml", "cluster_order-inbox.yaml"} {
		t.Run(name, func(t *testing.T) {
			inbox, err := Load(filepath.Join(root, "config", "samples", name))
			if err != nil {
				t.Fatal(err)
			}
			inbox.Spec.Replicas = nil
			data, err := yaml.Marshal(map[string]any{
				"apiVersion": v1alpha1.GroupVersion.String(), "kind": "SequentialInbox",
				"metadata": map[string]string{"name": inbox.Name, "namespace": "shop"}, "spec": inbox.Spec,
			})
			if err != nil {
				t.Fatal(err)
			}
			again, err := Parse(data)
			if err != nil {
				t.Fatalf("the written-back spec is refused: %v\n%s", err, data)
			}
			again.Spec.Replicas = nil // defaulted again, as the consumer never reads it
			if !equality.Semantic.DeepEqual(again.Spec, inbox.Spec) {
				t.Errorf("the spec changed on the way back:\n%+v\nwant\n%+v", again.Spec, inbox.Spec)
			}
		})
	}
}

// TestTheDocumentedEffectiveIdleLockTimeoutIsTheDefaultSinkDeadlinePlusTheMargin checks the
// value that spec.database.idleLockTimeout's description (and so docs/reference.md) gives for
// the default sink settings: the engine raises the idle lock timeout to the sink's deadline plus
// its lease margin of 5s (internal/inbox, defaultLeaseMargin).
func TestTheDocumentedEffectiveIdleLockTimeoutIsTheDefaultSinkDeadlinePlusTheMargin(t *testing.T) {
	const leaseMargin = 5 * time.Second
	inbox, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	effective := max(inbox.Spec.Database.IdleLockTimeout.Duration, sink.ConfigFor(&inbox.Spec.Sink).Deadline()+leaseMargin)
	if effective <= inbox.Spec.Database.IdleLockTimeout.Duration {
		t.Fatalf("the default idle lock timeout %s is no longer raised (effective %s): say so in its description", inbox.Spec.Database.IdleLockTimeout.Duration, effective)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{filepath.Join("api", "v1alpha1", "sequentialinbox_types.go"), filepath.Join("docs", "reference.md")} {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		if want := "the default sink settings that is " + effective.String(); !strings.Contains(string(data), want) {
			t.Errorf("%s does not say %q", file, want)
		}
	}
}
