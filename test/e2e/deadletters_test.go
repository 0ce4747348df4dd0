//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// testPluginDeadLetters produces a record that is no JSON, which the consumers dead-letter as
// InvalidJSON, and requires the built plugin to show it: `kubectl seqinbox deadletters
// order-inbox list` (run in a consumer pod through pods/exec) with its reason, original topic,
// partition and offset, type and idempotence ID, the same in -o json, and `kubectl seqinbox status`
// counting it among the dead letters of the last hour, under its reason.
func testPluginDeadLetters(t *testing.T, s *suite) {
	id := fmt.Sprintf("poison-%d", time.Now().UnixNano())
	poison := &kgo.Record{Topic: topic, Partition: 0, Value: []byte(`{"orderId": "not json`),
		Headers: []kgo.RecordHeader{
			{Key: "ce_specversion", Value: []byte("1.0")},
			{Key: "ce_id", Value: []byte(id)},
			{Key: "ce_type", Value: []byte("OrderCreated")},
			{Key: "ce_source", Value: []byte("/e2e/orders")},
			{Key: "content-type", Value: []byte("application/json")},
		}}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res := s.producer.ProduceSync(ctx, poison)
	if err := res.FirstErr(); err != nil {
		t.Fatalf("produce the poison record: %v", err)
	}
	offset := res[0].Record.Offset
	origin := fmt.Sprintf("%s[%d]@%d", topic, 0, offset)
	t.Logf("poison record %s produced at %s", id, origin)
	s.awaitProcessed(t, 2*time.Minute)

	var out string
	testenv.WaitUntil(t, "deadletters list shows the poison record", time.Minute, func() bool {
		var code int
		out, code = kubectlSeqinbox(t, "deadletters", inboxName, "list", "-n", namespace)
		return code == 0 && lineContaining(out, id) != ""
	})
	t.Logf("kubectl seqinbox deadletters %s list -n %s:\n%s", inboxName, namespace, out)
	line := lineContaining(out, id)
	for _, want := range []string{"InvalidJSON", origin, "OrderCreated"} {
		if !strings.Contains(line, want) {
			t.Errorf("the poison record's line %q lacks %q", line, want)
		}
	}

	out, code := kubectlSeqinbox(t, "deadletters", inboxName, "list", "-n", namespace, "--reason", "InvalidJSON", "-o", "json")
	t.Logf("kubectl seqinbox deadletters %s list --reason InvalidJSON -o json:\n%s", inboxName, out)
	var list struct {
		Topic       string `json:"topic"`
		DeadLetters []struct {
			Reason        string `json:"reason"`
			Topic         string `json:"topic"`
			Partition     int32  `json:"partition"`
			Offset        int64  `json:"offset"`
			Type          string `json:"type"`
			IdempotenceID string `json:"idempotenceID"`
		} `json:"deadLetters"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 {
		t.Fatalf("-o json: exit %d, %v", code, err)
	}
	found := false
	for _, l := range list.DeadLetters {
		if l.IdempotenceID == id {
			found = l.Reason == "InvalidJSON" && l.Topic == topic && l.Partition == 0 && l.Offset == offset && l.Type == "OrderCreated"
			if !found {
				t.Errorf("the poison record in -o json: %+v, want InvalidJSON from %s, type OrderCreated", l, origin)
			}
		}
	}
	if list.Topic != deadLetterTopic || !found {
		t.Errorf("-o json --reason InvalidJSON lists %s without the poison record %s", list.Topic, id)
	}

	// An unknown reason is the pod command's usage error, passed through with its exit code.
	out, code = kubectlSeqinbox(t, "deadletters", inboxName, "list", "-n", namespace, "--reason", "Poison")
	t.Logf("--reason Poison: exit %d:\n%s", code, out)
	if code != 2 || !strings.Contains(out, `--reason "Poison": no dead letter has this reason; use one of`) {
		t.Errorf("--reason Poison: exit %d, want 2 and the list of reasons", code)
	}

	testenv.WaitUntil(t, "kubectl seqinbox status counts the dead letter of the last hour under its reason", 2*time.Minute, func() bool {
		out, code = kubectlSeqinbox(t, "status", inboxName, "-n", namespace)
		row := lineContaining(out, "Dead letters, last hour")
		_, below, _ := strings.Cut(out, row)
		return code == 0 && row != "" && !strings.HasSuffix(strings.TrimSpace(row), " 0") && strings.Contains(below, "\n    InvalidJSON ")
	})
	t.Logf("kubectl seqinbox status %s -n %s:\n%s", inboxName, namespace, out)
}

// lineContaining returns the first line of out that contains s, or "".
func lineContaining(out, s string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

var buildKubectlSeqinbox = sync.OnceValue(func() error {
	_, err := script(nil, "go", "build", "-trimpath", "-o", "bin/kubectl-seqinbox", "./cmd/kubectl-seqinbox")
	return err
})

// kubectlSeqinbox runs the plugin built from this source (bin/kubectl-seqinbox) against the suite's
// cluster and returns its stdout and stderr together, and its exit code.
func kubectlSeqinbox(t *testing.T, args ...string) (string, int) {
	t.Helper()
	if err := buildKubectlSeqinbox(); err != nil {
		t.Fatalf("build bin/kubectl-seqinbox: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.root, "bin", "kubectl-seqinbox"), append(args, "--kubeconfig", env.kubeconfig)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		return out.String(), exit.ExitCode()
	} else if err != nil {
		t.Fatalf("run kubectl-seqinbox %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), 0
}
