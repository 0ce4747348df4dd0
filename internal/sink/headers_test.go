package sink

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestRecordHeadersCannotForgeAttributesOrPassCredentials sends a record whose producer tries
// to relabel the event and to pass credentials and proxy headers to the team's service: the
// request must carry the record's CloudEvents attributes, the trace context and the allow-listed
// header only.
func TestRecordHeadersCannotForgeAttributesOrPassCredentials(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	s, err := New(Config{URL: srv.URL, Timeout: 2 * time.Second, ForwardHeaders: []string{"X-Tenant"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	m := message(`{}`,
		"ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/shop", "ce_type", "OrderCreated",
		"ce-type", "OrderCancelled", "CE-ID", "forged", "Ce_Type", "OrderRefunded", "ce_Source", "/evil",
		"ce_type x", "broken", "ce-seqinboxsequence", "other",
		"traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate", "vendor=1",
		"authorization", "Bearer secret", "Cookie", "session=1", "proxy-authorization", "Basic x", "Proxy-Foo", "1",
		"x-forwarded-for", "10.0.0.1", "X-Forwarded-Host", "evil", "forwarded", "for=1", "host", "evil.example",
		"connection", "close", "x-real-ip", "10.0.0.2", "x-tenant", "t-1", "x-other", "o")
	if err := s.Deliver(context.Background(), m); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	h := <-got
	want := map[string]string{
		"Ce-Type": "OrderCreated", "Ce-Id": "e-1", "Ce-Source": "/shop", "Ce-Seqinboxsequence": "order",
		"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Tracestate": "vendor=1",
		"X-Tenant": "t-1",
	}
	for k, v := range want {
		if vs := h.Values(k); len(vs) != 1 || vs[0] != v {
			t.Errorf("header %s = %q, want exactly %q", k, vs, v)
		}
	}
	for name := range h {
		lower := strings.ToLower(name)
		switch {
		case strings.HasPrefix(lower, "ce-"):
			if _, ok := want[name]; !ok && name != "Ce-Specversion" && name != "Ce-Seqinboxcontextid" {
				t.Errorf("attribute %s = %q does not come from the record's ce_ attributes", name, h[name])
			}
		case lower == "ce_type" || strings.HasPrefix(lower, "proxy-") || strings.HasPrefix(lower, "x-forwarded-"):
			t.Errorf("header %s was forwarded", name)
		}
	}
	for _, absent := range []string{"Authorization", "Cookie", "Proxy-Authorization", "Forwarded", "X-Real-Ip", "X-Other", "Connection"} {
		if v, ok := h[absent]; ok {
			t.Errorf("record header %s = %q reached the sink", absent, v)
		}
	}
}

func TestNewRefusesToForwardCredentialHopByHopAndAttributeHeaders(t *testing.T) {
	for _, name := range []string{"Authorization", "cookie", "Set-Cookie", "Proxy-Authorization", "proxy-foo",
		"X-Forwarded-For", "forwarded", "Host", "Connection", "Transfer-Encoding", "Upgrade", "TE", "Keep-Alive",
		"Content-Length", "ce-type", "CE_ID", "content-type", "traceparent", "seqinbox-dlq-reason", "bad header", ""} {
		_, err := New(Config{URL: "http://x/", Timeout: time.Second, ForwardHeaders: []string{"x-ok", name}}, nil)
		if err == nil || !strings.Contains(err.Error(), "spec.sink.forwardHeaders[1]") {
			t.Errorf("New accepted forwarding %q (error %v), want an error naming spec.sink.forwardHeaders[1]", name, err)
		}
	}
}

// TestAReplyIsDroppedAndAttributesArePercentEncodedAsTheSinkPageSays delivers to a service that
// answers with a CloudEvent, as a Knative reply is: the delivery counts as processed and nothing
// of the reply is kept; the context ID of the page's example arrives encoded as the page shows.
func TestAReplyIsDroppedAndAttributesArePercentEncodedAsTheSinkPageSays(t *testing.T) {
	got := make(chan http.Header, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header
		w.Header().Set("ce-specversion", "1.0")
		w.Header().Set("ce-type", "OrderAccepted")
		w.Header().Set("ce-id", "reply-1")
		w.Header().Set("ce-source", "/orders")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"orderId":"42"}`))
	}))
	defer srv.Close()
	s, err := New(Config{URL: srv.URL, Timeout: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := message(`{}`, "ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/shop", "ce_type", "OrderCreated")
	m.ContextID = "order 42/ü"
	if err := s.Deliver(context.Background(), m); err != nil {
		t.Fatalf("Deliver to a service that replies with a CloudEvent: %v, want processed", err)
	}
	const want = "order%2042/%C3%BC"
	if h := <-got; h.Get(ContextIDHeader) != want {
		t.Errorf("%s = %q, want %q", ContextIDHeader, h.Get(ContextIDHeader), want)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "sink.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "`ce-seqinboxcontextid: "+want+"`") {
		t.Errorf("docs/sink.md does not show the encoded example %s", want)
	}
}
