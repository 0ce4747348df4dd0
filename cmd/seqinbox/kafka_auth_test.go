package main

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// clusterSample is the sample inbox of a cluster with Strimzi: TLS with the cluster CA from a
// Secret and SCRAM-SHA-512 as user order-inbox (spec.kafka.sasl.username), password from a Secret.
func clusterSample(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "config", "samples", "cluster_order-inbox.yaml")
}

// strimziLikeKafka starts a broker as the sample expects it: TLS without client certificates,
// then SCRAM-SHA-512 for the one user; it returns its address and the file of its CA.
func strimziLikeKafka(t *testing.T, user, password string) (seeds, caFile string) {
	t.Helper()
	pki := testenv.NewPKI(t)
	server := pki.ServerTLS(t)
	server.ClientAuth = tls.NoClientCert
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.TLS(server), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", user, password), kfake.SeedTopics(1, "orders", "orders.dlq"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	caFile = filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pki.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return strings.Join(cluster.ListenAddrs(), ","), caFile
}

// TestTheClusterSampleReachesKafkaWithTheUserNameOfTheSpec runs `deadletters retry` on the
// cluster sample outside Kubernetes with only the Secrets' contents in the environment (the
// password and the CA file): the user name is the one the manifest names.
func TestTheClusterSampleReachesKafkaWithTheUserNameOfTheSpec(t *testing.T) {
	seeds, caFile := strimziLikeKafka(t, "order-inbox", "s3cret")
	t.Setenv(envKafkaUsername, "")
	t.Setenv(envKafkaPassword, "s3cret")
	t.Setenv(envKafkaCAFile, caFile)

	stdout, stderr, code := seqinbox(t, "deadletters", "retry", "-f", clusterSample(t), "--bootstrap-servers", seeds)
	if code != cli.ExitOK || !strings.HasPrefix(stdout, "re-published 0 dead letter(s) from orders.dlq") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0 and an empty retry as user order-inbox", code, stdout, stderr)
	}
}

// TestKafkaSecretsOutsideKubernetesNameTheVariableToSet checks that what a manifest takes from a
// Secret, when missing outside a cluster, is reported with the field and the variable to set,
// never as a Secret that nothing read.
func TestKafkaSecretsOutsideKubernetesNameTheVariableToSet(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name              string
		password, caFile  string
		want, mustNotHave string
	}{
		{"no password", "", "", "spec.kafka.sasl.passwordSecretRef (Secret order-inbox key password): set SEQINBOX_KAFKA_PASSWORD", ""},
		{"no CA file", "pw", "", "spec.kafka.tls.caSecretRef (Secret my-cluster-cluster-ca-cert key ca.crt): set SEQINBOX_KAFKA_CA_FILE", ""},
		{"CA file without PEM", "pw", notPEM, "SEQINBOX_KAFKA_CA_FILE " + notPEM + " holds no PEM certificate", ""},
		{"missing CA file", "pw", notPEM + ".gone", "kafka CA bundle (SEQINBOX_KAFKA_CA_FILE): open " + notPEM + ".gone", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envKafkaUsername, "")
			t.Setenv(envKafkaPassword, tt.password)
			t.Setenv(envKafkaCAFile, tt.caFile)
			stdout, stderr, code := seqinbox(t, "deadletters", "retry", "-f", clusterSample(t), "--bootstrap-servers", "127.0.0.1:1")
			if code != cli.ExitFailed || !strings.Contains(stderr, tt.want) || strings.Count(stderr, "\n") != 1 || stdout != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and one line with %q", code, stdout, stderr, tt.want)
			}
		})
	}
}

// TestRetryWithAnUnreachableBrokerFailsWithoutAReport checks that `deadletters retry` that
// cannot reach Kafka says so, and only so: no "re-published 0" report before the error.
func TestRetryWithAnUnreachableBrokerFailsWithoutAReport(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	sample := filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml")
	stdout, stderr, code := seqinbox(t, "deadletters", "retry", "-f", sample, "--bootstrap-servers", "127.0.0.1:1")
	if code != cli.ExitFailed || stdout != "" || !strings.Contains(stderr, "connection refused") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1, nothing on stdout and the refused connection on stderr", code, stdout, stderr)
	}
}
