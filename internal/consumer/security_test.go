package consumer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestConsumerReachesAKafkaRequiringClientCertificatesAndSCRAM runs a consumer the way a pod runs
// it: the Strimzi cluster CA and the KafkaUser's certificate, key and password arrive as files
// and variables, and the broker refuses any connection without a client certificate and SCRAM.
func TestConsumerReachesAKafkaRequiringClientCertificatesAndSCRAM(t *testing.T) {
	database(t)
	pki := testenv.NewPKI(t)
	seeds := testenv.SecureKafka(t, pki, "SCRAM-SHA-512", "orders-user", "s3cret", 2, "orders", "orders.dlq")
	cert, key := pki.Client(t, "orders-user")
	dir := t.TempDir()
	files := map[string][]byte{"ca.crt": pki.CAPEM, "user.crt": cert, "user.key": key}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	secured := Kafka{Username: "orders-user", Password: "s3cret", CAFile: filepath.Join(dir, "ca.crt"),
		CertFile: filepath.Join(dir, "user.crt"), KeyFile: filepath.Join(dir, "user.key")}

	s := newSink(t, nil)
	inbox := testInbox(t, seeds, "g-secured", s.srv.URL, sinkOpts{})
	inbox.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{
		CASecretRef:       &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "my-cluster-cluster-ca-cert"}, Key: "ca.crt"},
		ClientCertificate: &v1alpha1.KafkaClientCertificate{SecretName: "orders-user"},
	}
	inbox.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "orders-user",
		PasswordSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-user"}, Key: "password"}}

	r := startConsumer(t, inbox, "secured-1", func(c *Config) { c.Kafka = secured })
	r.waitReady(t)

	opts, err := ConnectionOptions(&inbox.Spec.Kafka, secured)
	if err != nil {
		t.Fatal(err)
	}
	producer, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if err := producer.ProduceSync(ctx, event(0, "OrderCreated", "sec-1", "sec-o1"), event(1, "OrderPaid", "sec-2", "sec-o1")).FirstErr(); err != nil {
		t.Fatalf("produce over TLS and SCRAM: %v", err)
	}
	waitUntil(t, "both messages reached the sink", func() bool { return len(s.accepted()) == 2 })
	if got := s.acceptedOrder("sec-o1"); len(got) != 2 || got[0] != "OrderCreated" || got[1] != "OrderPaid" {
		t.Errorf("sink order = %v, want OrderCreated, OrderPaid", got)
	}
}

func TestConsumerRefusesAClientCertificateWithoutItsFiles(t *testing.T) {
	inbox := testInbox(t, []string{"127.0.0.1:1"}, "g-nofiles", "http://127.0.0.1:1", sinkOpts{})
	inbox.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{ClientCertificate: &v1alpha1.KafkaClientCertificate{SecretName: "orders-user"}}
	_, err := ConnectionOptions(&inbox.Spec.Kafka, Kafka{})
	if err == nil || !strings.Contains(err.Error(), "SEQINBOX_KAFKA_CERT_FILE") {
		t.Fatalf("ConnectionOptions = %v, want an error naming SEQINBOX_KAFKA_CERT_FILE", err)
	}
}

// TestConsumerNamesTheRefusedKafkaPassword runs a consumer whose password the broker refuses (kfake
// ends the connection during the SCRAM exchange, as some brokers do): it stays not ready, and its
// readiness names the authentication failure with the mechanism, the user and the Secret key the
// password came from, instead of "joining Kafka consumer group".
func TestConsumerNamesTheRefusedKafkaPassword(t *testing.T) {
	database(t)
	pki := testenv.NewPKI(t)
	seeds := testenv.SecureKafka(t, pki, "SCRAM-SHA-512", "orders-user", "s3cret", 1, "orders", "orders.dlq")
	cert, key := pki.Client(t, "orders-user")
	dir := t.TempDir()
	for name, data := range map[string][]byte{"ca.crt": pki.CAPEM, "user.crt": cert, "user.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	inbox := testInbox(t, seeds, "g-refused", "http://127.0.0.1:1", sinkOpts{})
	inbox.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{
		CASecretRef:       &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "my-cluster-cluster-ca-cert"}, Key: "ca.crt"},
		ClientCertificate: &v1alpha1.KafkaClientCertificate{SecretName: "orders-user"},
	}
	inbox.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "orders-user",
		PasswordSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-user"}, Key: "password"}}
	r := startConsumer(t, inbox, "refused-1", func(c *Config) {
		c.Kafka = Kafka{Username: "orders-user", Password: "not-the-password", CAFile: filepath.Join(dir, "ca.crt"),
			CertFile: filepath.Join(dir, "user.crt"), KeyFile: filepath.Join(dir, "user.key")}
	})
	var reason string
	waitUntil(t, "readiness names the refused credentials", func() bool {
		var ready bool
		ready, reason = r.c.Ready()
		return !ready && strings.HasPrefix(reason, "Kafka authentication failed")
	})
	for _, want := range []string{"SASL SCRAM-SHA-512", `user "orders-user"`, "password from Secret orders-user key password"} {
		if !strings.Contains(reason, want) {
			t.Errorf("readiness %q does not name %s", reason, want)
		}
	}
	if strings.Contains(reason, "not-the-password") {
		t.Errorf("readiness %q shows the password", reason)
	}
}

// TestConsumerOfTheClusterSampleTakesTheUserNameOfTheManifest builds the consumer of the cluster
// sample as `seqinbox consume -f` does outside Kubernetes, with only the password and the CA
// file of its Secrets: spec.kafka.sasl.username is the user, no variable needs to repeat it.
func TestConsumerOfTheClusterSampleTakesTheUserNameOfTheManifest(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := manifest.Load(filepath.Join(root, "config", "samples", "cluster_order-inbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, testenv.NewPKI(t).CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Inbox: inbox, DatabaseURL: dbURL, InstanceID: "sample-1", Kafka: Kafka{Password: "s3cret", CAFile: ca}}
	if _, err := New(cfg); err != nil {
		t.Fatalf("New with the password and CA file of the sample's Secrets: %v", err)
	}
	cfg.Kafka.Password = ""
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "spec.kafka.sasl.passwordSecretRef (Secret order-inbox key password): set SEQINBOX_KAFKA_PASSWORD") {
		t.Fatalf("New without the password = %v, want the field and SEQINBOX_KAFKA_PASSWORD named", err)
	}
}

// TestAnUnreachableBrokerMakesTheConsumerNotReadyNamingIt runs a consumer whose only broker
// refuses connections: its readiness names the broker and the dial error, instead of "joining
// Kafka consumer group" without end.
func TestAnUnreachableBrokerMakesTheConsumerNotReadyNamingIt(t *testing.T) {
	database(t)
	inbox := testInbox(t, []string{"127.0.0.1:1"}, "g-unreachable", "http://127.0.0.1:1", sinkOpts{})
	r := startConsumer(t, inbox, "unreachable-1")
	var reason string
	waitUntil(t, "readiness names the unreachable broker", func() bool {
		var ready bool
		ready, reason = r.c.Ready()
		return !ready && strings.HasPrefix(reason, "cannot reach Kafka broker 127.0.0.1:1 since ")
	})
	if !strings.Contains(reason, "connection refused") || !strings.Contains(reason, "spec.kafka.bootstrapServers") {
		t.Errorf("readiness %q does not say why and what to check", reason)
	}
}
