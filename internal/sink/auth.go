package sink

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// Auth secures the connection to the sink. The files come from Secrets projected into the
// consumer pod; the client certificate and the token are read again when they are used (at each
// TLS handshake, at each request), so that a rotated Secret takes effect without a restart.
type Auth struct {
	// CAFile is a PEM CA bundle to trust instead of the system roots.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key.
	CertFile, KeyFile string
	// TokenFile holds a bearer token, sent as `Authorization: Bearer <token>`.
	TokenFile string
}

// newTransport builds the pooled transport of one sink, secured as auth says.
func newTransport(auth Auth) (http.RoundTripper, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// Every in-flight record may hold a connection; keep them for reuse.
	t.MaxIdleConnsPerHost = 256
	t.MaxIdleConns = 256
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if auth.CAFile != "" {
		pem, err := os.ReadFile(auth.CAFile)
		if err != nil {
			return nil, fmt.Errorf("sink CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("sink CA bundle %s holds no PEM certificate", auth.CAFile)
		}
		t.TLSClientConfig.RootCAs = pool
	}
	if (auth.CertFile == "") != (auth.KeyFile == "") {
		return nil, fmt.Errorf("sink client certificate needs both files, got certificate %q and key %q", auth.CertFile, auth.KeyFile)
	}
	if auth.CertFile != "" {
		if _, err := loadKeyPair(auth.CertFile, auth.KeyFile); err != nil {
			return nil, err
		}
		t.TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return loadKeyPair(auth.CertFile, auth.KeyFile)
		}
	}
	if auth.TokenFile == "" {
		return t, nil
	}
	if _, err := readToken(auth.TokenFile); err != nil {
		return nil, err
	}
	return &bearer{next: t, tokenFile: auth.TokenFile}, nil
}

func loadKeyPair(certFile, keyFile string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("sink client certificate %s, key %s: %w", certFile, keyFile, err)
	}
	return &cert, nil
}

func readToken(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("sink bearer token: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("sink bearer token file %s is empty", file)
	}
	return token, nil
}

// bearer adds the token to every request, replacing any Authorization header: a record header
// can never supply credentials.
type bearer struct {
	next      http.RoundTripper
	tokenFile string
}

// RoundTrip implements http.RoundTripper.
func (b *bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	token, err := readToken(b.tokenFile)
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+token)
	return b.next.RoundTrip(req)
}

// CloseIdleConnections lets Sink.Close reach the pooled transport.
func (b *bearer) CloseIdleConnections() {
	if c, ok := b.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
