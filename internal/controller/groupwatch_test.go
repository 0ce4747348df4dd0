package controller

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

func TestMembersOfAnotherGroupProtocolHoldingTheGroupAreNamed(t *testing.T) {
	h := newHarness(t)
	inbox := h.create("orders", nil)
	group := inbox.Spec.Kafka.ConsumerGroup
	held := func(m []GroupMember) bool { return len(m) == 1 && m[0].Protocol != "" }
	legacy := joinGroup(t, h.seeds, group, "legacy-order-app")
	waitForMembers(t, h.seeds, group, held)

	// Before the first consumer starts, the rollout gate waits for the group to empty.
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders")
	c := h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForConsumerGroupReason,
		"client legacy-order-app", "protocol cooperative-sticky")
	t.Logf("RolloutBlocked while a foreign consumer holds the group: %s: %s", c.Reason, c.Message)
	legacy.Close()
	waitForMembers(t, h.seeds, group, func(m []GroupMember) bool { return len(m) == 0 })
	h.runJobsUntilDeployed("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)

	// The legacy application comes back before the consumers joined: they cannot, and the
	// Deployment does not become available.
	legacy = joinGroup(t, h.seeds, group, "legacy-order-app")
	waitForMembers(t, h.seeds, group, held)
	res := h.reconcile("orders")
	c = h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ConsumerGroupHeldByOtherProtocolReason,
		"client legacy-order-app", "protocol cooperative-sticky", "this inbox's seqinbox-insert-first-v1", group)
	t.Logf("Degraded while a foreign consumer holds the group: %s: %s", c.Reason, c.Message)
	if res.RequeueAfter != testPollInterval {
		t.Errorf("requeue after %s, want %s: no watch reports the members leaving", res.RequeueAfter, testPollInterval)
	}
	if got := h.get("orders"); got.Status.ObservedGeneration != got.Generation {
		t.Errorf("observedGeneration = %d, want %d: the pass ran to its end", got.Status.ObservedGeneration, got.Generation)
	}
	if notes := h.events("orders", v1alpha1.ConsumerGroupHeldByOtherProtocolReason); len(notes) == 0 {
		t.Error("no Event reported the foreign members")
	}

	legacy.Close()
	waitForMembers(t, h.seeds, group, func(m []GroupMember) bool { return len(m) == 0 })
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)
}

func TestRaisingTheGroupProtocolEpochStopsTheOldConsumersFirst(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	if got := h.deployment("orders").Spec.Template.Annotations[annotationGroupProtocol]; got != "seqinbox-insert-first-v1" {
		t.Fatalf("pod template group protocol = %q, want seqinbox-insert-first-v1", got)
	}
	pods := h.startConsumerPods("orders", 2)

	// The new consumers could never join the group next to the old ones: a rolling update would
	// wait for them forever. The old consumers stop first, as for a claim protocol change.
	h.update("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Kafka.GroupProtocolEpoch = 1 })
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.WaitingForOldPodsReason,
		pods[0], "group protocol seqinbox-insert-first-v1")
	if d := h.deployment("orders"); *d.Spec.Replicas != 0 || d.Spec.Template.Annotations[annotationGroupProtocol] != "seqinbox-insert-first-v1" {
		t.Fatalf("deployment = %d replicas announcing %s, want the old consumers scaled to 0", *d.Spec.Replicas,
			d.Spec.Template.Annotations[annotationGroupProtocol])
	}

	h.deletePods(pods...)
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionTrue, v1alpha1.CheckingRegistryReason)
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionRolloutBlocked, metav1.ConditionFalse, v1alpha1.NoOtherConsumersReason)
	for _, j := range h.jobs("orders", componentMigration) {
		if finished, _, _ := jobFinished(&j); !finished {
			h.completeJob(&j)
			h.reconcile("orders")
		}
	}
	d := h.deployment("orders")
	if *d.Spec.Replicas != 2 || d.Spec.Template.Annotations[annotationGroupProtocol] != "seqinbox-insert-first-v1-epoch1" {
		t.Fatalf("deployment = %d replicas announcing %s, want 2 announcing seqinbox-insert-first-v1-epoch1", *d.Spec.Replicas,
			d.Spec.Template.Annotations[annotationGroupProtocol])
	}
}

// runJobsUntilDeployed reconciles, completing every Job the passes start, until the consumer
// Deployment exists.
func (h *harness) runJobsUntilDeployed(name string) {
	h.t.Helper()
	for range 5 {
		h.reconcile(name)
		var d appsv1.Deployment
		if err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name + "-consumer"}, &d); err == nil {
			return
		}
		for _, component := range []string{componentProbe, componentMigration} {
			for _, j := range h.jobs(name, component) {
				if finished, _, _ := jobFinished(&j); !finished {
					h.completeJob(&j)
				}
			}
		}
	}
	h.t.Fatalf("no Deployment of %s after five passes", name)
}
