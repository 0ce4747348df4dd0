package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// secureServer is an HTTPS sink that requires a client certificate signed by the PKI and the
// bearer token; it records the token of each request and answers 401 to any other.
type secureServer struct {
	srv    *httptest.Server
	mu     sync.Mutex
	tokens []string
	want   string
}

func newSecureServer(t *testing.T, pki *testenv.PKI, token string) *secureServer {
	t.Helper()
	s := &secureServer{want: "Bearer " + token}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.tokens = append(s.tokens, r.Header.Get("Authorization"))
		want := s.want
		s.mu.Unlock()
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || r.Header.Get("Authorization") != want {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	s.srv.TLS = pki.ServerTLS(t)
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

func (s *secureServer) expect(token string) {
	s.mu.Lock()
	s.want = "Bearer " + token
	s.mu.Unlock()
}

func (s *secureServer) lastToken() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[len(s.tokens)-1]
}

// authFiles writes the CA, a client certificate and the token as a consumer pod gets them.
func authFiles(t *testing.T, pki *testenv.PKI, token string) Auth {
	t.Helper()
	dir := t.TempDir()
	cert, key := pki.Client(t, "order-inbox")
	a := Auth{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"),
		KeyFile: filepath.Join(dir, "tls.key"), TokenFile: filepath.Join(dir, "token")}
	for file, data := range map[string][]byte{a.CAFile: pki.CAPEM, a.CertFile: cert, a.KeyFile: key, a.TokenFile: []byte(token + "\n")} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

func secureSink(t *testing.T, url string, auth Auth) (*Sink, error) {
	t.Helper()
	s, err := New(Config{URL: url, Timeout: 5 * time.Second, Auth: auth}, nil)
	if err == nil {
		t.Cleanup(s.Close)
	}
	return s, err
}

func TestDeliverOverMutualTLSWithABearerToken(t *testing.T) {
	pki := testenv.NewPKI(t)
	srv := newSecureServer(t, pki, "t0ken")
	auth := authFiles(t, pki, "t0ken")
	s, err := secureSink(t, srv.srv.URL, auth)
	if err != nil {
		t.Fatal(err)
	}
	// A record header named Authorization must not reach the sink in place of the token.
	if err := s.Deliver(context.Background(), message(`{}`, "ce_id", "e-1", "Authorization", "Bearer forged")); err != nil {
		t.Fatalf("Deliver with CA, client certificate and token: %v", err)
	}
	if got := srv.lastToken(); got != "Bearer t0ken" {
		t.Errorf("Authorization = %q, want the token from the file", got)
	}

	// The token Secret is rotated: the next request carries the new token, without a restart.
	if err := os.WriteFile(auth.TokenFile, []byte("n3w"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.expect("n3w")
	if err := s.Deliver(context.Background(), message(`{}`, "ce_id", "e-2")); err != nil {
		t.Fatalf("Deliver after the token rotated: %v", err)
	}
}

func TestDeliverFailsWithoutTheClientCertificateOrTheRightToken(t *testing.T) {
	pki := testenv.NewPKI(t)
	srv := newSecureServer(t, pki, "t0ken")

	noCert := authFiles(t, pki, "t0ken")
	noCert.CertFile, noCert.KeyFile = "", ""
	s, err := secureSink(t, srv.srv.URL, noCert)
	if err != nil {
		t.Fatal(err)
	}
	var derr *Error
	if err := s.Deliver(context.Background(), message(`{}`, "ce_id", "e-1")); !errors.As(err, &derr) || derr.StatusCode != 0 {
		t.Errorf("Deliver without a client certificate = %v, want a failed connection", err)
	}

	wrongToken := authFiles(t, pki, "wrong")
	s, err = secureSink(t, srv.srv.URL, wrongToken)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Deliver(context.Background(), message(`{}`, "ce_id", "e-1")); !errors.As(err, &derr) || derr.StatusCode != http.StatusUnauthorized {
		t.Errorf("Deliver with a wrong token = %v, want 401", err)
	}

	untrusted := authFiles(t, testenv.NewPKI(t), "t0ken") // another CA signed the server certificate
	s, err = secureSink(t, srv.srv.URL, untrusted)
	if err != nil {
		t.Fatal(err)
	}
	var unverified *tls.CertificateVerificationError
	if err := s.Deliver(context.Background(), message(`{}`, "ce_id", "e-1")); !errors.As(err, &unverified) {
		t.Errorf("Deliver trusting another CA = %v, want an unknown-authority error", err)
	}
}

func TestNewRefusesUnusableAuthFiles(t *testing.T) {
	pki := testenv.NewPKI(t)
	good := authFiles(t, pki, "t0ken")
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(a *Auth){
		"CA file without a certificate": func(a *Auth) { a.CAFile = a.TokenFile },
		"certificate without its key":   func(a *Auth) { a.KeyFile = "" },
		"key of another certificate":    func(a *Auth) { a.KeyFile = authFiles(t, pki, "x").KeyFile },
		"empty token":                   func(a *Auth) { a.TokenFile = empty },
		"missing token file":            func(a *Auth) { a.TokenFile = filepath.Join(t.TempDir(), "none") },
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			a := good
			edit(&a)
			if _, err := secureSink(t, "https://127.0.0.1:1/", a); err == nil {
				t.Fatal("New accepted unusable auth files")
			}
		})
	}
}
