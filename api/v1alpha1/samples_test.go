package v1alpha1_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestEverySampleInboxIsAcceptedByTheAPIServer creates every SequentialInbox of config/samples
// in a real API server, so that the CRD's CEL rules (PLAIN needs TLS, one sink destination, one
// user name source, ...) hold for what users copy.
func TestEverySampleInboxIsAcceptedByTheAPIServer(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "samples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind != "SequentialInbox" {
				continue
			}
			var in v1alpha1.SequentialInbox
			if err := yaml.UnmarshalStrict([]byte(doc), &in); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			seen++
			in.Name = strings.ReplaceAll(strings.TrimSuffix(filepath.Base(file), ".yaml"), "_", "-")
			in.Name = in.Name[:min(len(in.Name), 40)]
			in.Namespace = "default"
			if err := k8s.Create(context.Background(), &in); err != nil {
				t.Errorf("%s: the API server refused the sample: %v", file, err)
			}
		}
	}
	if seen < 2 {
		t.Fatalf("found %d SequentialInbox samples, want the local and the cluster one", seen)
	}
}

// TestClusterSampleUsesStrimziAndCloudNativePGSecrets pins the formats the cluster sample relies
// on: the Strimzi cluster CA and KafkaUser Secrets, CloudNativePG's <cluster>-app Secret key uri,
// and the sink Service.
func TestClusterSampleUsesStrimziAndCloudNativePGSecrets(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	in, err := manifest.Load(filepath.Join(root, "config", "samples", "cluster_order-inbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	in.Namespace = "shop"
	k := in.Spec.Kafka
	ref := func(r *corev1.SecretKeySelector) string { return r.Name + "/" + r.Key }
	switch {
	case k.TLS == nil || k.TLS.CASecretRef == nil || ref(k.TLS.CASecretRef) != "my-cluster-cluster-ca-cert/ca.crt":
		t.Errorf("kafka TLS = %+v, want the Strimzi cluster CA Secret my-cluster-cluster-ca-cert/ca.crt", k.TLS)
	case k.SASL == nil || k.SASL.Username != "order-inbox" || ref(&k.SASL.PasswordSecretRef) != "order-inbox/password":
		t.Errorf("kafka SASL = %+v, want user order-inbox with the KafkaUser Secret's password", k.SASL)
	case ref(&in.Spec.Database.URLSecretRef) != "orders-db-app/uri":
		t.Errorf("database URL from %s, want CloudNativePG's orders-db-app/uri", ref(&in.Spec.Database.URLSecretRef))
	case manifest.SinkURL(in) != "http://order-service.shop.svc:8080/events":
		t.Errorf("sink URL = %s, want the order-service Service", manifest.SinkURL(in))
	}
}
