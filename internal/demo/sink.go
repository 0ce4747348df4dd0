package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Delivery is one HTTP request the demo sink received.
type Delivery struct {
	// Via names the consumer that sent it (the `via` query parameter of its sink URL).
	Via string
	// ID, Type, Sequence and ContextID are the ce-id, ce-type, ce-seqinboxsequence and
	// ce-seqinboxcontextid headers (docs/design.md#sink-request).
	ID, Type, Sequence, ContextID string
	// OrderID is read from the JSON payload.
	OrderID string
	// Status is what the sink answered.
	Status int
	// Problem says why the sink refused a request that breaks the sink contract.
	Problem string
}

// Accepted reports whether the sink answered 2xx, i.e. the message counts as processed.
func (d Delivery) Accepted() bool { return d.Status >= 200 && d.Status < 300 }

// Sink is the demo's stand-in for the order service: it records every CloudEvent it receives, in
// arrival order, and rejects one chosen ce-id once with 500 so that the consumer's retry shows.
type Sink struct {
	rejectOnce string
	listener   net.Listener
	server     *http.Server

	mu         sync.Mutex
	rejected   bool
	deliveries []Delivery
}

// maxBody bounds what the sink reads of one request.
const maxBody = 1 << 20

// StartSink listens on a free port of 127.0.0.1 and serves until Close. rejectOnce is the ce-id
// answered with 500 the first time; empty rejects nothing.
func StartSink(rejectOnce string) (*Sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo sink: listen: %w", err)
	}
	s := &Sink{rejectOnce: rejectOnce, listener: ln}
	s.server = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.server.Serve(ln) }()
	return s, nil
}

// URL is the sink URL a consumer posts to; via names the consumer in the recorded deliveries.
func (s *Sink) URL(via string) string {
	return "http://" + s.listener.Addr().String() + "/events?via=" + url.QueryEscape(via)
}

// Deliveries returns a copy of what the sink received so far, in arrival order.
func (s *Sink) Deliveries() []Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Delivery(nil), s.deliveries...)
}

// Close stops the server, waiting briefly for requests in flight.
func (s *Sink) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.server.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("demo sink: shut down: %w", err)
	}
	return nil
}

// ServeHTTP implements http.Handler: it checks the CloudEvents binary-mode request
// (docs/design.md#sink-request), records it and answers.
func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST a CloudEvent", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	d := Delivery{
		Via:       r.URL.Query().Get("via"),
		ID:        r.Header.Get("ce-id"),
		Type:      r.Header.Get("ce-type"),
		Sequence:  r.Header.Get("ce-seqinboxsequence"),
		ContextID: r.Header.Get("ce-seqinboxcontextid"),
	}
	var p orderPayload
	switch {
	case err != nil:
		d.Problem = "reading the body: " + err.Error()
	case r.Header.Get("ce-specversion") != "1.0":
		d.Problem = fmt.Sprintf("ce-specversion is %q, want 1.0", r.Header.Get("ce-specversion"))
	case d.ID == "" || d.Type == "" || r.Header.Get("ce-source") == "":
		d.Problem = "ce-id, ce-type and ce-source are required"
	case r.Header.Get("Content-Type") != "application/json":
		d.Problem = fmt.Sprintf("content-type is %q, the record's was application/json", r.Header.Get("Content-Type"))
	default:
		if err := json.Unmarshal(body, &p); err != nil {
			d.Problem = "the body is not the record's JSON payload: " + err.Error()
		}
	}
	d.OrderID = p.OrderID

	s.mu.Lock()
	switch {
	case d.Problem != "":
		d.Status = http.StatusBadRequest
	case d.ID == s.rejectOnce && !s.rejected:
		s.rejected = true
		d.Status = http.StatusInternalServerError
	default:
		d.Status = http.StatusNoContent
	}
	s.deliveries = append(s.deliveries, d)
	s.mu.Unlock()

	if d.Problem != "" {
		http.Error(w, d.Problem, d.Status)
		return
	}
	w.WriteHeader(d.Status)
}
