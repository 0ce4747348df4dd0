package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// Both commands that take a reason refuse the same unknown ones with the same list of reasons.
func TestListAndRetryRefuseAnUnknownReasonWithTheSameReasons(t *testing.T) {
	_, listErr, listCode := seqinbox(t, "deadletters", "list", "-f", "inbox.yaml", "--reason", "Timeout")
	_, retryErr, retryCode := seqinbox(t, "deadletters", "retry", "-f", "inbox.yaml", "--filter-reason", "Timeout")
	reasons := "use one of " + strings.Join(deadletter.Reasons(), ", ") + "\n"
	if listCode != cli.ExitUsage || retryCode != cli.ExitUsage || !strings.Contains(listErr, reasons) || !strings.Contains(retryErr, reasons) {
		t.Fatalf("list: exit %d %q\nretry: exit %d %q\nwant both exit 2 with %q", listCode, listErr, retryCode, retryErr, reasons)
	}
}

// TestDeadLettersListPrintsEachLetterOfTheSampleWithoutPayload runs `deadletters list` on the
// sample inbox against a broker holding two dead letters, as text and as JSON.
func TestDeadLettersListPrintsEachLetterOfTheSampleWithoutPayload(t *testing.T) {
	seeds := testenv.Kafka(t, 1, "orders", "orders.dlq")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	p := deadletter.NewPublisher(cl, "orders.dlq", nil, nil)
	h := func(k, v string) inbox.Header { return inbox.Header{Key: k, Value: []byte(v)} }
	for _, l := range []deadletter.Letter{
		{Value: []byte(`{"orderId": "o-1", "secret`), Reason: decode.ClassInvalidJSON, Message: "payload is not JSON",
			Headers: []inbox.Header{h("ce_specversion", "1.0"), h("ce_source", "/shop"), h("ce_type", "OrderCreated"), h("ce_id", "e-1")},
			Origin:  inbox.Origin{Topic: "orders", Partition: 0, Offset: 41}},
		{Value: []byte(`{"orderId": "o-2", "secret": 1}`), Reason: deadletter.ReasonListenerFailed, Message: "HTTP 500",
			Headers: []inbox.Header{h("ce_specversion", "1.0"), h("ce_source", "/shop"), h("ce_type", "OrderCreated"), h("ce_id", "e-2")},
			Origin:  inbox.Origin{Topic: "orders", Partition: 0, Offset: 42}, Sequence: "order", ContextID: "o-2"},
	} {
		if err := p.Publish(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	sample := filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml")
	args := []string{"deadletters", "list", "-f", sample, "--bootstrap-servers", strings.Join(seeds, ",")}

	stdout, stderr, code := seqinbox(t, args...)
	t.Logf("text:\n%s", stdout)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if code != cli.ExitOK || len(lines) != 4 || lines[0] != "2 dead letter(s) in orders.dlq" ||
		!strings.Contains(lines[2], "InvalidJSON") || !strings.Contains(lines[2], "orders[0]@41") || !strings.Contains(lines[2], "OrderCreated") ||
		!strings.Contains(lines[3], "ListenerFailed") || !strings.Contains(lines[3], "orders[0]@42") || !strings.Contains(lines[3], "e-2") {
		t.Fatalf("exit %d, stdout:\n%s\nstderr %q; want both letters with reason, origin, type and ID", code, stdout, stderr)
	}
	if strings.Contains(stdout, "secret") {
		t.Fatalf("the list shows a payload:\n%s", stdout)
	}

	stdout, _, code = seqinbox(t, append(args, "--reason", "ListenerFailed", "-o", "json")...)
	var got struct {
		Topic, Reason string
		DeadLetters   []deadletter.Entry
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || code != cli.ExitOK {
		t.Fatalf("-o json: exit %d, %v:\n%s", code, err, stdout)
	}
	if got.Topic != "orders.dlq" || got.Reason != "ListenerFailed" || len(got.DeadLetters) != 1 ||
		got.DeadLetters[0].Offset != 42 || got.DeadLetters[0].IdempotenceID != "e-2" || got.DeadLetters[0].ContextID != "o-2" {
		t.Fatalf("-o json --reason ListenerFailed: %+v, want the one ListenerFailed letter", got)
	}

	ahead := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	stdout, _, code = seqinbox(t, append(args, "--since", ahead)...)
	if code != cli.ExitOK || stdout != "no dead letters in orders.dlq, since "+ahead+"\n" {
		t.Fatalf("--since an hour ahead: exit %d %q, want no dead letters", code, stdout)
	}
}
