package sink

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/inbox"
)

func message(value string, headers ...string) inbox.Message {
	rec := inbox.Record{
		Type: "OrderCreated", IdempotenceID: "e-1", ContextID: "o-1", Sequenced: true,
		Key: []byte("o-1"), Value: []byte(value), Origin: inbox.Origin{Topic: "orders", MessageID: "e-1"},
	}
	for i := 0; i+1 < len(headers); i += 2 {
		rec.Headers = append(rec.Headers, inbox.Header{Key: headers[i], Value: []byte(headers[i+1])})
	}
	return inbox.Message{Sequence: "order", ContextID: "o 1", QualifiedType: "OrderCreated", Record: rec}
}

// received is what the test server saw of one request.
type received struct {
	header http.Header
	body   []byte
	method string
}

func TestDeliverSendsBinaryModeCloudEvent(t *testing.T) {
	got := make(chan received, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- received{header: r.Header, body: body, method: r.Method}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	s := newSink(t, srv.URL, 0)

	body := "{\"orderId\": \"o-1\",\n \"total\": 12.50}\x00"
	m := message(body,
		"ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/shop", "ce_type", "OrderCreated",
		"ce_subject", "Grüße 100%", "content-type", "application/json; charset=utf-8",
		"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"ce_seqinboxsequence", "forged", "transfer-encoding", "chunked", "bad header", "x",
		"seqinbox-dlq-reason", "old")
	if err := s.Deliver(context.Background(), m); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	r := <-got
	if r.method != http.MethodPost {
		t.Errorf("method %s, want POST", r.method)
	}
	if string(r.body) != body {
		t.Errorf("body %q, want %q byte for byte", r.body, body)
	}
	want := map[string]string{
		"Ce-Specversion":       "1.0",
		"Ce-Id":                "e-1",
		"Ce-Source":            "/shop",
		"Ce-Type":              "OrderCreated",
		"Ce-Subject":           "Gr%C3%BC%C3%9Fe%20100%25",
		"Content-Type":         "application/json; charset=utf-8",
		"Traceparent":          "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"Ce-Seqinboxsequence":  "order",
		"Ce-Seqinboxcontextid": "o%201",
	}
	for k, v := range want {
		if r.header.Get(k) != v {
			t.Errorf("header %s = %q, want %q", k, r.header.Get(k), v)
		}
	}
	for _, absent := range []string{"Bad header", "Seqinbox-Dlq-Reason"} {
		if _, ok := r.header[absent]; ok {
			t.Errorf("header %s was forwarded", absent)
		}
	}
	if n := len(r.header.Values(SequenceHeader)); n != 1 {
		t.Errorf("%d %s headers, want exactly ours", n, SequenceHeader)
	}
	if te := r.header.Get("Transfer-Encoding"); te != "" {
		t.Errorf("record header Transfer-Encoding %q leaked into the request", te)
	}
}

func TestDeliverRetries(t *testing.T) {
	tests := []struct {
		name         string
		answers      []int // one per attempt; 0 = hang until the attempt times out
		retries      int
		wantErr      bool
		wantAttempts int
	}{
		{"500 then success", []int{500, 200}, 3, false, 2},
		{"429 and 408 then success", []int{429, 408, 204}, 3, false, 3},
		{"timeout then success", []int{0, 200}, 3, false, 2},
		{"503 until retries are used up", []int{503, 503, 503, 503, 503}, 3, true, 4},
		{"no retries configured", []int{500, 200}, 0, true, 1},
		{"400 is final", []int{400, 200}, 3, true, 1},
		{"404 is final", []int{404, 200}, 3, true, 1},
		{"redirect is not followed and final", []int{302, 200}, 3, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var attempts atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The server notices a client that went away only once the body is read.
				_, _ = io.Copy(io.Discard, r.Body)
				n := int(attempts.Add(1))
				code := 500
				if n <= len(tt.answers) {
					code = tt.answers[n-1]
				}
				if code == 0 {
					<-r.Context().Done()
					return
				}
				if code == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(code)
			}))
			defer srv.Close()
			s := newSink(t, srv.URL, tt.retries)
			err := s.Deliver(context.Background(), message("{}"))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Deliver error %v, want error: %v", err, tt.wantErr)
			}
			if got := int(attempts.Load()); got != tt.wantAttempts {
				t.Fatalf("server saw %d attempts, want %d", got, tt.wantAttempts)
			}
			var se *Error
			if tt.wantErr && (!errors.As(err, &se) || se.Attempts != tt.wantAttempts) {
				t.Fatalf("error %v does not report %d attempts", err, tt.wantAttempts)
			}
		})
	}
}

func TestDeliverRetriesConnectionErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nobody listens: every attempt is refused
	s := newSink(t, "http://"+addr+"/events", 2)
	err = s.Deliver(context.Background(), message("{}"))
	var se *Error
	if !errors.As(err, &se) {
		t.Fatalf("Deliver error %v, want a *sink.Error", err)
	}
	if se.Attempts != 3 || se.StatusCode != 0 || !se.Retryable {
		t.Fatalf("got attempts=%d status=%d retryable=%v, want 3 refused attempts", se.Attempts, se.StatusCode, se.Retryable)
	}
}

func TestDeliverStopsWhenTheCallerGivesUp(t *testing.T) {
	firstAttempt := make(chan struct{})
	var attempts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) == 1 {
			close(firstAttempt)
		}
		w.WriteHeader(503)
	}))
	defer srv.Close()
	s, err := New(Config{URL: srv.URL, Timeout: 5 * time.Second, Retries: 5, InitialBackoff: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-firstAttempt
		cancel()
	}()
	err = s.Deliver(ctx, message("{}"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Deliver error %v, want context.Canceled", err)
	}
	if n := attempts.Load(); n != 1 {
		t.Fatalf("server saw %d attempts after the caller gave up, want 1", n)
	}
}

func TestDeliverReusesConnections(t *testing.T) {
	var newConns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			newConns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	s := newSink(t, srv.URL, 0)
	const workers, perWorker = 4, 50
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				if err := s.Deliver(context.Background(), message(`{"a":1}`)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// A connection goes back to the idle pool a moment after its response body is closed, so a
	// caller may occasionally dial once more; without reuse every delivery would dial.
	if n := newConns.Load(); n > 2*workers {
		t.Fatalf("%d deliveries opened %d connections, want at most %d (connections are reused)", workers*perWorker, n, 2*workers)
	}
}

func TestConfigDeadline(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want time.Duration
	}{
		{"no retries", Config{Timeout: 10 * time.Second}, 10 * time.Second},
		{"three retries", Config{Timeout: 10 * time.Second, Retries: 3, InitialBackoff: 200 * time.Millisecond}, 40*time.Second + 1400*time.Millisecond},
		{"backoff capped", Config{Timeout: time.Second, Retries: 3, InitialBackoff: 20 * time.Second, MaxBackoff: 30 * time.Second}, 4*time.Second + 80*time.Second},
	}
	for _, tt := range tests {
		if got := tt.cfg.Deadline(); got != tt.want {
			t.Errorf("%s: Deadline() = %s, want %s", tt.name, got, tt.want)
		}
	}
}

// TestBackoffWaitsStayInTheUpperHalfOfTheirBound: the wait before retry n is drawn from
// [b/2, b] with b = InitialBackoff doubled n-1 times and capped at MaxBackoff, so retries of many
// consumers spread out and Deadline, which counts every b, is never exceeded.
func TestBackoffWaitsStayInTheUpperHalfOfTheirBound(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		bounds []time.Duration
	}{
		{"doubling", Config{InitialBackoff: 200 * time.Millisecond}.withDefaults(),
			[]time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond}},
		{"capped", Config{InitialBackoff: 20 * time.Second, MaxBackoff: 30 * time.Second},
			[]time.Duration{20 * time.Second, 30 * time.Second, 30 * time.Second}},
		{"initial above the cap", Config{InitialBackoff: time.Hour}.withDefaults(),
			[]time.Duration{30 * time.Second, 30 * time.Second}},
	}
	for _, tt := range tests {
		for range 200 {
			b := tt.cfg.backoff()
			for i, bound := range tt.bounds {
				if got := b.Step(); got < bound/2 || got > bound {
					t.Fatalf("%s: wait before retry %d = %s, want within [%s, %s]", tt.name, i+1, got, bound/2, bound)
				}
			}
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no scheme", Config{URL: "localhost:8080", Timeout: time.Second}},
		{"ftp", Config{URL: "ftp://x/y", Timeout: time.Second}},
		{"no timeout", Config{URL: "http://x/y"}},
		{"retries without backoff", Config{URL: "http://x/y", Timeout: time.Second, Retries: 2}},
	}
	for _, tt := range tests {
		if _, err := New(tt.cfg, nil); err == nil {
			t.Errorf("%s: New accepted %+v", tt.name, tt.cfg)
		}
	}
}

func newSink(t *testing.T, url string, retries int) *Sink {
	t.Helper()
	s, err := New(Config{URL: url, Timeout: 2 * time.Second, Retries: retries, InitialBackoff: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
