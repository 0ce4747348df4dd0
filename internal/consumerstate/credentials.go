package consumerstate

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"
)

// Keys of the credentials Secret, and the names of its files in a consumer pod.
const (
	// CertKey holds the PEM certificate the consumers serve with and the operator trusts.
	CertKey = "tls.crt"
	// KeyKey holds the certificate's PEM private key; only the consumers read it.
	KeyKey = "tls.key"
	// TokenKey holds the bearer token the operator sends and the consumers check.
	TokenKey = "token"
)

// ServerName is the name the certificate is issued to and the operator verifies: it connects to
// pod IPs, and what it trusts is the inbox's own certificate, not a name in DNS.
const ServerName = "consumer-state.seqinbox.internal"

// Path is where a consumer serves its State.
const Path = "/state"

// certificateValidity is long: the certificate is trusted as itself, never through a CA that could
// be revoked, and a new one is made by deleting the Secret.
const certificateValidity = 10 * 365 * 24 * time.Hour

// NewCredentials makes the credentials of one inbox, as the data of its Secret: a self-signed
// ECDSA P-256 certificate for ServerName, its key, and a random 256-bit token.
func NewCredentials(now time.Time) (map[string][]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("consumer state credentials: generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("consumer state credentials: serial number: %w", err)
	}
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: ServerName},
		DNSNames:              []string{ServerName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certificateValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("consumer state credentials: certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("consumer state credentials: encode key: %w", err)
	}
	token := make([]byte, 32)
	if _, err := rand.Read(token); err != nil {
		return nil, fmt.Errorf("consumer state credentials: token: %w", err)
	}
	return map[string][]byte{
		CertKey:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyKey:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		TokenKey: []byte(hex.EncodeToString(token)),
	}, nil
}
