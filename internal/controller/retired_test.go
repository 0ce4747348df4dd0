package controller

import (
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// olderOperatorCheckJob is a registry-check Job as operators before the consumer state left it:
// <inbox>-check-<key>-<attempt>, component check, controlled by the inbox unless owned is false.
func (h *harness) olderOperatorCheckJob(inbox *v1alpha1.SequentialInbox, attempt string, owned bool) *batchv1.Job {
	h.t.Helper()
	labels := objectLabels(inbox, "check")
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: inbox.Name + "-check-0a1b2c3d-" + attempt, Namespace: h.ns, Labels: labels,
			Annotations: map[string]string{annotationJobKey: "0a1b2c3d", annotationAttempt: attempt}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To(int32(0)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
					Name: jobContainer, Image: imageV1, Args: reportArgs("--dry-run")}}},
			},
		},
	}
	if owned {
		job.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(inbox, v1alpha1.GroupVersion.WithKind("SequentialInbox"))}
	}
	h.must(k8s.Create(h.ctx, job))
	return job
}

func TestRegistryCheckJobsOfAnOlderOperatorAreDeletedAtTheFirstPassAndNoOtherJob(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	inbox := h.get("orders")
	before := jobNames(h.allJobs())

	// What an older operator left: the last check it kept (finished) and one that ran when it
	// was replaced; and a Job with the same labels that the inbox does not control.
	kept := h.olderOperatorCheckJob(inbox, "41", true)
	h.completeJob(kept)
	running := h.olderOperatorCheckJob(inbox, "42", true)
	foreign := h.olderOperatorCheckJob(inbox, "7", false)

	// The upgraded operator: a new process, whose first pass of the inbox deletes them.
	h.r = NewReconciler(k8s, k8s, recorder, h.r.Options)
	h.reconcile("orders")
	after := jobNames(h.allJobs())
	for _, gone := range []string{kept.Name, running.Name} {
		if slices.Contains(after, gone) {
			t.Errorf("the registry check %s of an older operator is still there: %v", gone, after)
		}
	}
	if !slices.Contains(after, foreign.Name) {
		t.Errorf("%s, which the inbox does not control, was deleted: %v", foreign.Name, after)
	}
	for _, name := range before {
		if !slices.Contains(after, name) {
			t.Errorf("the bring-up's Job %s was deleted: %v", name, after)
		}
	}
	if len(after) != len(before)+1 {
		t.Errorf("Jobs %v after the pass, want the bring-up's %v and %s", after, before, foreign.Name)
	}
	if notes := h.events("orders", "RetiredJobsDeleted"); len(notes) != 1 || !strings.Contains(notes[0], kept.Name) || !strings.Contains(notes[0], running.Name) {
		t.Errorf("RetiredJobsDeleted events %q, want one naming %s and %s", notes, kept.Name, running.Name)
	}
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason)

	// Once per inbox and process: this operator never creates them, so later passes do not look.
	late := h.olderOperatorCheckJob(inbox, "43", true)
	h.reconcile("orders")
	if !slices.Contains(jobNames(h.allJobs()), late.Name) {
		t.Errorf("a later pass listed and deleted check Jobs again; want one look per inbox and operator process")
	}
}
