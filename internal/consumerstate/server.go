package consumerstate

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// Files are the credentials as a consumer reads them: the Secret's keys as files in Dir. They are
// read again at every connection and request, so a Secret the kubelet updated in the mounted
// volume takes effect without a restart.
type Files struct {
	Dir string
}

func (f Files) read(key string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(f.Dir, key))
	if err != nil {
		return nil, fmt.Errorf("consumer state credentials: %w", err)
	}
	return b, nil
}

// TLSConfig serves the certificate of the files.
func (f Files) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			certPEM, err := f.read(CertKey)
			if err != nil {
				return nil, err
			}
			keyPEM, err := f.read(KeyKey)
			if err != nil {
				return nil, err
			}
			cert, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				return nil, fmt.Errorf("consumer state credentials: %w", err)
			}
			return &cert, nil
		},
	}
}

// Handler serves the State that state returns at Path, to requests that carry the token of the
// files as their bearer token, and nothing to anyone else.
func (f Files) Handler(state func(context.Context) State) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, r *http.Request) {
		want, err := f.read(TokenKey)
		if err != nil {
			http.Error(w, "consumer state credentials unreadable", http.StatusServiceUnavailable)
			return
		}
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		want = bytes.TrimSpace(want)
		if !ok || len(want) == 0 || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="seqinbox consumer state"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(state(r.Context()))
	})
	return mux
}
