package controller

import (
	"strings"
	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

func TestCapReplicasTakesTheLowestCap(t *testing.T) {
	partitions := replicaCap{limit: 4, reason: v1alpha1.PartitionCountReason}
	budget := replicaCap{limit: 3, reason: v1alpha1.ConnectionBudgetReason}
	cases := []struct {
		name       string
		requested  int32
		caps       []replicaCap
		want       int32
		wantReason string
	}{
		{name: "no caps", requested: 7, want: 7},
		{name: "below every cap", requested: 2, caps: []replicaCap{partitions, budget}, want: 2},
		{name: "equal to a cap is not capped", requested: 3, caps: []replicaCap{partitions, budget}, want: 3},
		{name: "partition count binds", requested: 10, caps: []replicaCap{partitions}, want: 4, wantReason: v1alpha1.PartitionCountReason},
		{name: "the lower cap binds", requested: 10, caps: []replicaCap{partitions, budget}, want: 3, wantReason: v1alpha1.ConnectionBudgetReason},
		{name: "zero stays zero", requested: 0, caps: []replicaCap{partitions, budget}, want: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, binding := capReplicas(tc.requested, tc.caps)
			reason := ""
			if binding != nil {
				reason = binding.reason
			}
			if got != tc.want || reason != tc.wantReason {
				t.Fatalf("capReplicas(%d) = %d (%q), want %d (%q)", tc.requested, got, reason, tc.want, tc.wantReason)
			}
		})
	}
}

func TestBudgetAndPartitionCaps(t *testing.T) {
	spec := budgetSpec(10, 5, ptr.To(int32(43)))
	c, ok := budgetCap(spec)
	if !ok || c.limit != 3 || !strings.Contains(c.why, "connectionBudget 43 fits 3 consumer(s) of poolSize 10 (+4 maintenance connections each)") {
		t.Errorf("budgetCap(pool 10, budget 43) = %+v, %v; want 3 with the arithmetic named", c, ok)
	}
	if _, ok := budgetCap(budgetSpec(10, 5, nil)); ok {
		t.Error("without a budget there must be no budget cap")
	}
	c, ok = partitionCap(map[string]int32{"orders": 3, "payments": 2})
	if !ok || c.limit != 5 || !strings.Contains(c.why, "orders (3), payments (2)") {
		t.Errorf("partitionCap = %+v, %v; want 5 naming both topics", c, ok)
	}
	if _, ok := partitionCap(map[string]int32{}); ok {
		t.Error("no existing topic must leave the partition count unknown, not cap to zero")
	}
}

// scaleTo does what `kubectl scale sqi/NAME --replicas=n` does: an update of the scale subresource.
func (h *harness) scaleTo(name string, n int32) {
	h.t.Helper()
	scale := &autoscalingv1.Scale{}
	inbox := h.get(name)
	h.must(k8s.SubResource("scale").Get(h.ctx, inbox, scale))
	scale.Spec.Replicas = n
	h.must(k8s.SubResource("scale").Update(h.ctx, inbox, client.WithSubResourceBody(scale)))
}

func (h *harness) scale(name string) *autoscalingv1.Scale {
	h.t.Helper()
	scale := &autoscalingv1.Scale{}
	h.must(k8s.SubResource("scale").Get(h.ctx, h.get(name), scale))
	return scale
}

func TestKubectlScaleIsKeptAcrossReconciles(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	configHash := h.get("orders").Status.ConfigHash
	template := h.deployment("orders").Spec.Template.Annotations[annotationConfigHash]

	h.scaleTo("orders", 3)
	for range 3 {
		h.reconcile("orders")
		h.rollOut("orders")
	}
	if got := *h.deployment("orders").Spec.Replicas; got != 3 {
		t.Fatalf("deployment replicas = %d after kubectl scale --replicas=3 and three passes, want 3", got)
	}
	inbox := h.get("orders")
	if got := ptr.Deref(inbox.Spec.Replicas, -1); got != 3 {
		t.Fatalf("spec.replicas = %d after three passes, want the scaled 3: the operator must never write it", got)
	}
	if inbox.Status.ConfigHash != configHash || h.deployment("orders").Spec.Template.Annotations[annotationConfigHash] != template {
		t.Error("scaling changed the rendered configuration; every consumer would restart")
	}
	scale := h.scale("orders")
	if scale.Spec.Replicas != 3 || scale.Status.Replicas != 3 {
		t.Errorf("scale = spec %d, status %d; want 3 and 3", scale.Spec.Replicas, scale.Status.Replicas)
	}
	if want := "app.kubernetes.io/component=consumer,app.kubernetes.io/instance=orders,app.kubernetes.io/name=seqinbox"; scale.Status.Selector != want {
		t.Errorf("scale selector = %q, want %q", scale.Status.Selector, want)
	}
	h.expectCondition("orders", v1alpha1.ConditionScalingLimited, metav1.ConditionFalse, v1alpha1.WithinLimitsReason, "3 consumer(s)")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason, "3 of 3")

	h.scaleTo("orders", 0)
	h.reconcile("orders")
	h.reconcile("orders")
	if got := *h.deployment("orders").Spec.Replicas; got != 0 {
		t.Fatalf("deployment replicas = %d after scaling to zero, want 0", got)
	}
}

func TestScaleIsCappedByThePartitionCount(t *testing.T) {
	h := newHarness(t) // the topic orders has 4 partitions
	h.create("orders", nil)
	h.bringUp("orders")

	h.scaleTo("orders", 10)
	res := h.reconcile("orders")
	if got := *h.deployment("orders").Spec.Replicas; got != 4 {
		t.Fatalf("deployment replicas = %d for 10 asked on 4 partitions, want 4", got)
	}
	h.expectCondition("orders", v1alpha1.ConditionScalingLimited, metav1.ConditionTrue, v1alpha1.PartitionCountReason,
		"asks for 10", "4 run", "orders (4)")
	if got := ptr.Deref(h.get("orders").Spec.Replicas, -1); got != 10 {
		t.Errorf("spec.replicas = %d, want the asked 10 left alone", got)
	}
	if s := h.scale("orders"); s.Spec.Replicas != 10 || s.Status.Replicas != 4 {
		t.Errorf("scale = spec %d, status %d; want 10 asked, 4 running", s.Spec.Replicas, s.Status.Replicas)
	}
	if res.RequeueAfter != partitionRecheck {
		t.Errorf("requeue after %s, want %s: added partitions raise no watch event", res.RequeueAfter, partitionRecheck)
	}

	h.scaleTo("orders", 2)
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionScalingLimited, metav1.ConditionFalse, v1alpha1.WithinLimitsReason)
	if got := *h.deployment("orders").Spec.Replicas; got != 2 {
		t.Errorf("deployment replicas = %d, want 2", got)
	}
}

func TestScaleIsCappedByTheConnectionBudget(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) {
		in.Spec.Database.PoolSize, in.Spec.Database.ConnectionBudget = 10, ptr.To(int32(43))
	})
	h.bringUp("orders")
	h.scaleTo("orders", 4)
	h.reconcile("orders")
	if got := *h.deployment("orders").Spec.Replicas; got != 3 {
		t.Fatalf("deployment replicas = %d with a budget of 43 and poolSize 10 (+4), want 3", got)
	}
	h.expectCondition("orders", v1alpha1.ConditionScalingLimited, metav1.ConditionTrue, v1alpha1.ConnectionBudgetReason,
		"asks for 4", "3 run", "connectionBudget 43")
	h.expectCondition("orders", v1alpha1.ConditionConfigValid, metav1.ConditionTrue, v1alpha1.ValidReason)
}

func TestUnreadablePartitionCountDoesNotCap(t *testing.T) {
	h := newHarness(t)
	h.seeds = testenv.Kafka(t, 4) // a cluster without the topic
	h.create("orders", nil)
	h.bringUp("orders")
	if got := *h.deployment("orders").Spec.Replicas; got != 2 {
		t.Fatalf("deployment replicas = %d, want the asked 2", got)
	}
	h.expectCondition("orders", v1alpha1.ConditionScalingLimited, metav1.ConditionUnknown, v1alpha1.PartitionCountUnknownReason,
		"none of the topics orders exists yet")
}

func TestStrimziSecretsReachASecuredKafkaAndAWrongPasswordIsACondition(t *testing.T) {
	h := newHarness(t)
	pki := testenv.NewPKI(t)
	h.seeds = testenv.SecureKafka(t, pki, "SCRAM-SHA-512", "orders-user", "s3cret", 4, "orders")
	cert, key := pki.Client(t, "orders-user")
	// What Strimzi creates: the cluster CA Secret and the KafkaUser's Secret.
	h.must(k8s.Create(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "my-cluster-cluster-ca-cert", Namespace: h.ns},
		Data: map[string][]byte{"ca.crt": pki.CAPEM}}))
	h.must(k8s.Create(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orders-user", Namespace: h.ns},
		Data: map[string][]byte{"user.crt": cert, "user.key": key, "password": []byte("s3cret")}}))
	h.create("orders", func(in *v1alpha1.SequentialInbox) {
		in.Spec.Kafka.TLS = &v1alpha1.KafkaTLS{
			CASecretRef:       &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "my-cluster-cluster-ca-cert"}, Key: "ca.crt"},
			ClientCertificate: &v1alpha1.KafkaClientCertificate{SecretName: "orders-user"},
		}
		in.Spec.Kafka.SASL = &v1alpha1.KafkaSASL{Mechanism: "SCRAM-SHA-512", Username: "orders-user",
			PasswordSecretRef: corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-user"}, Key: "password"}}
	})
	h.bringUp("orders")
	h.expectCondition("orders", v1alpha1.ConditionScalingLimited, metav1.ConditionFalse, v1alpha1.WithinLimitsReason)
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)

	h.must(k8s.Update(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orders-user", Namespace: h.ns},
		Data: map[string][]byte{"user.crt": cert, "user.key": key, "password": []byte("wrong")}}))
	res := h.reconcile("orders") // fails the test on a reconcile error: no crash loop
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.KafkaAccessFailedReason,
		"Kafka authentication failed", "SASL SCRAM-SHA-512", `user "orders-user"`, "password from Secret orders-user key password",
		"client certificate of Secret orders-user")
	h.expectCondition("orders", v1alpha1.ConditionScalingLimited, metav1.ConditionUnknown, v1alpha1.PartitionCountUnknownReason)
	if res.RequeueAfter != partitionRecheck {
		t.Errorf("requeue after %s, want %s: a fixed Secret raises no watch event", res.RequeueAfter, partitionRecheck)
	}
	if got := *h.deployment("orders").Spec.Replicas; got != 2 {
		t.Errorf("deployment replicas = %d, want the running 2 left alone", got)
	}
}
