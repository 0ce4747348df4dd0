package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Jobs that older operators ran and this one never runs again. Operators before the consumers
// served their state read the consumer registry with a dry-run Job every two minutes per running
// inbox: <inbox>-check-<key>-<attempt>, labelled app.kubernetes.io/component=check and controlled
// by the inbox. The last of them stayed (deleteSupersededJobs kept it for a person to inspect)
// until its TTL of a day ran out or the inbox went, and one that ran when the operator was
// upgraded kept running. The first pass of each inbox deletes them.

// retiredComponents are the components of Jobs that no current phase runs.
var retiredComponents = []string{"check"}

// retiredJobs records the inboxes whose retired Jobs this operator process removed, so that each
// inbox is looked at once per process: this operator creates none again.
type retiredJobs struct {
	mu   sync.Mutex
	done map[types.NamespacedName]bool
}

func (d *retiredJobs) removed(key types.NamespacedName) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done[key]
}

func (d *retiredJobs) markRemoved(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done == nil {
		d.done = map[types.NamespacedName]bool{}
	}
	d.done[key] = true
}

func (d *retiredJobs) forget(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.done, key)
}

// removeRetiredJobs deletes the inbox's Jobs of retired components, finished or not, with their
// pods, once per inbox and operator process; the list is one read of the cache by label. Jobs
// that the inbox does not control stay. It never stops the pass.
func (r *Reconciler) removeRetiredJobs(ctx context.Context, s *scope) (phaseResult, error) {
	key := client.ObjectKeyFromObject(s.inbox)
	if r.retired.removed(key) {
		return proceed, nil
	}
	var deleted []string
	for _, component := range retiredComponents {
		var jobs batchv1.JobList
		if err := r.Client.List(ctx, &jobs, client.InNamespace(s.inbox.Namespace),
			client.MatchingLabels(selectorLabels(s.inbox, component))); err != nil {
			return proceed, fmt.Errorf("list retired %s jobs: %w", component, err)
		}
		for i := range jobs.Items {
			job := &jobs.Items[i]
			if !metav1.IsControlledBy(job, s.inbox) {
				continue
			}
			err := r.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
			if err != nil && !apierrors.IsNotFound(err) {
				return proceed, fmt.Errorf("delete retired job %s: %w", job.Name, err)
			}
			deleted = append(deleted, job.Name)
		}
	}
	if len(deleted) > 0 {
		r.event(s.inbox, corev1.EventTypeNormal, "RetiredJobsDeleted", "Delete",
			"Deleted Jobs of an older operator that this one no longer runs: %s", strings.Join(deleted, ", "))
	}
	r.retired.markRemoved(key)
	return proceed, nil
}
