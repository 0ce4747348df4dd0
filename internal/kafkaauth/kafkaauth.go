// Package kafkaauth turns spec.kafka's TLS and SASL settings, with what their Secrets hold, into
// a TLS configuration and a SASL mechanism for franz-go. The operator (reading the Secrets) and
// the consumer (reading the files and variables the pod gets from them) build their connections
// with the same function, so both refuse and accept the same settings.
package kafkaauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	corev1 "k8s.io/api/core/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// Default keys of a client certificate Secret: Strimzi's KafkaUser Secret.
const (
	DefaultCertificateKey = "user.crt"
	DefaultPrivateKeyKey  = "user.key"
)

// Material is what spec.kafka's Secrets hold; each field is needed only when the spec uses it.
type Material struct {
	// CA is the PEM CA bundle of spec.kafka.tls.caSecretRef; nil uses the system roots.
	CA []byte
	// Certificate and PrivateKey are the PEM client certificate and key of spec.kafka.tls.clientCertificate.
	Certificate, PrivateKey []byte
	// Username and Password authenticate with spec.kafka.sasl.mechanism.
	Username, Password string
}

// ClientCertificateKeys returns the Secret keys of the client certificate and its private key.
func ClientCertificateKeys(c *v1alpha1.KafkaClientCertificate) (certificate, privateKey string) {
	certificate, privateKey = c.CertificateKey, c.PrivateKeyKey
	if certificate == "" {
		certificate = DefaultCertificateKey
	}
	if privateKey == "" {
		privateKey = DefaultPrivateKeyKey
	}
	return certificate, privateKey
}

// ClientCertificateRefs returns the Secret keys of the client certificate as key selectors.
func ClientCertificateRefs(c *v1alpha1.KafkaClientCertificate) (certificate, privateKey corev1.SecretKeySelector) {
	certKey, keyKey := ClientCertificateKeys(c)
	ref := corev1.LocalObjectReference{Name: c.SecretName}
	return corev1.SecretKeySelector{LocalObjectReference: ref, Key: certKey},
		corev1.SecretKeySelector{LocalObjectReference: ref, Key: keyKey}
}

// CheckPlainNeedsTLS refuses SASL PLAIN without TLS unless spec.kafka.sasl.allowPlainWithoutTLS
// is set: the password would cross the network in clear text. The CRD has the same rule; a
// manifest run with `seqinbox consume -f` meets it here.
func CheckPlainNeedsTLS(spec *v1alpha1.KafkaSpec) error {
	if spec.SASL != nil && spec.SASL.Mechanism == "PLAIN" && spec.TLS == nil && !spec.SASL.AllowPlainWithoutTLS {
		return errors.New("spec.kafka.sasl: PLAIN sends the password in clear text; set spec.kafka.tls, " +
			"or spec.kafka.sasl.allowPlainWithoutTLS on a trusted network")
	}
	return nil
}

// Build returns the TLS configuration (nil without spec.kafka.tls) and the SASL mechanism (nil
// without spec.kafka.sasl) for spec with m; errors name the field whose material is wrong.
func Build(spec *v1alpha1.KafkaSpec, m Material) (*tls.Config, sasl.Mechanism, error) {
	if err := CheckPlainNeedsTLS(spec); err != nil {
		return nil, nil, err
	}
	var tlsCfg *tls.Config
	if t := spec.TLS; t != nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if t.CASecretRef != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(m.CA) {
				return nil, nil, fmt.Errorf("spec.kafka.tls.caSecretRef (Secret %s key %s) holds no PEM certificate",
					t.CASecretRef.Name, t.CASecretRef.Key)
			}
			tlsCfg.RootCAs = pool
		}
		if c := t.ClientCertificate; c != nil {
			cert, err := tls.X509KeyPair(m.Certificate, m.PrivateKey)
			if err != nil {
				certKey, keyKey := ClientCertificateKeys(c)
				return nil, nil, fmt.Errorf("spec.kafka.tls.clientCertificate (Secret %s keys %s, %s): %w", c.SecretName, certKey, keyKey, err)
			}
			tlsCfg.Certificates = []tls.Certificate{cert}
		}
	}
	var mechanism sasl.Mechanism
	if s := spec.SASL; s != nil {
		if m.Username == "" || m.Password == "" {
			return nil, nil, fmt.Errorf("spec.kafka.sasl (%s) needs a user name and a password; one of them is empty", s.Mechanism)
		}
		switch s.Mechanism {
		case "PLAIN":
			mechanism = plain.Auth{User: m.Username, Pass: m.Password}.AsMechanism()
		case "SCRAM-SHA-256":
			mechanism = scram.Auth{User: m.Username, Pass: m.Password}.AsSha256Mechanism()
		case "SCRAM-SHA-512":
			mechanism = scram.Auth{User: m.Username, Pass: m.Password}.AsSha512Mechanism()
		default:
			return nil, nil, fmt.Errorf("spec.kafka.sasl.mechanism %q: use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
		}
	}
	return tlsCfg, mechanism, nil
}

// Describe says how spec connects, for error messages: which user, mechanism and Secrets.
func Describe(spec *v1alpha1.KafkaSpec) string {
	var parts []string
	if s := spec.SASL; s != nil {
		user := fmt.Sprintf("user %q", s.Username)
		if s.UsernameSecretRef != nil {
			user = fmt.Sprintf("the user of Secret %s key %s", s.UsernameSecretRef.Name, s.UsernameSecretRef.Key)
		}
		parts = append(parts, fmt.Sprintf("SASL %s as %s (password from Secret %s key %s)",
			s.Mechanism, user, s.PasswordSecretRef.Name, s.PasswordSecretRef.Key))
	}
	if t := spec.TLS; t != nil {
		part := "TLS"
		if t.CASecretRef != nil {
			part += fmt.Sprintf(" trusting the CA of Secret %s", t.CASecretRef.Name)
		}
		if t.ClientCertificate != nil {
			part += fmt.Sprintf(" with the client certificate of Secret %s", t.ClientCertificate.SecretName)
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return "without TLS or SASL"
	}
	return strings.Join(parts, ", ")
}

// Options are the franz-go options of Build's result.
func Options(spec *v1alpha1.KafkaSpec, m Material) ([]kgo.Opt, error) {
	tlsCfg, mechanism, err := Build(spec, m)
	if err != nil {
		return nil, err
	}
	var opts []kgo.Opt
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	if mechanism != nil {
		opts = append(opts, kgo.SASL(mechanism))
	}
	return opts, nil
}
