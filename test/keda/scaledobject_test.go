// Package keda validates the KEDA sample (config/samples/keda_scaledobject_order-inbox.yaml)
// against KEDA itself, taken from the KEDA module version that hack/keda/go.mod pins (a module of
// its own: nothing of KEDA is linked into seqinbox): its CRDs on a real API server, and the
// parameters of its Kafka scaler from the scaler's source.
package keda

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// kedaModule is the Go module whose config/crd/bases holds KEDA's CRDs.
const kedaModule = "github.com/kedacore/keda/v2"

// kedaModuleDir returns the directory of the KEDA module version pinned by hack/keda/go.mod,
// which `go mod download` fetches from the module proxy (or finds in the module cache).
func kedaModuleDir(t *testing.T, root string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", kedaModule)
	cmd.Dir = filepath.Join(root, "hack", "keda")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var mod struct{ Version, Dir, Error string }
	if jsonErr := json.Unmarshal(out, &mod); err != nil || jsonErr != nil || mod.Error != "" {
		t.Fatalf("download %s pinned in hack/keda/go.mod: %v %v %s %s", kedaModule, err, jsonErr, mod.Error, stderr.String())
	}
	t.Logf("KEDA CRDs and Kafka scaler of %s %s", kedaModule, mod.Version)
	return mod.Dir
}

// kafkaParameter is a parameter of KEDA's Kafka scaler, from the keda:"..." tag of its metadata
// struct: where it may come from (triggerMetadata, authParams) and its allowed values.
type kafkaParameter struct {
	order, enum []string
}

// kafkaParameters reads the parameters of KEDA's Kafka scaler from its source in the module
// (pkg/scalers/kafka_scaler.go, struct kafkaMetadata), so that a misspelt or unknown trigger
// parameter, which the CRD's schema (a map of strings) lets through, is found.
func kafkaParameters(t *testing.T, moduleDir string) map[string]kafkaParameter {
	t.Helper()
	path := filepath.Join(moduleDir, "pkg", "scalers", "kafka_scaler.go")
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]kafkaParameter{}
	ast.Inspect(file, func(n ast.Node) bool {
		spec, ok := n.(*ast.TypeSpec)
		if !ok || spec.Name.Name != "kafkaMetadata" {
			return true
		}
		for _, field := range spec.Type.(*ast.StructType).Fields.List {
			if field.Tag == nil {
				continue
			}
			tag, err := strconv.Unquote(field.Tag.Value)
			if err != nil {
				t.Fatal(err)
			}
			var name string
			var p kafkaParameter
			for _, part := range strings.Split(reflect.StructTag(tag).Get("keda"), ",") {
				key, value, _ := strings.Cut(part, "=")
				switch key {
				case "name":
					name = value
				case "order":
					p.order = strings.Split(value, ";")
				case "enum":
					p.enum = strings.Split(value, ";")
				}
			}
			if name != "" {
				params[name] = p
			}
		}
		return false
	})
	if len(params) < 10 || len(params["consumerGroup"].order) == 0 {
		t.Fatalf("read %d parameters of KEDA's Kafka scaler from %s; its source changed shape", len(params), path)
	}
	return params
}

// checkParameter checks one parameter against KEDA's Kafka scaler: known, allowed from where,
// and one of its values.
func checkParameter(t *testing.T, params map[string]kafkaParameter, where, name, value string) {
	t.Helper()
	p, ok := params[name]
	switch {
	case !ok:
		t.Errorf("%s parameter %q is no parameter of KEDA's Kafka scaler", where, name)
	case !slices.Contains(p.order, where):
		t.Errorf("parameter %q is read from %v, not from %s", name, p.order, where)
	case value != "" && len(p.enum) > 0 && !slices.Contains(p.enum, value):
		t.Errorf("%s parameter %s = %q, KEDA takes one of %v", where, name, value, p.enum)
	}
}

// documents reads the objects of a multi-document YAML file.
func documents(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// scaledObject is the part of KEDA's ScaledObject the sample's checks read.
type scaledObject struct {
	Spec struct {
		ScaleTargetRef struct{ APIVersion, Kind, Name string } `json:"scaleTargetRef"`
		Triggers       []struct {
			Type              string                `json:"type"`
			Metadata          map[string]string     `json:"metadata"`
			AuthenticationRef struct{ Name string } `json:"authenticationRef"`
		} `json:"triggers"`
	} `json:"spec"`
}

// triggerAuthentication is the part of KEDA's TriggerAuthentication the checks read.
type triggerAuthentication struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		SecretTargetRef []struct{ Parameter, Name, Key string } `json:"secretTargetRef"`
	} `json:"spec"`
}

// kedaSASL is KEDA's name of each SASL mechanism of spec.kafka.sasl.mechanism.
var kedaSASL = map[string]string{"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}

func TestKEDASampleIsAcceptedAndScalesTheSampleInboxOnItsConsumerGroup(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	moduleDir := kedaModuleDir(t, root)
	crds := filepath.Join(moduleDir, "config", "crd", "bases")
	params := kafkaParameters(t, moduleDir)
	ctrllog.SetLogger(logr.Discard())
	env, err := testenv.APIServer()
	if err != nil {
		t.Fatal(err)
	}
	env.CRDInstallOptions.Paths = append(env.CRDInstallOptions.Paths,
		filepath.Join(crds, "keda.sh_scaledobjects.yaml"), filepath.Join(crds, "keda.sh_triggerauthentications.yaml"))
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	// Strict: a field that KEDA's schema does not know is an error, not silently dropped.
	strict := client.WithFieldValidation(c, metav1.FieldValidationStrict)
	ctx := context.Background()
	const namespace = "shop"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}

	samples := filepath.Join(root, "config", "samples")
	var inboxDoc *unstructured.Unstructured
	for _, u := range documents(t, filepath.Join(samples, "cluster_order-inbox.yaml")) {
		if u.GetKind() == "SequentialInbox" {
			inboxDoc = u
		}
	}
	if inboxDoc == nil {
		t.Fatal("cluster_order-inbox.yaml holds no SequentialInbox")
	}
	keda := documents(t, filepath.Join(samples, "keda_scaledobject_order-inbox.yaml"))
	for _, u := range append([]*unstructured.Unstructured{inboxDoc}, keda...) {
		u.SetNamespace(namespace)
		if err := strict.Create(ctx, u); err != nil {
			t.Fatalf("create %s %s of the samples: %v", u.GetKind(), u.GetName(), err)
		}
	}

	// The check above can fail: KEDA's schema refuses a misspelt trigger field.
	var so *unstructured.Unstructured
	for _, u := range keda {
		if u.GetKind() == "ScaledObject" {
			so = u.DeepCopy()
		}
	}
	if so == nil {
		t.Fatal("the KEDA sample holds no ScaledObject")
	}
	bad := so.DeepCopy()
	bad.SetName("misspelt")
	bad.SetResourceVersion("")
	triggers, _, _ := unstructured.NestedSlice(bad.Object, "spec", "triggers")
	triggers[0].(map[string]any)["metdata"] = map[string]any{"topic": "orders"}
	if err := unstructured.SetNestedSlice(bad.Object, triggers, "spec", "triggers"); err != nil {
		t.Fatal(err)
	}
	if err := strict.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "metdata") {
		t.Fatalf("a ScaledObject with a misspelt trigger field was created (%v); KEDA's schema is not in force", err)
	}

	// The ScaledObject scales this inbox, through its scale subresource, on the inbox's group.
	raw, err := yaml.Marshal(inboxDoc.Object)
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := manifest.Parse(raw)
	if err != nil {
		t.Fatalf("the sample inbox: %v", err)
	}
	var scaled scaledObject
	convert(t, so, &scaled)
	target := scaled.Spec.ScaleTargetRef
	if target.APIVersion != v1alpha1.GroupVersion.String() || target.Kind != "SequentialInbox" || target.Name != inbox.Name {
		t.Errorf("scaleTargetRef = %+v, want %s SequentialInbox %s", target, v1alpha1.GroupVersion, inbox.Name)
	}
	scale := &autoscalingv1.Scale{}
	created := &v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Name: inbox.Name, Namespace: namespace}}
	if err := c.SubResource("scale").Get(ctx, created, scale); err != nil {
		t.Errorf("the scale subresource KEDA scales through: %v", err)
	}
	spec := inbox.Spec.Kafka
	var topics []string
	for i, trig := range scaled.Spec.Triggers {
		m := trig.Metadata
		if trig.Type != "kafka" {
			t.Errorf("trigger %d has type %q, want kafka", i, trig.Type)
			continue
		}
		for name, value := range m {
			checkParameter(t, params, "triggerMetadata", name, value)
		}
		topics = append(topics, m["topic"])
		if m["consumerGroup"] != spec.ConsumerGroup {
			t.Errorf("trigger %d reads the lag of group %q; the consumers of the inbox join %q", i, m["consumerGroup"], spec.ConsumerGroup)
		}
		if got := strings.Split(m["bootstrapServers"], ","); !slices.Equal(got, spec.BootstrapServers) {
			t.Errorf("trigger %d asks brokers %v, the inbox %v", i, got, spec.BootstrapServers)
		}
		if spec.SASL != nil && m["sasl"] != kedaSASL[spec.SASL.Mechanism] {
			t.Errorf("trigger %d uses SASL %q, the inbox %s (KEDA: %s)", i, m["sasl"], spec.SASL.Mechanism, kedaSASL[spec.SASL.Mechanism])
		}
		if want := map[bool]string{true: "enable", false: ""}[spec.TLS != nil]; m["tls"] != want {
			t.Errorf("trigger %d has tls %q, want %q", i, m["tls"], want)
		}
		checkAuthentication(t, keda, trig.AuthenticationRef.Name, &spec, params)
	}
	slices.Sort(topics)
	if want := slices.Sorted(slices.Values(spec.Topics)); !slices.Equal(topics, want) {
		t.Errorf("the triggers read topics %v, the inbox consumes %v", topics, want)
	}
}

// checkAuthentication checks that the TriggerAuthentication of a trigger reads the inbox's
// credentials: its user, the password Secret key and the CA Secret key.
func checkAuthentication(t *testing.T, docs []*unstructured.Unstructured, name string, spec *v1alpha1.KafkaSpec, params map[string]kafkaParameter) {
	t.Helper()
	var auth *triggerAuthentication
	secrets := map[string]*corev1.Secret{}
	for _, u := range docs {
		switch u.GetKind() {
		case "TriggerAuthentication":
			if u.GetName() == name {
				auth = &triggerAuthentication{}
				convert(t, u, auth)
			}
		case "Secret":
			s := &corev1.Secret{}
			convert(t, u, s)
			secrets[s.Name] = s
		}
	}
	if auth == nil {
		t.Errorf("the sample has no TriggerAuthentication %q", name)
		return
	}
	refs := map[string]corev1.SecretKeySelector{}
	for _, r := range auth.Spec.SecretTargetRef {
		checkParameter(t, params, "authParams", r.Parameter, "")
		refs[r.Parameter] = corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: r.Name}, Key: r.Key}
	}
	if spec.SASL != nil {
		if refs["password"] != spec.SASL.PasswordSecretRef {
			t.Errorf("KEDA reads the password from %+v, the inbox from %+v", refs["password"], spec.SASL.PasswordSecretRef)
		}
		user := refs["username"]
		// The objects hold what the API server answered: stringData arrived as data.
		if s := secrets[user.Name]; s == nil || string(s.Data[user.Key]) != spec.SASL.Username {
			t.Errorf("KEDA's user (Secret %s key %s of the sample) is not the inbox's user %q", user.Name, user.Key, spec.SASL.Username)
		}
	}
	if spec.TLS != nil && spec.TLS.CASecretRef != nil && refs["ca"] != *spec.TLS.CASecretRef {
		t.Errorf("KEDA trusts the CA of %+v, the inbox of %+v", refs["ca"], *spec.TLS.CASecretRef)
	}
}

// convert decodes an unstructured object into a typed view.
func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	raw, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}
