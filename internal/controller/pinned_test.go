package controller

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/version"
)

func TestServesStateFromTheFirstReleaseThatHasItAndForBuildsOutsideTheReleases(t *testing.T) {
	for _, tc := range []struct {
		version string
		want    bool
	}{
		{"v0.0.9", false},
		{"v0.0.1", false},
		{"0.0.9", false},
		{"v0.0.0-legacy", false}, // the e2e suite's legacy engine stands for an old release
		{stateServedSince, true},
		{"v0.1.0-dev", true}, // built on the way to v0.1.0, from the source that has it
		{"v0.1.0-rc.1", true},
		{"v0.1.1", true},
		{"v1.0.0+build.7", true},
		{"v2.0.0", true},
		{version.Unstamped, true},
		{"install-test", true}, // no release number: a build of this source outside the releases
	} {
		if got := servesState(tc.version); got != tc.want {
			t.Errorf("servesState(%q) = %v, want %v", tc.version, got, tc.want)
		}
	}
}

// stateParts reports what of the consumer state the Deployment's pods get: the flags, the state
// port, the credentials' volume and its mount.
func stateParts(d *appsv1.Deployment) []string {
	var parts []string
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--state-") {
			parts = append(parts, a)
		}
	}
	if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == statePortName }) {
		parts = append(parts, "port "+statePortName)
	}
	if slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == stateDir }) {
		parts = append(parts, "mount "+stateDir)
	}
	if slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && strings.HasSuffix(v.Secret.SecretName, "-consumer-state")
	}) {
		parts = append(parts, "volume of the credentials")
	}
	return parts
}

func TestAnImagePinnedToAReleaseBeforeTheConsumerStateRunsWithoutItAndTheStatusSaysWhy(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Image = imageBeforeState })
	h.bringUp("orders")
	d := h.deployment("orders")
	if parts := stateParts(d); len(parts) != 0 {
		t.Fatalf("the consumers of v0.0.9 get %v; its consume command refuses them and would not start", parts)
	}
	if got := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(got, "--metrics-bind-address") || !slices.Contains(got, "--instance-id") {
		t.Errorf("consumer args %q lost more than the state flags", got)
	}
	h.expectCondition("orders", v1alpha1.ConditionConsumerStateServed, metav1.ConditionFalse, v1alpha1.EnginePredatesStateReason,
		"v0.0.9", stateServedSince, "status.consumers")
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason)

	// Its running pods, which have no state port, are not read, and no summary claims a lag of
	// zero (before, a pod was read at port 8443 anyway and listed unreachable).
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "orders-consumer-0", Namespace: h.ns, Labels: objectLabels(h.get("orders"), componentConsumer)},
		Spec:       d.Spec.Template.Spec,
	}
	h.must(k8s.Create(h.ctx, p))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}}}
	h.must(k8s.Status().Update(h.ctx, p))
	h.reconcile("orders")
	for range 4 {
		h.clock.Step(h.r.StatusWriteInterval)
		if h.poll("orders") {
			t.Fatal("the poller asked for a pass of consumers that serve no state")
		}
		h.reconcile("orders")
	}
	if sum := h.get("orders").Status.Consumers; sum != nil {
		t.Errorf("status.consumers %+v for consumers that serve no state, want none", sum)
	}

	// Moving to a release that serves it brings the state back with the rollout.
	h.update("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Image = imageV1 })
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentProbe))
	h.reconcile("orders")
	h.completeJob(h.onlyJob("orders", componentMigration))
	h.reconcile("orders")
	if parts := stateParts(h.deployment("orders")); len(parts) != 5 {
		t.Fatalf("the consumers of v1.0.0 get %v, want both flags, the port, the mount and the volume", parts)
	}
	h.rollOut("orders")
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionConsumerStateServed, metav1.ConditionTrue, v1alpha1.StateServedReason, "v1.0.0")
}
