//go:build e2e

package e2e

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// steadyStateWindow is longer than the two minutes at which the operator used to start a Job
// per running inbox to read the consumer registry.
const steadyStateWindow = 150 * time.Second

// testConsumerStateInStatus runs after the stream was processed: the operator reads its consumer
// pods over the pod network, with the credentials it mounted into them, and status.consumers
// and kubectl get sqi show each pod's partitions and a lag of zero, as the committed offsets
// say; then, for longer than the old registry-check interval, the operator starts no Job.
func testConsumerStateInStatus(t *testing.T, s *suite) {
	pods := consumerPods(t)
	slices.Sort(pods)
	var sum *v1alpha1.ConsumersStatus
	testenv.WaitUntil(t, "status.consumers lists every consumer pod, read", 2*time.Minute, func() bool {
		out, err := kubectlErr(t.Context(), nil, "-n", namespace, "get", "sqi", inboxName, "-o", "jsonpath={.status.consumers}")
		if err != nil || out == "" {
			return false
		}
		sum = &v1alpha1.ConsumersStatus{}
		if err := json.Unmarshal([]byte(out), sum); err != nil {
			t.Fatalf("status.consumers %s: %v", out, err)
		}
		var read []string
		for _, p := range sum.Pods {
			if p.Unreachable == "" && p.Partitions != "" {
				read = append(read, p.Name)
			}
		}
		slices.Sort(read)
		return slices.Equal(read, pods) && sum.WaitingMessages != nil
	})
	if left, err := s.unprocessed(t.Context()); err != nil || left != 0 || sum.Lag != 0 {
		t.Errorf("status.consumers.lag %d; the committed offsets leave %d (%v)", sum.Lag, left, err)
	}
	for _, p := range sum.Pods {
		if !strings.Contains(p.Partitions, topic+"[") || !p.Ready || p.Blocked != nil {
			t.Errorf("status.consumers.pods: %+v, want a ready pod holding partitions of %s, nothing blocked", p, topic)
		}
	}
	table := kubectl(t, "-n", namespace, "get", "sqi", inboxName)
	if header := strings.Fields(strings.SplitN(table, "\n", 2)[0]); !slices.Contains(header, "LAG") || !slices.Contains(header, "WAITING") {
		t.Errorf("kubectl get sqi shows no LAG and WAITING columns:\n%s", table)
	}
	t.Logf("kubectl get sqi -o wide:\n%s", kubectl(t, "-n", namespace, "get", "sqi", inboxName, "-o", "wide"))

	jobs := func() []string {
		return strings.Fields(kubectl(t, "-n", namespace, "get", "jobs", "-o", "name", "-l", "app.kubernetes.io/instance="+inboxName))
	}
	before := jobs()
	deadline := time.Now().Add(steadyStateWindow)
	for time.Now().Before(deadline) {
		if now := jobs(); len(now) != len(before) {
			t.Fatalf("the operator created Jobs in the steady state: %v, before %v", now, before)
		}
		time.Sleep(10 * time.Second)
	}
}
