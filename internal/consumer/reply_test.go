package consumer

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// TestASinkReplyIsDroppedAndTheMessageCountsAsDelivered runs a consumer against a service that
// answers each event with a CloudEvent of its own, as a Knative reply is (docs/sink.md): the
// message is delivered once and stored PROCESSED, its successor is released after it, and the
// reply goes nowhere: no dead letter, no further call.
func TestASinkReplyIsDroppedAndTheMessageCountsAsDelivered(t *testing.T) {
	db := database(t)
	seeds := cluster(t, 1)
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("ce-specversion", "1.0")
		w.Header().Set("ce-type", "OrderAccepted")
		w.Header().Set("ce-id", "reply-to-"+r.Header.Get("ce-id"))
		w.Header().Set("ce-source", "/orders")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`{"accepted":true}`))
	}))
	t.Cleanup(srv.Close)
	r := startConsumer(t, testInbox(t, seeds, "g-reply", srv.URL, sinkOpts{}), "reply-1")
	testenv.Produce(t, seeds, event(0, "OrderPaid", "reply-paid", "reply-o1"), event(0, "OrderCreated", "reply-created", "reply-o1"))
	waitUntil(t, "both records were processed", func() bool { return r.events.count("") == 2 })

	if n := r.events.count("Delivered"); n != 1 {
		t.Errorf("%d records delivered, want 1 (OrderCreated, which released OrderPaid)", n)
	}
	var processed int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM sequenced_message WHERE state = 'PROCESSED'`).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	if processed != 2 {
		t.Errorf("%d messages PROCESSED, want 2: an answer with a CloudEvent is a 2xx like any other", processed)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("the service was called %d times, want 2", n)
	}
	if letters := testenv.ReadTopic(t, seeds, "orders.dlq"); len(letters) != 0 {
		t.Errorf("%d dead letters, want none", len(letters))
	}
}
