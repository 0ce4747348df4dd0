package controller

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	batchv1ac "k8s.io/client-go/applyconfigurations/batch/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/migrations"
)

// The container of the probe and migration Jobs, and what it may use.
const (
	jobContainer = "seqinbox"
	// jobDeadline bounds one attempt (image pull, lock wait, migration).
	jobDeadline = 10 * time.Minute
	// jobTTL keeps a finished Job for a person to inspect; superseded Jobs go earlier.
	jobTTL = 24 * time.Hour
)

// jobState is where the current attempt of a Job run stands.
type jobState int

const (
	// jobRunning: the Job exists (or was just created) and has not finished.
	jobRunning jobState = iota
	// jobBackingOff: the last attempt failed; the next Job waits until RetryAfter.
	jobBackingOff
	// jobSucceeded: the Job completed and its report was read.
	jobSucceeded
)

// jobOutcome is what runJob found.
type jobOutcome struct {
	state jobState
	// job and report are set when the attempt succeeded; report also when it failed with a report.
	job    *batchv1.Job
	report *migrations.Report
	// retryIn is the wait before the next attempt (jobBackingOff).
	retryIn time.Duration
}

// jobRequest is one kind of Job run from the target image: `seqinbox <args>`.
type jobRequest struct {
	component string
	run       *v1alpha1.JobRunStatus
	// args start with the subcommand (migrate, action).
	args []string
	// annotations are recorded on the Job when it is created.
	annotations map[string]string
	// env is set in the container besides the database URL.
	env []*corev1ac.EnvVarApplyConfiguration
}

// currentRun returns the run tracked in *slot for key, starting again at attempt 1 when the key
// changed (new image, new generation).
func currentRun(slot **v1alpha1.JobRunStatus, key string) *v1alpha1.JobRunStatus {
	if *slot == nil || (*slot).Key != key {
		*slot = &v1alpha1.JobRunStatus{Key: key, Attempt: 1}
	}
	return *slot
}

// startNextAttempt moves a run to a new Job, created no earlier than notBefore (nil: at once).
func startNextAttempt(run *v1alpha1.JobRunStatus, notBefore *metav1.Time) {
	run.Attempt++
	run.Succeeded = false
	run.RetryAfter = notBefore
	run.JobName = ""
}

// runJob drives the current attempt of a run: it creates the attempt's Job when it is missing
// (after the backoff of a failed attempt), reads the report of a completed Job from its pod's
// termination message, and turns a failed Job into the next attempt with exponential backoff.
func (r *Reconciler) runJob(ctx context.Context, s *scope, req jobRequest) (jobOutcome, error) {
	run := req.run
	name := jobName(s.inbox, req.component, run.Key, run.Attempt)
	var job batchv1.Job
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.inbox.Namespace, Name: name}, &job)
	if apierrors.IsNotFound(err) {
		if run.RetryAfter != nil && s.now.Before(run.RetryAfter.Time) {
			return jobOutcome{state: jobBackingOff, retryIn: run.RetryAfter.Sub(s.now)}, nil
		}
		if err := r.createJob(ctx, s, req, name); err != nil {
			return jobOutcome{}, err
		}
		run.JobName, run.Succeeded = name, false
		return jobOutcome{state: jobRunning}, nil
	}
	if err != nil {
		return jobOutcome{}, fmt.Errorf("get job %s: %w", name, err)
	}
	if !metav1.IsControlledBy(&job, s.inbox) {
		return jobOutcome{}, fmt.Errorf("job %s exists but does not belong to SequentialInbox %s; delete it", name, s.inbox.Name)
	}
	run.JobName = name
	switch finished, failed, reason := jobFinished(&job); {
	case !finished:
		return jobOutcome{state: jobRunning}, nil
	case failed:
		message := fmt.Sprintf("Job %s failed (%s)", name, reason)
		if detail := r.containerMessage(ctx, s, name); detail != "" {
			message += ": " + detail
		}
		out := r.failAttempt(s, run, message)
		out.report = r.failureReport(ctx, s, name)
		return out, nil
	}
	report, err := r.readReport(ctx, s, name)
	if err != nil {
		return r.failAttempt(s, run, fmt.Sprintf("Job %s completed without a report: %v", name, err)), nil
	}
	run.Succeeded, run.Failures, run.RetryAfter = true, 0, nil
	return jobOutcome{state: jobSucceeded, job: &job, report: report}, nil
}

// failAttempt records a failed attempt and schedules the next one after the backoff.
func (r *Reconciler) failAttempt(s *scope, run *v1alpha1.JobRunStatus, message string) jobOutcome {
	run.Failures++
	run.LastFailure, run.LastFailureReason = truncate(message), ""
	pause := r.retryIn(run.Failures)
	r.event(s.inbox, corev1.EventTypeWarning, "JobFailed", "RunJob", "%s; attempt %d follows in %s", message, run.Attempt+1, pause)
	startNextAttempt(run, &metav1.Time{Time: s.now.Add(pause)})
	return jobOutcome{state: jobBackingOff, retryIn: pause}
}

// retryIn is the wait after the n-th consecutive failure of a Job: RetryBase doubled per failure,
// capped at RetryMax. The count lives in the status, so the backoff is stepped to it on each pass.
func (r *Reconciler) retryIn(failures int32) time.Duration {
	backoff := wait.Backoff{Duration: min(r.RetryBase, r.RetryMax), Factor: 2, Steps: math.MaxInt32, Cap: r.RetryMax}
	var pause time.Duration
	for range failures {
		pause = backoff.Step()
	}
	return pause
}

// jobFinished reads the Job's terminal condition.
func jobFinished(job *batchv1.Job) (finished, failed bool, reason string) {
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, false, c.Reason
		case batchv1.JobFailed:
			reason := c.Reason
			if c.Message != "" {
				reason += ": " + c.Message
			}
			return true, true, reason
		}
	}
	return false, false, ""
}

// jobPods lists the pods of a Job, found through the label the Job controller sets.
func (r *Reconciler) jobPods(ctx context.Context, s *scope, job string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(s.inbox.Namespace), client.MatchingLabels{jobNameLabel: job}); err != nil {
		return nil, fmt.Errorf("list pods of job %s: %w", job, err)
	}
	return pods.Items, nil
}

// readReport decodes the report that `seqinbox migrate` wrote to the termination message of the
// Job's successful container.
func (r *Reconciler) readReport(ctx context.Context, s *scope, job string) (*migrations.Report, error) {
	pods, err := r.jobPods(ctx, s, job)
	if err != nil {
		return nil, err
	}
	for _, pod := range pods {
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; cs.Name == jobContainer && t != nil && t.ExitCode == 0 {
				return parseReport(t.Message)
			}
		}
	}
	return nil, fmt.Errorf("no pod of job %s has a successful %s container", job, jobContainer)
}

// failureReport decodes the report that a failed `seqinbox migrate` left in its container's
// termination message; nil when there is none (the container never ran, or wrote its log tail).
func (r *Reconciler) failureReport(ctx context.Context, s *scope, job string) *migrations.Report {
	pods, err := r.jobPods(ctx, s, job)
	if err != nil {
		return nil
	}
	for _, pod := range pods {
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; cs.Name == jobContainer && t != nil && t.ExitCode != 0 {
				if report, err := parseReport(t.Message); err == nil {
					return report
				}
			}
		}
	}
	return nil
}

// containerMessage is what a failed Job's container said: its termination message (the log tail
// with FallbackToLogsOnError) or why it did not start (ImagePullBackOff, ...).
func (r *Reconciler) containerMessage(ctx context.Context, s *scope, job string) string {
	pods, err := r.jobPods(ctx, s, job)
	if err != nil {
		return ""
	}
	var parts []string
	for _, pod := range pods {
		for _, cs := range pod.Status.ContainerStatuses {
			switch {
			case cs.State.Terminated != nil:
				t := cs.State.Terminated
				parts = append(parts, fmt.Sprintf("exit code %d (%s) %s", t.ExitCode, t.Reason, failureDetail(t.Message)))
			case cs.State.Waiting != nil:
				parts = append(parts, fmt.Sprintf("%s: %s", cs.State.Waiting.Reason, cs.State.Waiting.Message))
			}
		}
	}
	return strings.Join(parts, "; ")
}

// createJob creates one attempt's Job, controlled by the inbox.
func (r *Reconciler) createJob(ctx context.Context, s *scope, req jobRequest, name string) error {
	owner, err := r.controllerRef(s.inbox)
	if err != nil {
		return err
	}
	// Without ForceOwnership: applied again (by a pass whose write the cache has not shown yet) the
	// Job does not change, and a Job of that name that someone else wrote conflicts, as a create would.
	if err := r.apply(ctx, buildJob(s.inbox, s.image, req, name).WithOwnerReferences(owner)); err != nil {
		return err
	}
	r.event(s.inbox, corev1.EventTypeNormal, "JobCreated", "RunJob", "Created Job %s: seqinbox %s (attempt %d) from %s",
		name, strings.Join(req.args, " "), req.run.Attempt, s.image)
	return nil
}

// buildJob renders the Job of one attempt: `seqinbox <args>` from the target image, one pod, no
// retries by the Job controller (the operator retries with a new Job and its own backoff).
func buildJob(inbox *v1alpha1.SequentialInbox, image string, req jobRequest, name string) *batchv1ac.JobApplyConfiguration {
	labels := objectLabels(inbox, req.component)
	annotations := map[string]string{annotationJobKey: req.run.Key, annotationAttempt: strconv.Itoa(int(req.run.Attempt))}
	for k, v := range req.annotations {
		annotations[k] = v
	}
	container := corev1ac.Container().
		WithName(jobContainer).
		WithImage(image).
		WithArgs(req.args...).
		WithEnv(append([]*corev1ac.EnvVarApplyConfiguration{databaseURLEnv(inbox)}, req.env...)...).
		WithTerminationMessagePath(corev1.TerminationMessagePathDefault).
		WithResources(resourceRequirements(jobResources()))
	return batchv1ac.Job(name, inbox.Namespace).
		WithLabels(labels).
		WithAnnotations(annotations).
		WithSpec(batchv1ac.JobSpec().
			WithBackoffLimit(0).
			WithActiveDeadlineSeconds(int64(jobDeadline.Seconds())).
			WithTTLSecondsAfterFinished(int32(jobTTL.Seconds())).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(labels).
				WithSpec(hardenedPod(inbox, container).WithRestartPolicy(corev1.RestartPolicyNever))))
}

// reportArgs runs `seqinbox migrate`, printing its JSON report into the termination message.
func reportArgs(extra ...string) []string {
	return append([]string{"migrate", "--output", "json", "--termination-message-path", corev1.TerminationMessagePathDefault}, extra...)
}

// deleteSupersededJobs removes the Jobs of a component other than keep: finished attempts and
// runs of an older image or generation. The current one stays for a person to inspect.
func (r *Reconciler) deleteSupersededJobs(ctx context.Context, s *scope, component, keep string) error {
	var jobs batchv1.JobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(s.inbox.Namespace),
		client.MatchingLabels(selectorLabels(s.inbox, component))); err != nil {
		return fmt.Errorf("list %s jobs: %w", component, err)
	}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		if job.Name == keep || !metav1.IsControlledBy(job, s.inbox) {
			continue
		}
		if finished, _, _ := jobFinished(job); !finished {
			continue
		}
		err := r.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete superseded job %s: %w", job.Name, err)
		}
	}
	return nil
}
