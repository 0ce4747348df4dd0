package controller

import (
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// engine is what a consumer image speaks: its release, its claim protocol and the group protocol
// its consumers announce to the broker (manifest.GroupProtocol; empty for Deployments of operators
// that did not record it).
type engine struct {
	Image, Version, ClaimProtocol, GroupProtocol string
}

// known reports whether the claim protocol was learned (from a probe or the Deployment).
func (e engine) known() bool { return e.ClaimProtocol != "" }

// note is a reason and a message for a person, the material of a condition.
type note struct {
	reason, message string
}

// scope is what one reconcile pass knows about one SequentialInbox; the phases read and fill it,
// and the status summary is computed from it at the end of the pass.
type scope struct {
	inbox *v1alpha1.SequentialInbox
	// now is the pass's time, from the injected clock.
	now time.Time
	// image is the target image: spec.image or the operator's default.
	image string
	// set is the compiled declaration (validate).
	set *sequence.Set
	// configMap and configHash name the rendered engine configuration (renderConfig).
	configMap, configHash string
	// deployment is the consumer Deployment (nil when absent), consumerPods its pods, running
	// what its pod template runs; all observed at the start of the pass.
	deployment   *appsv1.Deployment
	consumerPods []corev1.Pod
	running      engine
	// target is what the target image speaks (probeTarget).
	target engine
	// replicas is what the consumer Deployment asks for: spec.replicas, capped (planReplicas).
	replicas int32
	// recheck, when set, brings a pass that reached its end back after it (for what no watch
	// reports, such as a topic's partition count).
	recheck time.Duration
	// waiting says why the pass stopped before the end (Progressing, Ready).
	waiting *note
	// problems need a person's attention although the inbox may run (Degraded).
	problems []note
	// finalized is set once the deletion removed the finalizer: the inbox may be gone, and the
	// pass writes no status.
	finalized bool
}

// wait records why the pass stops here.
func (s *scope) wait(reason, message string) {
	s.waiting = &note{reason: reason, message: message}
}

// recheckAfter brings a pass that reaches its end back after d at the latest.
func (s *scope) recheckAfter(d time.Duration) {
	if d > 0 && (s.recheck == 0 || d < s.recheck) {
		s.recheck = d
	}
}

// problem records something for the Degraded condition.
func (s *scope) problem(reason, message string) {
	s.problems = append(s.problems, note{reason: reason, message: message})
}

// setCondition stores a condition stamped with the generation it was computed for; the
// transition time changes only when the status does.
func (s *scope) setCondition(c metav1.Condition) {
	c.ObservedGeneration = s.inbox.Generation
	c.LastTransitionTime = metav1.NewTime(s.now)
	meta.SetStatusCondition(&s.inbox.Status.Conditions, c)
}

// consumersStopped reports whether no consumer of the inbox can run: no Deployment or one
// scaled to zero, and no pod left.
func (s *scope) consumersStopped() bool {
	return desiredReplicas(s.deployment) == 0 && len(s.consumerPods) == 0
}

// desiredReplicas is the Deployment's replicas, zero when there is none.
func desiredReplicas(d *appsv1.Deployment) int32 {
	switch {
	case d == nil:
		return 0
	case d.Spec.Replicas == nil:
		return 1 // the API default
	default:
		return *d.Spec.Replicas
	}
}

// runningEngine reads what the Deployment's pod template runs from the operator's annotations.
func runningEngine(d *appsv1.Deployment) engine {
	if d == nil {
		return engine{}
	}
	e := engine{
		Version:       d.Spec.Template.Annotations[annotationEngineVersion],
		ClaimProtocol: d.Spec.Template.Annotations[annotationClaimProtocol],
		GroupProtocol: d.Spec.Template.Annotations[annotationGroupProtocol],
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == consumerContainer {
			e.Image = c.Image
		}
	}
	return e
}

// phaseResult says how the pass goes on after a phase: on to the next phase, or stop and come
// back after requeueAfter (zero: when a watched object changes).
type phaseResult struct {
	stop         bool
	requeueAfter time.Duration
}

// proceed lets the pass go on to the next phase.
var proceed = phaseResult{}

// waitForEvent stops the pass until a watched object (the inbox, a Job, a pod) changes.
func waitForEvent() phaseResult { return phaseResult{stop: true} }

// requeueAfter stops the pass and comes back after d (for what no watch reports: Kafka, time).
func requeueAfter(d time.Duration) phaseResult { return phaseResult{stop: true, requeueAfter: d} }
