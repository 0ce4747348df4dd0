package plugin

import (
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// approvalOf is the approval annotation of the inbox, "" when it has none.
func approvalOf(t *testing.T, ns string) string {
	t.Helper()
	var inbox v1alpha1.SequentialInbox
	must(t, k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "order-inbox"}, &inbox))
	return inbox.Annotations[v1alpha1.ApproveRolloutAnnotation]
}

func TestApproveShowsThePlanThenSetsTheAnnotationToTheTargetVersion(t *testing.T) {
	ns := namespace(t, "approve-yes")
	inbox := createInbox(t, ns, "order-inbox", func(in *v1alpha1.SequentialInbox) { in.Spec.UpgradeStrategy = v1alpha1.UpgradeSupervised },
		awaitingApprovalStatus("order-inbox"))
	consumerPod(t, inbox, "order-inbox-consumer-0", 0)
	consumerPod(t, inbox, "order-inbox-consumer-1", 0)

	r := plugin(t, testNow, "y\n", "approve", "order-inbox", "-n", ns)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	plan, done, ok := strings.Cut(r.stdout, "Approve? [y/N] ")
	if !ok {
		t.Fatalf("no confirmation asked:\n%s", r.stdout)
	}
	for _, want := range []string{
		"to engine v2.0.0 (claim protocol insert-first-v2, image ghcr.io/seqinbox/seqinbox:v2.0.0)",
		"The 2 running consumer pod(s) (engine v1.0.0, claim protocol insert-first-v1) stop: order-inbox-consumer-0, order-inbox-consumer-1",
		"no live consumer of v1.0.0",
		"then starts 2 consumer(s) of v2.0.0",
	} {
		if !strings.Contains(plan, want) {
			t.Errorf("the plan does not say %q:\n%s", want, plan)
		}
	}
	if !strings.HasPrefix(done, "Approved: inbox.seqinbox.dev/approve-rollout=v2.0.0 set on sequentialinbox/order-inbox.") {
		t.Errorf("after the answer: %q", done)
	}
	if got := approvalOf(t, ns); got != "v2.0.0" {
		t.Fatalf("annotation %s = %q, want v2.0.0", v1alpha1.ApproveRolloutAnnotation, got)
	}
	// Approved already, before the operator's next pass: nothing more to approve.
	if r := plugin(t, testNow, "y\n", "approve", "order-inbox", "-n", ns); r.code != 1 || !strings.Contains(r.stderr, "is approved for v2.0.0 already") {
		t.Fatalf("second approval: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestApproveWithoutAYesAnswerChangesNothing(t *testing.T) {
	ns := namespace(t, "approve-no")
	createInbox(t, ns, "order-inbox", func(in *v1alpha1.SequentialInbox) { in.Spec.UpgradeStrategy = v1alpha1.UpgradeSupervised },
		awaitingApprovalStatus("order-inbox"))
	for _, in := range []string{"n\n", "", "maybe\n"} {
		r := plugin(t, testNow, in, "approve", "order-inbox", "-n", ns)
		if r.code != 1 || !strings.Contains(r.stderr, "not approved: nothing changed; answer y, or pass --yes") {
			t.Errorf("answer %q: exit %d, stderr %q", in, r.code, r.stderr)
		}
	}
	if got := approvalOf(t, ns); got != "" {
		t.Fatalf("annotation set to %q without a yes", got)
	}
	if r := plugin(t, testNow, "", "approve", "order-inbox", "-n", ns, "--yes"); r.code != 0 || strings.Contains(r.stdout, "Approve? ") {
		t.Fatalf("--yes: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if got := approvalOf(t, ns); got != "v2.0.0" {
		t.Fatalf("--yes: annotation %q, want v2.0.0", got)
	}
}

func TestApproveRefusesAnInboxThatWaitsForNoApproval(t *testing.T) {
	tests := []struct {
		name     string
		strategy v1alpha1.UpgradeStrategy
		status   *v1alpha1.SequentialInboxStatus
		says     string
	}{
		{"approve-automatic", v1alpha1.UpgradeAutomatic, awaitingApprovalStatus("order-inbox"), "has upgradeStrategy Automatic: its rollouts need no approval"},
		{"approve-nothing", v1alpha1.UpgradeSupervised, runningStatus("order-inbox"), "waits for no approval (RolloutBlocked is False (SameClaimProtocol)): nothing to approve"},
		{"approve-new", v1alpha1.UpgradeSupervised, nil, "waits for no approval (no RolloutBlocked condition yet)"},
	}
	for _, tt := range tests {
		ns := namespace(t, tt.name)
		createInbox(t, ns, "order-inbox", func(in *v1alpha1.SequentialInbox) { in.Spec.UpgradeStrategy = tt.strategy }, tt.status)
		r := plugin(t, testNow, "y\n", "approve", "order-inbox", "-n", ns)
		if r.code != 1 || !strings.Contains(r.stderr, tt.says) || strings.Contains(r.stdout, "Approve?") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 saying %q", tt.name, r.code, r.stdout, r.stderr, tt.says)
		}
		if got := approvalOf(t, ns); got != "" {
			t.Errorf("%s: annotation set to %q", tt.name, got)
		}
	}
}
