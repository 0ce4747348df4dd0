package kafkaauth

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

func ref(name, key string) corev1.SecretKeySelector {
	return corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}
}

// strimziSpec is spec.kafka in Strimzi's formats: the cluster CA Secret, the KafkaUser's Secret
// for the client certificate and the password, the KafkaUser's name as the user name.
func strimziSpec(mechanism string) *v1alpha1.KafkaSpec {
	ca := ref("my-cluster-cluster-ca-cert", "ca.crt")
	return &v1alpha1.KafkaSpec{
		TLS:  &v1alpha1.KafkaTLS{CASecretRef: &ca, ClientCertificate: &v1alpha1.KafkaClientCertificate{SecretName: "orders-user"}},
		SASL: &v1alpha1.KafkaSASL{Mechanism: mechanism, Username: "orders-user", PasswordSecretRef: ref("orders-user", "password")},
	}
}

// ping asks the brokers for their metadata with the options and returns the error.
func ping(t *testing.T, seeds []string, opts []kgo.Opt) error {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RequestRetries(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

func TestConnectsToABrokerRequiringClientCertificatesAndSASL(t *testing.T) {
	for _, mechanism := range []string{"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"} {
		t.Run(mechanism, func(t *testing.T) {
			pki := testenv.NewPKI(t)
			seeds := testenv.SecureKafka(t, pki, mechanism, "orders-user", "s3cret", 1, "orders")
			cert, key := pki.Client(t, "orders-user")
			good := Material{CA: pki.CAPEM, Certificate: cert, PrivateKey: key, Username: "orders-user", Password: "s3cret"}

			opts, err := Options(strimziSpec(mechanism), good)
			if err != nil {
				t.Fatalf("Options: %v", err)
			}
			if err := ping(t, seeds, opts); err != nil {
				t.Fatalf("with the client certificate and the right password: %v", err)
			}

			wrong := good
			wrong.Password = "wrong"
			opts, err = Options(strimziSpec(mechanism), wrong)
			if err != nil {
				t.Fatal(err)
			}
			// kfake drops the connection; a Kafka broker answers SASL_AUTHENTICATION_FAILED first.
			if err := ping(t, seeds, opts); err == nil {
				t.Error("with a wrong password the broker accepted the connection")
			}

			spec := strimziSpec(mechanism)
			spec.TLS.ClientCertificate = nil
			opts, err = Options(spec, good)
			if err != nil {
				t.Fatal(err)
			}
			if err := ping(t, seeds, opts); err == nil {
				t.Error("without a client certificate the broker accepted the connection")
			}
		})
	}
}

func TestBuildRefusesBadSettingsNamingTheField(t *testing.T) {
	pki := testenv.NewPKI(t)
	cert, key := pki.Client(t, "orders-user")
	good := Material{CA: pki.CAPEM, Certificate: cert, PrivateKey: key, Username: "orders-user", Password: "s3cret"}
	cases := []struct {
		name      string
		spec      func() *v1alpha1.KafkaSpec
		material  func(m *Material)
		wantError string
	}{
		{name: "PLAIN without TLS", spec: func() *v1alpha1.KafkaSpec {
			s := strimziSpec("PLAIN")
			s.TLS = nil
			return s
		}, wantError: "PLAIN sends the password in clear text"},
		{name: "PLAIN without TLS, explicitly allowed", spec: func() *v1alpha1.KafkaSpec {
			s := strimziSpec("PLAIN")
			s.TLS, s.SASL.AllowPlainWithoutTLS = nil, true
			return s
		}},
		{name: "SCRAM without TLS is no clear-text password", spec: func() *v1alpha1.KafkaSpec {
			s := strimziSpec("SCRAM-SHA-512")
			s.TLS = nil
			return s
		}},
		{name: "CA Secret without a certificate", spec: func() *v1alpha1.KafkaSpec { return strimziSpec("SCRAM-SHA-512") },
			material: func(m *Material) { m.CA = []byte("not PEM") }, wantError: "spec.kafka.tls.caSecretRef (Secret my-cluster-cluster-ca-cert key ca.crt)"},
		{name: "key that does not match the certificate", spec: func() *v1alpha1.KafkaSpec { return strimziSpec("SCRAM-SHA-512") },
			material:  func(m *Material) { _, m.PrivateKey = pki.Client(t, "other") },
			wantError: "spec.kafka.tls.clientCertificate (Secret orders-user keys user.crt, user.key)"},
		{name: "empty password", spec: func() *v1alpha1.KafkaSpec { return strimziSpec("SCRAM-SHA-256") },
			material: func(m *Material) { m.Password = "" }, wantError: "spec.kafka.sasl (SCRAM-SHA-256) needs a user name and a password"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := good
			if tc.material != nil {
				tc.material(&m)
			}
			_, _, err := Build(tc.spec(), m)
			switch {
			case tc.wantError == "" && err != nil:
				t.Fatalf("Build: %v, want no error", err)
			case tc.wantError != "" && (err == nil || !strings.Contains(err.Error(), tc.wantError)):
				t.Fatalf("Build: %v, want an error containing %q", err, tc.wantError)
			}
		})
	}
}

func TestClientCertificateKeysDefaultToStrimzi(t *testing.T) {
	cert, key := ClientCertificateKeys(&v1alpha1.KafkaClientCertificate{SecretName: "u"})
	if cert != "user.crt" || key != "user.key" {
		t.Errorf("default keys = %s, %s; want Strimzi's user.crt, user.key", cert, key)
	}
	cert, key = ClientCertificateKeys(&v1alpha1.KafkaClientCertificate{SecretName: "u", CertificateKey: "tls.crt", PrivateKeyKey: "tls.key"})
	if cert != "tls.crt" || key != "tls.key" {
		t.Errorf("explicit keys = %s, %s; want tls.crt, tls.key", cert, key)
	}
}
