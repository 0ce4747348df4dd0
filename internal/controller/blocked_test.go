package controller

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/migrations"
)

// blockedConsumer is a registry entry whose consumer has retried a record since since.
func blockedConsumer(instance string, partition int32, offset int64, since time.Time, err string) migrations.LiveConsumer {
	return migrations.LiveConsumer{InstanceID: instance, ConsumerGroup: "orders", EngineVersion: "v1.0.0", ClaimProtocol: "1",
		HeartbeatAt: since, Blocked: &migrations.BlockedRecord{Topic: "orders", Partition: partition, Offset: offset, Since: since, Error: err}}
}

func TestRecordRetriedForLongDegradesTheInboxNamingItUntilTheRegistryIsClear(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	if jobs := h.jobs("orders", componentRegistryCheck); len(jobs) != 0 {
		t.Fatalf("registry checks %v of consumers that just started, want none before the check interval", jobNames(jobs))
	}

	h.clock.Step(h.r.RegistryCheckInterval)
	h.reconcile("orders")
	check := h.onlyJob("orders", componentRegistryCheck)
	if args := strings.Join(check.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "migrate") || !strings.Contains(args, "--dry-run") {
		t.Fatalf("registry check runs seqinbox %s, want a dry-run migrate", args)
	}
	now := h.clock.Now()
	h.completeJob(check,
		blockedConsumer("orders-consumer-0", 3, 1234, now.Add(-h.r.BlockedThreshold-time.Minute), "claim OrderCreated/o-1: ERROR: out of resources (SQLSTATE 53000)"),
		blockedConsumer("orders-consumer-1", 1, 77, now.Add(-time.Minute), "ERROR: a young retry (SQLSTATE 40001)"))
	h.reconcile("orders")
	c := h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.PartitionBlockedReason,
		"orders-consumer-0", "offset 1234", "orders[3]", "SQLSTATE 53000", "6m0s")
	if strings.Contains(c.Message, "orders-consumer-1") || strings.Contains(c.Message, "40001") {
		t.Fatalf("Degraded names a record retried for less than the threshold: %s", c.Message)
	}
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason)

	// The next check runs after the interval; while it runs, and after it failed, the last
	// successful one stands.
	h.clock.Step(h.r.RegistryCheckInterval)
	h.reconcile("orders")
	failing := h.onlyJob("orders", componentRegistryCheck)
	if failing.Name == check.Name {
		t.Fatalf("no new registry check after the interval")
	}
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.PartitionBlockedReason, "offset 1234")
	h.failJob(failing, "connection refused")
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.PartitionBlockedReason, "offset 1234")

	h.clock.Step(testRetryBase)
	h.reconcile("orders")
	next := h.onlyJob("orders", componentRegistryCheck)
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.PartitionBlockedReason, "offset 1234")
	h.completeJob(next, migrations.LiveConsumer{InstanceID: "orders-consumer-0", ConsumerGroup: "orders", EngineVersion: "v1.0.0",
		ClaimProtocol: "1", HeartbeatAt: h.clock.Now()})
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)
	if jobs := h.jobs("orders", componentRegistryCheck); len(jobs) != 1 || jobs[0].Name != next.Name {
		t.Fatalf("registry check Jobs %v, want only the last one %s", jobNames(jobs), next.Name)
	}
}
