package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// +kubebuilder:rbac:groups=inbox.seqinbox.dev,resources=sequentialinboxactions,verbs=get;list;watch
// +kubebuilder:rbac:groups=inbox.seqinbox.dev,resources=sequentialinboxactions/status,verbs=get;patch
// +kubebuilder:rbac:groups=inbox.seqinbox.dev,resources=sequentialinboxactions/finalizers,verbs=update

// actionWait is how long one action Job awaits the consumers' execution after recording; when
// no consumer ran the action in that time the action stays Recorded and the next Job awaits it.
const actionWait = 2 * time.Minute

// ActionReconciler records the operator actions requested as SequentialInboxAction resources
// (docs/design.md#operator-actions) in their inbox's database. Like the schema migration it never
// talks SQL: it runs `seqinbox action` as a Job from the inbox's image, with the inbox's database
// Secret and the same Job builder, and reads the result from the Job's termination message. An
// action is recorded once; the Job then awaits its execution by a consumer. Executed and Failed are
// final, and nothing is deleted.
type ActionReconciler struct {
	// jobs is the SequentialInbox reconciler, whose clients, options and Job helpers are shared.
	jobs *Reconciler
}

// NewActionReconciler builds an ActionReconciler on the clients and options of r.
func NewActionReconciler(r *Reconciler) *ActionReconciler {
	return &ActionReconciler{jobs: r}
}

// SetupWithManager watches the actions (creation; the spec is immutable) and the Jobs they own.
func (a *ActionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("sequentialinboxaction").
		For(&v1alpha1.SequentialInboxAction{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&batchv1.Job{}).
		Complete(a)
}

// Reconcile drives one action until it is Executed or Failed, and writes its status when it changed.
func (a *ActionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	action := &v1alpha1.SequentialInboxAction{}
	if err := a.jobs.Client.Get(ctx, req.NamespacedName, action); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if final(action.Status.Phase) {
		return ctrl.Result{}, nil
	}
	before := action.DeepCopy()
	result, err := a.record(ctx, action)
	if equality.Semantic.DeepEqual(before.Status, action.Status) {
		return result, err
	}
	if perr := a.jobs.Client.Status().Patch(ctx, action, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); perr != nil {
		return ctrl.Result{}, errors.Join(err, fmt.Errorf("patch status: %w", perr))
	}
	return result, err
}

func final(p v1alpha1.ActionPhase) bool {
	return p == v1alpha1.ActionExecuted || p == v1alpha1.ActionFailed
}

// record looks up the inbox, runs the action's Job and reads its result into the status.
func (a *ActionReconciler) record(ctx context.Context, action *v1alpha1.SequentialInboxAction) (ctrl.Result, error) {
	r := a.jobs
	var inbox v1alpha1.SequentialInbox
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: action.Namespace, Name: action.Spec.InboxName}, &inbox)
	if apierrors.IsNotFound(err) {
		a.setStatus(action, v1alpha1.ActionPending, metav1.ConditionFalse, v1alpha1.InboxNotFoundReason, fmt.Sprintf(
			"SequentialInbox %s does not exist; the action is recorded once it does.", action.Spec.InboxName))
		return ctrl.Result{RequeueAfter: r.PollInterval}, nil
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("get SequentialInbox %s: %w", action.Spec.InboxName, err)
	}
	s := &scope{inbox: &inbox, now: r.Clock.Now(), image: inbox.Spec.Image}
	if s.image == "" {
		s.image = r.DefaultImage
	}
	attempt := max(action.Status.Attempt, 1)
	name := actionJobName(&inbox, action, attempt)
	job, err := a.currentJob(ctx, action, name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if job == nil {
		if action.Status.JobName == name {
			a.setStatus(action, v1alpha1.ActionFailed, metav1.ConditionFalse, v1alpha1.JobLostReason, fmt.Sprintf(
				"Job %s is gone before its result was read; whether the action was recorded is unknown. "+
					"Create a new SequentialInboxAction to request it again.", name))
			return ctrl.Result{}, nil
		}
		if err := a.createJob(ctx, s, action, name, attempt); err != nil {
			return ctrl.Result{}, err
		}
		action.Status.JobName, action.Status.Attempt = name, attempt
		if attempt == 1 {
			a.setStatus(action, v1alpha1.ActionPending, metav1.ConditionFalse, v1alpha1.RecordingReason,
				fmt.Sprintf("Job %s records the action with %s.", name, s.image))
		}
		return ctrl.Result{}, nil
	}
	action.Status.JobName = name
	finished, failed, reason := jobFinished(job)
	if !finished {
		if attempt == 1 {
			a.setStatus(action, v1alpha1.ActionPending, metav1.ConditionFalse, v1alpha1.RecordingReason,
				fmt.Sprintf("Job %s records the action with %s.", name, s.image))
		}
		return ctrl.Result{}, nil
	}
	report, reportErr := a.readActionReport(ctx, s, name)
	switch {
	case reportErr == nil && report.Executed && !failed:
		a.setExecuted(action, report, name)
	case reportErr == nil && report.Recorded && !failed && action.Status.Phase == v1alpha1.ActionRecorded:
		// This Job's wait ended before a consumer ran the action (seen at the last pass): the next
		// Job awaits it.
		action.Status.Attempt = attempt + 1
		return ctrl.Result{RequeueAfter: time.Second}, nil
	case reportErr == nil && report.Recorded && !failed:
		a.setStatus(action, v1alpha1.ActionRecorded, metav1.ConditionTrue, v1alpha1.RecordedReason, fmt.Sprintf(
			"%s on %s recorded by Job %s; no consumer executed it within %s (are the consumers running?); the operator looks again.",
			report.Action, report.Target, name, actionWait))
		a.setExecutedCondition(action, metav1.ConditionFalse, v1alpha1.AwaitingExecutionReason, "Waiting for a consumer to run the action.")
		return ctrl.Result{RequeueAfter: r.PollInterval}, nil
	case reportErr == nil && report.Error != "":
		a.setStatus(action, v1alpha1.ActionFailed, metav1.ConditionFalse, v1alpha1.NotRecordedReason, fmt.Sprintf(
			"%s on %s was not recorded: %s", report.Action, report.Target, report.Error))
	case failed:
		message := fmt.Sprintf("Job %s failed (%s)", name, reason)
		if detail := r.containerMessage(ctx, s, name); detail != "" {
			message += ": " + detail
		}
		a.setStatus(action, v1alpha1.ActionFailed, metav1.ConditionFalse, v1alpha1.NotRecordedReason, message)
	default:
		a.setStatus(action, v1alpha1.ActionFailed, metav1.ConditionFalse, v1alpha1.NotRecordedReason,
			fmt.Sprintf("Job %s completed without a report: %v", name, reportErr))
	}
	return ctrl.Result{}, nil
}

// currentJob returns the action's Job, nil when it does not exist. A Job the cache does not show
// although the status names it is read from the API server: it may just have been created.
func (a *ActionReconciler) currentJob(ctx context.Context, action *v1alpha1.SequentialInboxAction, name string) (*batchv1.Job, error) {
	key := client.ObjectKey{Namespace: action.Namespace, Name: name}
	var job batchv1.Job
	err := a.jobs.Client.Get(ctx, key, &job)
	if apierrors.IsNotFound(err) && action.Status.JobName == name {
		err = a.jobs.APIReader.Get(ctx, key, &job)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get job %s: %w", name, err)
	}
	if !metav1.IsControlledBy(&job, action) {
		return nil, fmt.Errorf("job %s exists but does not belong to SequentialInboxAction %s; delete it", name, action.Name)
	}
	return &job, nil
}

// createJob creates the Job that runs `seqinbox action` from the inbox's image, controlled by the
// action: the first records the action and awaits its execution, later ones only await it.
func (a *ActionReconciler) createJob(ctx context.Context, s *scope, action *v1alpha1.SequentialInboxAction, name string, attempt int32) error {
	req := jobRequest{
		component: componentAction,
		run:       &v1alpha1.JobRunStatus{Key: actionKey(action), Attempt: attempt},
		args:      actionArgs(action, attempt),
		env:       tablesEnv(s.inbox),
	}
	owner, err := a.jobs.controllerRef(action)
	if err != nil {
		return err
	}
	// Without ForceOwnership, as the inbox's Jobs: applied again by a pass whose status write was
	// lost, the Job does not change.
	if err := a.jobs.apply(ctx, buildJob(s.inbox, s.image, req, name).WithOwnerReferences(owner)); err != nil {
		return err
	}
	a.jobs.event(action, corev1.EventTypeNormal, "JobCreated", "RecordAction", "Created Job %s: seqinbox %s from %s",
		name, strings.Join(req.args, " "), s.image)
	return nil
}

// actionArgs are the arguments of `seqinbox action` for the action's attempt; the CRD's rules
// guarantee that the action has its own target. The request id is the action's UID.
func actionArgs(action *v1alpha1.SequentialInboxAction, attempt int32) []string {
	spec := action.Spec
	args := []string{"action", "--output", "json", "--termination-message-path", corev1.TerminationMessagePathDefault,
		"--action", string(spec.Action), "--request-id", string(action.UID), "--wait", actionWait.String()}
	if attempt > 1 {
		args = append(args, "--await-only")
	}
	if m := spec.Message; m != nil {
		args = append(args, "--type", m.Type, "--idempotence-id", m.IdempotenceID)
	}
	if i := spec.Instance; i != nil {
		args = append(args, "--sequence", i.Sequence, "--context-id", i.ContextID)
	}
	return args
}

// actionKey identifies one request: the action's UID, so that a recreated action is a new Job.
func actionKey(action *v1alpha1.SequentialInboxAction) string {
	return hashOf(string(action.UID))
}

// actionJobName names the one Job of an action after its inbox (at most 40 characters) and its
// key, within the 63 characters of the Job's pod label.
func actionJobName(inbox *v1alpha1.SequentialInbox, action *v1alpha1.SequentialInboxAction, attempt int32) string {
	return jobName(inbox, componentAction, actionKey(action), attempt)
}

// readActionReport decodes the report that `seqinbox action` wrote to the termination message
// of the Job's container, whether it exited 0 (recorded) or 1 (not recorded).
func (a *ActionReconciler) readActionReport(ctx context.Context, s *scope, job string) (*ActionReport, error) {
	pods, err := a.jobs.jobPods(ctx, s, job)
	if err != nil {
		return nil, err
	}
	for _, pod := range pods {
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; cs.Name == jobContainer && t != nil {
				return parseActionReport(t.Message)
			}
		}
	}
	return nil, fmt.Errorf("no pod of job %s has a terminated %s container", job, jobContainer)
}

// setStatus sets the phase, the message and the Recorded condition; the transition time changes
// only when the condition's status does. A final phase is reported as an Event.
func (a *ActionReconciler) setStatus(action *v1alpha1.SequentialInboxAction, phase v1alpha1.ActionPhase,
	status metav1.ConditionStatus, reason, message string) {
	message = truncate(message)
	st := &action.Status
	if final(phase) && st.Phase != phase {
		eventType := corev1.EventTypeNormal
		if phase == v1alpha1.ActionFailed {
			eventType = corev1.EventTypeWarning
		}
		a.jobs.event(action, eventType, reason, "RecordAction", "%s", message)
	}
	st.Phase, st.Message = phase, message
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionRecorded, Status: status, Reason: reason,
		Message: message, ObservedGeneration: action.Generation, LastTransitionTime: metav1.NewTime(a.jobs.Clock.Now())})
}

// setExecuted reports what a consumer did with the action: Executed, or Failed with the reason
// (the action could not do its work, or another request replaced it). A final phase is
// reported as an Event.
func (a *ActionReconciler) setExecuted(action *v1alpha1.SequentialInboxAction, report *ActionReport, job string) {
	message := truncate(fmt.Sprintf("%s on %s: %s (reported by Job %s).", report.Action, report.Target, report.Detail, job))
	phase, status, reason, eventType := v1alpha1.ActionFailed, metav1.ConditionFalse, v1alpha1.ExecutionFailedReason, corev1.EventTypeWarning
	switch report.Outcome {
	case OutcomeExecuted:
		phase, status, reason, eventType = v1alpha1.ActionExecuted, metav1.ConditionTrue, v1alpha1.ExecutedReason, corev1.EventTypeNormal
	case OutcomeSuperseded:
		reason = v1alpha1.SupersededReason
	}
	st := &action.Status
	if st.Phase != phase {
		a.jobs.event(action, eventType, reason, "ExecuteAction", "%s", message)
	}
	st.Phase, st.Message = phase, message
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionRecorded, Status: metav1.ConditionTrue,
		Reason: v1alpha1.RecordedReason, Message: fmt.Sprintf("%s on %s recorded.", report.Action, report.Target),
		ObservedGeneration: action.Generation, LastTransitionTime: metav1.NewTime(a.jobs.Clock.Now())})
	a.setExecutedCondition(action, status, reason, message)
}

// setExecutedCondition sets the Executed condition; the transition time changes only when its
// status does.
func (a *ActionReconciler) setExecutedCondition(action *v1alpha1.SequentialInboxAction, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&action.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionExecuted, Status: status, Reason: reason,
		Message: truncate(message), ObservedGeneration: action.Generation, LastTransitionTime: metav1.NewTime(a.jobs.Clock.Now())})
}
