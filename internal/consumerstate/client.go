package consumerstate

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// maxStateBytes bounds the answer the operator reads from one consumer.
const maxStateBytes = 1 << 20

// ErrCredentials is returned when a consumer refuses the token or serves another certificate:
// the caller should read the inbox's Secret again.
var ErrCredentials = errors.New("consumer state credentials rejected")

// Client reads consumers' State with one inbox's credentials: it trusts only the inbox's
// certificate and sends the inbox's token.
type Client struct {
	http  *http.Client
	token string
}

// NewClient builds a Client from the data of an inbox's credentials Secret; timeout bounds one read.
func NewClient(secret map[string][]byte, timeout time.Duration) (*Client, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secret[CertKey]) {
		return nil, fmt.Errorf("consumer state credentials: no certificate in %s", CertKey)
	}
	token := string(secret[TokenKey])
	if token == "" {
		return nil, fmt.Errorf("consumer state credentials: no %s", TokenKey)
	}
	transport := &http.Transport{
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: ServerName},
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     time.Minute,
	}
	return &Client{http: &http.Client{Transport: transport, Timeout: timeout}, token: token}, nil
}

// Get reads the State of the consumer at hostPort (a pod IP and the state port).
func (c *Client) Get(ctx context.Context, hostPort string) (State, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+hostPort+Path, nil)
	if err != nil {
		return State{}, fmt.Errorf("consumer state %s: %w", hostPort, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		var unknown x509.UnknownAuthorityError
		var invalid x509.CertificateInvalidError
		if errors.As(err, &unknown) || errors.As(err, &invalid) {
			return State{}, fmt.Errorf("consumer state %s: %w: %w", hostPort, ErrCredentials, err)
		}
		return State{}, fmt.Errorf("consumer state %s: %w", hostPort, err)
	}
	defer func() { _ = resp.Body.Close() }()
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return State{}, fmt.Errorf("consumer state %s: %w: %s", hostPort, ErrCredentials, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return State{}, fmt.Errorf("consumer state %s: %s", hostPort, resp.Status)
	}
	var s State
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStateBytes)).Decode(&s); err != nil {
		return State{}, fmt.Errorf("consumer state %s: decode: %w", hostPort, err)
	}
	return s, nil
}

// Close closes the idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }
