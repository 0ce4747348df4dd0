package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// PKI is a certificate authority made for one test: it signs a server certificate for the
// loopback addresses and client certificates, so that tests run real TLS with client
// authentication against kfake and httptest servers.
type PKI struct {
	// CAPEM is the CA certificate, PEM-encoded (what a Strimzi cluster CA Secret's ca.crt holds).
	CAPEM []byte
	ca    *x509.Certificate
	key   *ecdsa.PrivateKey
}

// NewPKI creates a CA valid for an hour.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	key := newKey(t)
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "seqinbox test CA"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("create CA: %v", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse CA: %v", err)
	}
	return &PKI{CAPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca: ca, key: key}
}

// Pool is a certificate pool holding the CA.
func (p *PKI) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	return pool
}

// ServerTLS is a server configuration for 127.0.0.1 and localhost that requires a client
// certificate signed by the CA.
func (p *PKI) ServerTLS(t testing.TB) *tls.Config {
	t.Helper()
	certPEM, keyPEM := p.issue(t, "localhost", x509.ExtKeyUsageServerAuth)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("server key pair: %v", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.Pool(),
	}
}

// Client issues a client certificate for the common name; it returns the PEM certificate and
// key, as a Strimzi KafkaUser Secret holds them (user.crt, user.key).
func (p *PKI) Client(t testing.TB, commonName string) (certPEM, keyPEM []byte) {
	t.Helper()
	return p.issue(t, commonName, x509.ExtKeyUsageClientAuth)
}

func (p *PKI) issue(t testing.TB, commonName string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		template.DNSNames = []string{"localhost"}
		template.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, p.ca, &key.PublicKey, p.key)
	if err != nil {
		t.Fatalf("issue certificate for %s: %v", commonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return key
}

// SecureKafka starts an in-process Kafka cluster like Kafka, but one that accepts only TLS
// connections with a client certificate signed by pki and then only SASL-authenticated clients:
// the one user, with the mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) and password.
func SecureKafka(t testing.TB, pki *PKI, mechanism, user, password string, partitions int32, topics ...string) []string {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(int(partitions)),
		kfake.TLS(pki.ServerTLS(t)), kfake.EnableSASL(), kfake.Superuser(mechanism, user, password)}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake cluster with TLS and SASL: %v", err)
	}
	t.Cleanup(cluster.Close)
	return cluster.ListenAddrs()
}
