// Package clustersim plays, for tests and benchmarks against envtest, the parts of a cluster that
// envtest does not run but the operator waits for: the Job controller with the kubelet (a Job's
// pod terminates with the `seqinbox migrate` or `seqinbox action` report as its termination
// message, then the Job is Complete or Failed) and the Deployment controller (every replica becomes available).
package clustersim

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/seqinbox/seqinbox/migrations"
)

// jobNameLabel is the label the Job controller sets on a Job's pods.
const jobNameLabel = "batch.kubernetes.io/job-name"

// CompleteJob ends a Job successfully: its pod's only container exits 0 with the report as its
// termination message, then the Job gets the SuccessCriteriaMet and Complete conditions.
func CompleteJob(ctx context.Context, c client.Client, job *batchv1.Job, report migrations.Report) error {
	message, err := json.Marshal(report)
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	return CompleteJobWithMessage(ctx, c, job, string(message))
}

// CompleteJobWithMessage ends a Job successfully with message as its container's termination
// message, for Jobs that report something else than a migration (`seqinbox action`).
func CompleteJobWithMessage(ctx context.Context, c client.Client, job *batchv1.Job, message string) error {
	if err := terminatePod(ctx, c, job, corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: message}); err != nil {
		return err
	}
	now := metav1.Now()
	job.Status.StartTime, job.Status.CompletionTime, job.Status.Succeeded = &now, &now, 1
	job.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastTransitionTime: now},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: "CompletionsReached", LastTransitionTime: now},
	}
	if err := c.Status().Update(ctx, job); err != nil {
		return fmt.Errorf("complete job %s: %w", job.Name, err)
	}
	return nil
}

// FailJob ends a Job unsuccessfully: its pod's container exits 1 with message as its
// termination message, then the Job gets the FailureTarget and Failed conditions.
func FailJob(ctx context.Context, c client.Client, job *batchv1.Job, message string) error {
	if err := terminatePod(ctx, c, job, corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: message}); err != nil {
		return err
	}
	now := metav1.Now()
	job.Status.StartTime, job.Status.Failed = &now, 1
	const reason, why = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
	job.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: reason, Message: why, LastTransitionTime: now},
		{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: reason, Message: why, LastTransitionTime: now},
	}
	if err := c.Status().Update(ctx, job); err != nil {
		return fmt.Errorf("fail job %s: %w", job.Name, err)
	}
	return nil
}

// terminatePod creates the Job's pod with the Job controller's labels and sets its container's
// terminated state as the kubelet would.
func terminatePod(ctx context.Context, c client.Client, job *batchv1.Job, state corev1.ContainerStateTerminated) error {
	labels := map[string]string{jobNameLabel: job.Name, "job-name": job.Name}
	for k, v := range job.Spec.Template.Labels {
		labels[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-run", Namespace: job.Namespace, Labels: labels},
		Spec:       *job.Spec.Template.Spec.DeepCopy(),
	}
	err := c.Create(ctx, pod)
	if apierrors.IsAlreadyExists(err) { // an earlier try got this far
		err = c.Get(ctx, client.ObjectKeyFromObject(pod), pod)
	}
	if err != nil {
		return fmt.Errorf("create pod of job %s: %w", job.Name, err)
	}
	pod.Status.Phase = corev1.PodSucceeded
	if state.ExitCode != 0 {
		pod.Status.Phase = corev1.PodFailed
	}
	state.StartedAt, state.FinishedAt = metav1.Now(), metav1.Now()
	container := job.Spec.Template.Spec.Containers[0]
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container.Name, Image: container.Image,
		State: corev1.ContainerState{Terminated: &state}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("set status of pod of job %s: %w", job.Name, err)
	}
	return nil
}

// RollOut makes every replica of the Deployment's current template available.
func RollOut(ctx context.Context, c client.Client, d *appsv1.Deployment) error {
	replicas := ptr.Deref(d.Spec.Replicas, 1)
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: replicas, UpdatedReplicas: replicas,
		ReadyReplicas: replicas, AvailableReplicas: replicas}
	if err := c.Status().Update(ctx, d); err != nil {
		return fmt.Errorf("roll out deployment %s: %w", d.Name, err)
	}
	return nil
}

// workers is how many Jobs and Deployments each stand-in handles at once, like the real controllers.
const workers = 4

// retrySoon is how soon a stand-in tries again after losing a race with the operator.
const retrySoon = 100 * time.Millisecond

// Start registers the stand-in controllers with mgr: every unfinished Job completes with
// report(job), every Deployment is rolled out. They read through mgr's cache (no extra informers)
// and write with writer, which may hold more rights than the manager's own client.
func Start(mgr ctrl.Manager, writer client.Client, report func(*batchv1.Job) migrations.Report) error {
	return StartWithMessages(mgr, writer, func(job *batchv1.Job) string {
		b, err := json.Marshal(report(job))
		if err != nil {
			return fmt.Sprintf("encode report: %v", err)
		}
		return string(b)
	})
}

// StartWithMessages is Start for Jobs that report something else than a migration (`seqinbox
// action`): every unfinished Job completes with message(job) as its termination message.
func StartWithMessages(mgr ctrl.Manager, writer client.Client, message func(*batchv1.Job) string) error {
	reader := mgr.GetClient()
	jobs := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		var job batchv1.Job
		if err := reader.Get(ctx, req.NamespacedName, &job); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		if len(job.Status.Conditions) > 0 {
			return reconcile.Result{}, nil
		}
		return retryRaces(CompleteJobWithMessage(ctx, writer, &job, message(&job)))
	})
	deployments := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		var d appsv1.Deployment
		if err := reader.Get(ctx, req.NamespacedName, &d); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		replicas := ptr.Deref(d.Spec.Replicas, 1)
		if d.Status.ObservedGeneration == d.Generation && d.Status.AvailableReplicas == replicas && d.Status.Replicas == replicas {
			return reconcile.Result{}, nil
		}
		return retryRaces(RollOut(ctx, writer, &d))
	})
	if err := ctrl.NewControllerManagedBy(mgr).Named("clustersim-jobs").For(&batchv1.Job{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).Complete(jobs); err != nil {
		return fmt.Errorf("job stand-in: %w", err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("clustersim-deployments").For(&appsv1.Deployment{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).Complete(deployments); err != nil {
		return fmt.Errorf("deployment stand-in: %w", err)
	}
	return nil
}

// retryRaces turns a write that lost against a newer version into a quick retry from a fresher read.
func retryRaces(err error) (reconcile.Result, error) {
	if apierrors.IsConflict(err) {
		return reconcile.Result{RequeueAfter: retrySoon}, nil
	}
	return reconcile.Result{}, err
}
