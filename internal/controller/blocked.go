package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/migrations"
)

// Records held back by infrastructure errors (SPEC §7): every consumer writes the record it has
// retried longest into its registry row at each heartbeat. While the consumers run, the operator
// reads the registry every RegistryCheckInterval with a dry-run Job from the running image (the
// operator never talks SQL itself) and names every record retried for longer than
// BlockedThreshold in the Degraded condition (PartitionBlocked).

// checkRegistry runs the registry checks of running consumers and reports their blocked records.
// It never stops the pass: a check in progress or failed leaves the last successful check's
// verdict standing.
func (r *Reconciler) checkRegistry(ctx context.Context, s *scope) (phaseResult, error) {
	if desiredReplicas(s.deployment) == 0 || !s.running.known() || s.running.Image != s.image {
		return proceed, nil
	}
	st := &s.inbox.Status
	key := hashOf(s.image)
	if st.RegistryCheck == nil || st.RegistryCheck.Key != key {
		// Consumers that just started have nothing to report yet.
		st.RegistryCheck = &v1alpha1.JobRunStatus{Key: key, Attempt: 1, RetryAfter: &metav1.Time{Time: s.now.Add(r.RegistryCheckInterval)}}
	}
	run := st.RegistryCheck
	out, err := r.runJob(ctx, s, jobRequest{component: componentRegistryCheck, run: run, args: reportArgs("--dry-run")})
	if err != nil {
		return proceed, fmt.Errorf("registry check: %w", err)
	}
	report := out.report
	switch out.state {
	case jobSucceeded:
		if err := r.deleteSupersededJobs(ctx, s, componentRegistryCheck, run.JobName); err != nil {
			return proceed, err
		}
		startNextAttempt(run, &metav1.Time{Time: s.now.Add(r.RegistryCheckInterval)})
		s.recheckAfter(r.RegistryCheckInterval)
	case jobBackingOff:
		s.recheckAfter(out.retryIn)
		if report, err = r.previousCheck(ctx, s, run); err != nil {
			return proceed, err
		}
	case jobRunning:
		if report, err = r.previousCheck(ctx, s, run); err != nil {
			return proceed, err
		}
	}
	if report != nil {
		for _, c := range report.LiveConsumers {
			if b := c.Blocked; b != nil && s.now.Sub(b.Since) > r.BlockedThreshold {
				s.problem(v1alpha1.PartitionBlockedReason, blockedMessage(c.InstanceID, *b, s.now))
			}
		}
	}
	return proceed, nil
}

// blockedMessage names the consumer, the partition, the offset, how long and why.
func blockedMessage(instance string, b migrations.BlockedRecord, now time.Time) string {
	return fmt.Sprintf("Consumer %s has retried the record at offset %d of partition %s[%d] for %s (since %s): %s. "+
		"The records behind it on the partition wait, and its offset is not committed; see docs/troubleshooting.md.",
		instance, b.Offset, b.Topic, b.Partition, now.Sub(b.Since).Round(time.Second), b.Since.UTC().Format(time.RFC3339),
		strings.TrimSuffix(b.Error, "."))
}

// previousCheck returns the report of the last successful check of the run (the Job kept by
// deleteSupersededJobs), so that a check that runs or failed leaves its verdict standing; nil when
// there is none.
func (r *Reconciler) previousCheck(ctx context.Context, s *scope, run *v1alpha1.JobRunStatus) (*migrations.Report, error) {
	var jobs batchv1.JobList
	if err := r.Client.List(ctx, &jobs, client.InNamespace(s.inbox.Namespace),
		client.MatchingLabels(selectorLabels(s.inbox, componentRegistryCheck))); err != nil {
		return nil, fmt.Errorf("list registry checks: %w", err)
	}
	var last *batchv1.Job
	lastAttempt := 0
	for i := range jobs.Items {
		job := &jobs.Items[i]
		attempt, err := strconv.Atoi(job.Annotations[annotationAttempt])
		finished, failed, _ := jobFinished(job)
		if err != nil || !finished || failed || job.Annotations[annotationJobKey] != run.Key || !metav1.IsControlledBy(job, s.inbox) {
			continue
		}
		if attempt > lastAttempt {
			last, lastAttempt = job, attempt
		}
	}
	if last == nil {
		return nil, nil
	}
	report, err := r.readReport(ctx, s, last.Name)
	if err != nil {
		return nil, nil //nolint:nilerr // an unreadable old report is no report; the next check decides
	}
	return report, nil
}
