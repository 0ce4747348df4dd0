package controller

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv/clustersim"
)

// consumeAction is a Consume of OrderPaid/order-42-paid on the inbox.
func (h *harness) consumeAction(name, inbox string) *v1alpha1.SequentialInboxAction {
	h.t.Helper()
	action := &v1alpha1.SequentialInboxAction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec: v1alpha1.SequentialInboxActionSpec{InboxName: inbox, Action: v1alpha1.ActionConsume,
			Message: &v1alpha1.ActionMessageTarget{Type: "OrderPaid", IdempotenceID: "order-42-paid"}},
	}
	h.must(k8s.Create(h.ctx, action))
	return action
}

func (h *harness) getAction(name string) *v1alpha1.SequentialInboxAction {
	h.t.Helper()
	var action v1alpha1.SequentialInboxAction
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &action))
	return &action
}

// reconcileAction runs one pass of the action reconciler.
func (h *harness) reconcileAction(name string) ctrl.Result {
	h.t.Helper()
	res, err := NewActionReconciler(h.r).Reconcile(h.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: h.ns, Name: name}})
	if err != nil {
		h.t.Fatalf("reconcile action %s: %v", name, err)
	}
	return res
}

// expectAction asserts the action's phase, the reason of its Recorded condition, and that its
// message mentions each of mentions.
func (h *harness) expectAction(name string, phase v1alpha1.ActionPhase, reason string, mentions ...string) *v1alpha1.SequentialInboxAction {
	h.t.Helper()
	action := h.getAction(name)
	c := meta.FindStatusCondition(action.Status.Conditions, v1alpha1.ConditionRecorded)
	if action.Status.Phase != phase || c == nil || c.Reason != reason {
		h.t.Fatalf("action %s: phase %q, condition %+v; want phase %s, reason %s", name, action.Status.Phase, c, phase, reason)
	}
	want := metav1.ConditionFalse
	if phase == v1alpha1.ActionRecorded {
		want = metav1.ConditionTrue
	}
	if c.Status != want {
		h.t.Fatalf("action %s: Recorded=%s, want %s", name, c.Status, want)
	}
	for _, m := range mentions {
		if !strings.Contains(action.Status.Message, m) || !strings.Contains(c.Message, m) {
			h.t.Errorf("action %s: message %q / condition %q does not mention %q", name, action.Status.Message, c.Message, m)
		}
	}
	return action
}

func actionReportJSON(t *testing.T, r ActionReport) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestActionIsRecordedByAJobFromTheInboxImageThenAwaitedUntilExecuted(t *testing.T) {
	h := newHarness(t)
	h.create("orders", func(in *v1alpha1.SequentialInbox) {
		in.Spec.Image = imageV2
		in.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
	})
	action := h.consumeAction("consume-42", "orders")

	if res := h.reconcileAction("consume-42"); res.RequeueAfter != 0 {
		t.Fatalf("result %+v, want to wait for the Job's events", res)
	}
	job := h.onlyJob("orders", componentAction)
	st := h.expectAction("consume-42", v1alpha1.ActionPending, v1alpha1.RecordingReason, job.Name, imageV2).Status
	if st.JobName != job.Name {
		t.Fatalf("status.jobName = %q, want %s", st.JobName, job.Name)
	}
	if !metav1.IsControlledBy(job, action) || metav1.IsControlledBy(job, h.get("orders")) {
		t.Fatalf("Job owners = %+v, want the action as controller, not the inbox", job.OwnerReferences)
	}
	c := job.Spec.Template.Spec.Containers[0]
	wantArgs := []string{"action", "--output", "json", "--termination-message-path", "/dev/termination-log",
		"--action", "Consume", "--request-id", string(action.UID), "--wait", actionWait.String(),
		"--type", "OrderPaid", "--idempotence-id", "order-42-paid"}
	if !slices.Equal(c.Args, wantArgs) || c.Image != imageV2 {
		t.Fatalf("container = %s %q, want %s %q", c.Image, c.Args, imageV2, wantArgs)
	}
	// The same pod as the migration Job: hardening, database Secret, the inbox the tables must
	// belong to, pull secrets, no retries, bounded lifetime.
	migration := buildJob(h.get("orders"), imageV2, jobRequest{component: componentMigration,
		run: &v1alpha1.JobRunStatus{Key: "k", Attempt: 1}, args: reportArgs(),
		env: tablesEnv(h.get("orders"))}, "m")
	applied, err := batchv1ac.ExtractJob(job, fieldOwner) // what the operator applied to the action's Job
	h.must(err)
	hardening := func(p *corev1ac.PodSpecApplyConfiguration) []any {
		c := p.Containers[0]
		return []any{p.SecurityContext, c.SecurityContext, p.AutomountServiceAccountToken, p.EnableServiceLinks, p.ImagePullSecrets,
			p.RestartPolicy, c.Env, c.Resources, c.TerminationMessagePath, c.TerminationMessagePolicy}
	}
	if want, got := hardening(migration.Spec.Template.Spec), hardening(applied.Spec.Template.Spec); !equality.Semantic.DeepEqual(want, got) {
		t.Fatalf("action pod differs from the migration pod:\n got %+v\nwant %+v", got, want)
	}
	if job.Spec.TTLSecondsAfterFinished == nil || *job.Spec.BackoffLimit != 0 || job.Spec.ActiveDeadlineSeconds == nil {
		t.Fatalf("Job spec = %+v, want a TTL, a deadline and no retries", job.Spec)
	}

	h.reconcileAction("consume-42") // the Job still runs
	h.expectAction("consume-42", v1alpha1.ActionPending, v1alpha1.RecordingReason)
	h.must(clustersim.CompleteJobWithMessage(h.ctx, k8s, job, actionReportJSON(t,
		ActionReport{Action: "Consume", Target: "message OrderPaid/order-42-paid", Recorded: true})))
	if res := h.reconcileAction("consume-42"); res.RequeueAfter == 0 {
		t.Fatalf("result %+v after a Job whose wait ended unexecuted, want to look again later", res)
	}
	h.expectAction("consume-42", v1alpha1.ActionRecorded, v1alpha1.RecordedReason, "Consume on message OrderPaid/order-42-paid recorded", job.Name)
	h.expectExecuted("consume-42", metav1.ConditionFalse, v1alpha1.AwaitingExecutionReason)

	// The next pass starts a Job that only awaits the execution.
	h.reconcileAction("consume-42")
	h.reconcileAction("consume-42")
	var await *batchv1.Job
	for _, j := range h.jobs("orders", componentAction) {
		if j.Name != job.Name {
			await = &j
		}
	}
	if await == nil {
		t.Fatal("no second Job awaiting the execution")
	}
	if args := await.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--await-only") || !slices.Contains(args, string(action.UID)) {
		t.Fatalf("second Job args %q, want --await-only with the request id", args)
	}
	h.must(clustersim.CompleteJobWithMessage(h.ctx, k8s, await, actionReportJSON(t, ActionReport{
		Action: "Consume", Target: "message OrderPaid/order-42-paid", Recorded: true,
		Executed: true, Outcome: OutcomeExecuted, Detail: "delivered; the message is PROCESSED (it was FAILED)"})))
	h.reconcileAction("consume-42")
	st = h.getAction("consume-42").Status
	if st.Phase != v1alpha1.ActionExecuted || !strings.Contains(st.Message, "delivered; the message is PROCESSED") {
		t.Fatalf("status = %+v, want Executed with what the consumer did", st)
	}
	h.expectExecuted("consume-42", metav1.ConditionTrue, v1alpha1.ExecutedReason)
	if notes := h.events("consume-42", v1alpha1.ExecutedReason); len(notes) == 0 {
		t.Error("no Executed Event about the action")
	}

	h.reconcileAction("consume-42") // final: nothing more happens, nothing is deleted
	if jobs := h.jobs("orders", componentAction); len(jobs) != 2 {
		t.Fatalf("action Jobs after the action was executed = %d, want the two Jobs, kept", len(jobs))
	}
}

func TestActionThatFailedWhenExecutedEndsFailedWithTheReason(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.consumeAction("consume-42", "orders")
	h.reconcileAction("consume-42")
	job := h.onlyJob("orders", componentAction)
	h.must(clustersim.CompleteJobWithMessage(h.ctx, k8s, job, actionReportJSON(t, ActionReport{
		Action: "Consume", Target: "message OrderPaid/order-42-paid", Recorded: true,
		Executed: true, Outcome: OutcomeFailed, Detail: "delivery failed: sink returned 500"})))
	h.reconcileAction("consume-42")
	st := h.getAction("consume-42").Status
	if st.Phase != v1alpha1.ActionFailed || !strings.Contains(st.Message, "sink returned 500") {
		t.Fatalf("status = %+v, want Failed with the consumer's reason", st)
	}
	h.expectExecuted("consume-42", metav1.ConditionFalse, v1alpha1.ExecutionFailedReason)
}

// expectExecuted asserts the action's Executed condition.
func (h *harness) expectExecuted(name string, status metav1.ConditionStatus, reason string) {
	h.t.Helper()
	c := meta.FindStatusCondition(h.getAction(name).Status.Conditions, v1alpha1.ConditionExecuted)
	if c == nil || c.Status != status || c.Reason != reason {
		h.t.Fatalf("action %s: Executed condition %+v, want %s/%s", name, c, status, reason)
	}
}

func TestInstanceActionRunsWithTheInstanceTarget(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.must(k8s.Create(h.ctx, &v1alpha1.SequentialInboxAction{
		ObjectMeta: metav1.ObjectMeta{Name: "close-41", Namespace: h.ns},
		Spec: v1alpha1.SequentialInboxActionSpec{InboxName: "orders", Action: v1alpha1.ActionClose,
			Instance: &v1alpha1.ActionInstanceTarget{Sequence: "order", ContextID: "41"}},
	}))

	h.reconcileAction("close-41")

	c := h.onlyJob("orders", componentAction).Spec.Template.Spec.Containers[0]
	wantArgs := []string{"action", "--output", "json", "--termination-message-path", "/dev/termination-log",
		"--action", "Close", "--request-id", string(h.getAction("close-41").UID), "--wait", actionWait.String(),
		"--sequence", "order", "--context-id", "41"}
	if !slices.Equal(c.Args, wantArgs) || c.Image != imageV1 {
		t.Fatalf("container = %s %q, want the default image %s with %q", c.Image, c.Args, imageV1, wantArgs)
	}
}

func TestActionOnAMissingTargetFailsWithTheReportedError(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.consumeAction("consume-42", "orders")
	h.reconcileAction("consume-42")
	job := h.onlyJob("orders", componentAction)

	// `seqinbox action` exits 1 and writes its report with the not-found error.
	h.failJob(job, actionReportJSON(t, ActionReport{Action: "Consume", Target: "message OrderPaid/order-42-paid",
		Error: "request CONSUME on OrderPaid/order-42-paid: message not found"}))
	h.reconcileAction("consume-42")

	h.expectAction("consume-42", v1alpha1.ActionFailed, v1alpha1.NotRecordedReason, "was not recorded", "message not found")
	if notes := h.events("consume-42", v1alpha1.NotRecordedReason); len(notes) == 0 {
		t.Error("no Warning Event about the failed action")
	}
	h.reconcileAction("consume-42") // Failed is final: no second Job
	if jobs := h.jobs("orders", componentAction); len(jobs) != 1 {
		t.Fatalf("%d action Jobs after the failure, want the one that failed", len(jobs))
	}
}

func TestActionJobFailingWithoutAReportFailsWithTheContainerMessage(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.consumeAction("consume-42", "orders")
	h.reconcileAction("consume-42")

	h.failJob(h.onlyJob("orders", componentAction), `seqinbox: unknown command "action"`)
	h.reconcileAction("consume-42")

	h.expectAction("consume-42", v1alpha1.ActionFailed, v1alpha1.NotRecordedReason, "BackoffLimitExceeded", `unknown command "action"`)
}

func TestActionWaitsForItsInbox(t *testing.T) {
	h := newHarness(t)
	h.consumeAction("consume-42", "orders")

	if res := h.reconcileAction("consume-42"); res.RequeueAfter != testPollInterval {
		t.Fatalf("result %+v, want a retry after the poll interval %s", res, testPollInterval)
	}
	h.expectAction("consume-42", v1alpha1.ActionPending, v1alpha1.InboxNotFoundReason, "SequentialInbox orders does not exist")
	if jobs := h.jobs("orders", componentAction); len(jobs) != 0 {
		t.Fatalf("%d action Jobs without an inbox, want none", len(jobs))
	}

	h.create("orders", nil)
	h.reconcileAction("consume-42")
	h.onlyJob("orders", componentAction)
	h.expectAction("consume-42", v1alpha1.ActionPending, v1alpha1.RecordingReason)
}

func TestActionWhoseJobVanishedBeforeItsResultFails(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.consumeAction("consume-42", "orders")
	h.reconcileAction("consume-42")
	job := h.onlyJob("orders", componentAction)

	h.must(k8s.Delete(h.ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	h.reconcileAction("consume-42")

	h.expectAction("consume-42", v1alpha1.ActionFailed, v1alpha1.JobLostReason, job.Name, "unknown")
	if jobs := h.jobs("orders", componentAction); len(jobs) > 1 || (len(jobs) == 1 && jobs[0].DeletionTimestamp.IsZero()) {
		t.Fatalf("action Jobs after the loss: %d, want no new Job (recording twice is a person's decision)", len(jobs))
	}
}

func TestInvalidActionsAreRejectedByTheAPIServer(t *testing.T) {
	h := newHarness(t)
	msg := &v1alpha1.ActionMessageTarget{Type: "OrderPaid", IdempotenceID: "order-42-paid"}
	inst := &v1alpha1.ActionInstanceTarget{Sequence: "order", ContextID: "42"}
	tests := []struct {
		name, want string
		spec       v1alpha1.SequentialInboxActionSpec
	}{
		{"consume without message", "spec.message (type and idempotenceId) is required for Consume and Expire",
			v1alpha1.SequentialInboxActionSpec{InboxName: "orders", Action: v1alpha1.ActionConsume}},
		{"expire of an instance", "spec.message (type and idempotenceId) is required",
			v1alpha1.SequentialInboxActionSpec{InboxName: "orders", Action: v1alpha1.ActionExpire, Instance: inst}},
		{"close of a message", "spec.instance (sequence and contextId) is required for ConsumeAll and Close",
			v1alpha1.SequentialInboxActionSpec{InboxName: "orders", Action: v1alpha1.ActionClose, Message: msg}},
		{"consume-all with both targets", "and only for them",
			v1alpha1.SequentialInboxActionSpec{InboxName: "orders", Action: v1alpha1.ActionConsumeAll, Message: msg, Instance: inst}},
		{"unknown action", "Unsupported value",
			v1alpha1.SequentialInboxActionSpec{InboxName: "orders", Action: "CONSUME", Message: msg}},
		{"no inbox", "spec.inboxName",
			v1alpha1.SequentialInboxActionSpec{Action: v1alpha1.ActionConsume, Message: msg}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			action := &v1alpha1.SequentialInboxAction{ObjectMeta: metav1.ObjectMeta{Name: "bad-" + string(rune('a'+i)), Namespace: h.ns}, Spec: tt.spec}
			err := k8s.Create(h.ctx, action)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("create error = %v, want Invalid mentioning %q", err, tt.want)
			}
		})
	}

	h.consumeAction("consume-42", "orders")
	action := h.getAction("consume-42")
	action.Spec.Message.IdempotenceID = "order-43-paid"
	err := k8s.Update(h.ctx, action)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec is immutable") {
		t.Fatalf("update error = %v, want Invalid: spec is immutable", err)
	}
	if got := h.getAction("consume-42").Spec.Message.IdempotenceID; got != "order-42-paid" {
		t.Fatalf("idempotenceId after the rejected update = %q, want order-42-paid", got)
	}
}

// TestActionJobNameFitsThePodLabel proves that the longest inbox name still gives a Job name
// within the 63 characters of the batch.kubernetes.io/job-name label.
func TestActionJobNameFitsThePodLabel(t *testing.T) {
	inbox := &v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("a", 40)}}
	action := &v1alpha1.SequentialInboxAction{ObjectMeta: metav1.ObjectMeta{UID: "0b5c5d1e-7d9f-4c1a-9c2b-3f4e5a6b7c8d"}}
	other := &v1alpha1.SequentialInboxAction{ObjectMeta: metav1.ObjectMeta{UID: "1b5c5d1e-7d9f-4c1a-9c2b-3f4e5a6b7c8d"}}

	name := actionJobName(inbox, action, 999)
	if len(name) > 63 || !strings.HasPrefix(name, inbox.Name+"-action-") {
		t.Fatalf("job name %q (%d characters), want <inbox>-action-... within 63", name, len(name))
	}
	if name == actionJobName(inbox, other, 999) {
		t.Fatal("two actions share a Job name")
	}
}
