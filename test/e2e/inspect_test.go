//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/inbox"
)

// testPluginInspect buffers an order's OrderShipped after its OrderCreated and its validation but
// without its OrderPaid, and runs the plugin as a user does: `kubectl seqinbox inspect`, which
// execs `seqinbox inspect` in a consumer pod with the pod's credentials, names OrderPaid as the
// missing predecessor and the validation as processed, with its time. `kubectl seqinbox
// consume` then releases OrderShipped, and inspect shows it PROCESSED; the order's last events
// close the instance.
func testPluginInspect(t *testing.T, s *suite) {
	awaitReadyReplicas(t, 1)
	order := s.newOrders(1)
	contextID := fmt.Sprint(order)
	shipped := fmt.Sprintf("order-%d-OrderShipped", order)
	events := func(types ...string) []*kgo.Record {
		var recs []*kgo.Record
		for _, r := range orderRecords(order, 1, 1) {
			if slices.Contains(types, string(r.Headers[2].Value)) {
				recs = append(recs, r)
			}
		}
		return recs
	}
	produce(t, s.producer, events("OrderCreated", "OrderValidated"))
	s.awaitProcessed(t, 2*time.Minute)
	produce(t, s.producer, events("OrderShipped"))
	s.awaitProcessed(t, 2*time.Minute)
	if n := countAccepted(s.sink.accepted(), shipped); n != 0 {
		t.Fatalf("%s reached the sink before OrderPaid; want it buffered", shipped)
	}

	text := runPlugin(t, "inspect", inboxName, "--context-id", contextID)
	t.Logf("kubectl seqinbox inspect %s --context-id %s:\n%s", inboxName, contextID, text)
	for _, want := range []string{
		"Instance order/" + contextID + ": OPEN",
		shipped + ": OrderShipped waits for OrderPaid, which has not arrived; OrderValidated.STOCK_AVAILABLE arrived and was processed at ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect does not say %q", want)
		}
	}
	var in inbox.Inspection
	data := runPlugin(t, "inspect", inboxName, "--message", "OrderShipped/"+shipped, "-o", "json")
	if err := json.Unmarshal([]byte(data), &in); err != nil {
		t.Fatalf("inspect -o json: %v:\n%s", err, data)
	}
	if len(in.Messages) != 1 || in.Messages[0].State != "WAITING" || in.Messages[0].Waits == nil ||
		!slices.Equal(in.Messages[0].Waits.MissingTypes, []string{"OrderPaid"}) || in.Instance.ContextID != contextID {
		t.Fatalf("inspect --message -o json: %s", data)
	}

	// consume delivers the waiting message now, its condition ignored.
	out := runPlugin(t, "consume", inboxName, "OrderShipped/"+shipped, "--timeout", "90s")
	t.Logf("kubectl seqinbox consume %s OrderShipped/%s:\n%s", inboxName, shipped, out)
	if n := countAccepted(s.sink.accepted(), shipped); n != 1 {
		t.Fatalf("%s accepted %d times after consume; want once", shipped, n)
	}
	text = runPlugin(t, "inspect", inboxName, "--context-id", contextID, "--sequence", "order")
	t.Logf("kubectl seqinbox inspect after consume:\n%s", text)
	if !regexp.MustCompile(`(?m)^  OrderShipped +`+shipped+` +PROCESSED `).MatchString(text) || strings.Contains(text, "\nWaiting\n") {
		t.Errorf("after consume, inspect shows OrderShipped not PROCESSED, or something waiting")
	}

	// The order's remaining events arrive: every type is processed, the instance closes.
	produce(t, s.producer, events("OrderPaid", "OrderDelivered"))
	s.awaitProcessed(t, 2*time.Minute)
	text = runPlugin(t, "inspect", inboxName, "--context-id", contextID)
	t.Logf("kubectl seqinbox inspect once the order is complete:\n%s", text)
	if !strings.Contains(text, "Instance order/"+contextID+": CLOSED") {
		t.Errorf("the complete order's instance is not CLOSED")
	}
}

// runPlugin runs the plugin built from this source (kubectlSeqinbox) in the suite's namespace and
// returns its output; it fails the test when the plugin exits non-zero.
func runPlugin(t *testing.T, args ...string) string {
	t.Helper()
	out, code := kubectlSeqinbox(t, append(args, "-n", namespace)...)
	if code != 0 {
		t.Fatalf("kubectl seqinbox %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}
