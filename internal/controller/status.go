package controller

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// Condition reasons are API and live in api/v1alpha1 (…Reason); messages are for people.

func condition(typ string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message}
}

// configValidCondition lists every validation error with its field path.
func configValidCondition(errs field.ErrorList) metav1.Condition {
	if len(errs) == 0 {
		return condition(v1alpha1.ConditionConfigValid, metav1.ConditionTrue, v1alpha1.ValidReason,
			"The sequences, the connection budget and the poll interval were checked.")
	}
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = e.Error()
	}
	return condition(v1alpha1.ConditionConfigValid, metav1.ConditionFalse, v1alpha1.InvalidSpecReason,
		truncate("The spec is invalid; the running consumers are left as they are: "+strings.Join(lines, "; ")))
}

// schemaReadyCondition says where the schema migration stands.
func schemaReadyCondition(status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return condition(v1alpha1.ConditionSchemaReady, status, reason, message)
}

// rolloutBlockedCondition is the verdict of the rollout gate.
func rolloutBlockedCondition(reason, message string, blocked bool) metav1.Condition {
	status := metav1.ConditionFalse
	if blocked {
		status = metav1.ConditionTrue
	}
	return condition(v1alpha1.ConditionRolloutBlocked, status, reason, message)
}

// consumerStateServedCondition says whether the consumers of the engine version serve their
// state to the operator.
func consumerStateServedCondition(engineVersion string, served bool) metav1.Condition {
	if served {
		return condition(v1alpha1.ConditionConsumerStateServed, metav1.ConditionTrue, v1alpha1.StateServedReason,
			fmt.Sprintf("The consumers (engine %s) serve their state; the operator reads it into status.consumers.", engineVersion))
	}
	return condition(v1alpha1.ConditionConsumerStateServed, metav1.ConditionFalse, v1alpha1.EnginePredatesStateReason,
		fmt.Sprintf("The consumers run engine %s, which predates the consumer state (served from %s on): they run without it, "+
			"so status.consumers, the Lag and Waiting columns and Degraded PartitionBlocked stay empty until spec.image runs %s or later.",
			engineVersion, stateServedSince, stateServedSince))
}

// readyCondition summarises: True only when the configuration is valid, the schema is migrated,
// no rollout is blocked, the pass reached its end and the consumer Deployment is available.
func readyCondition(s *scope) metav1.Condition {
	not := func(reason, message string) metav1.Condition {
		return condition(v1alpha1.ConditionReady, metav1.ConditionFalse, reason, message)
	}
	conds := s.inbox.Status.Conditions
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionConfigValid); c == nil || c.Status != metav1.ConditionTrue {
		return not(v1alpha1.InvalidSpecReason, "The spec is invalid; see the ConfigValid condition.")
	}
	if s.waiting != nil {
		return not(s.waiting.reason, s.waiting.message)
	}
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionSchemaReady); c == nil || c.Status != metav1.ConditionTrue {
		return not(v1alpha1.MigrationPendingReason, "The schema is not migrated yet; see the SchemaReady condition.")
	}
	if meta.IsStatusConditionTrue(conds, v1alpha1.ConditionRolloutBlocked) {
		c := meta.FindStatusCondition(conds, v1alpha1.ConditionRolloutBlocked)
		return not(c.Reason, c.Message)
	}
	if ok, msg := deploymentAvailable(s.deployment); !ok {
		return not(v1alpha1.ConsumersUnavailableReason, msg)
	}
	return condition(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason,
		fmt.Sprintf("%d of %d consumers are ready, engine %s (claim protocol %s).",
			s.deployment.Status.ReadyReplicas, desiredReplicas(s.deployment), s.running.Version, s.running.ClaimProtocol))
}

// progressingCondition is True while the operator waits for something on the way to the spec.
func progressingCondition(s *scope) metav1.Condition {
	if !meta.IsStatusConditionTrue(s.inbox.Status.Conditions, v1alpha1.ConditionConfigValid) {
		return condition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.InvalidSpecReason,
			"Nothing changes until the spec is fixed.")
	}
	if s.waiting != nil {
		return condition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, s.waiting.reason, s.waiting.message)
	}
	if ok, msg := deploymentAvailable(s.deployment); !ok {
		return condition(v1alpha1.ConditionProgressing, metav1.ConditionTrue, v1alpha1.RollingOutReason, msg)
	}
	return condition(v1alpha1.ConditionProgressing, metav1.ConditionFalse, v1alpha1.ReconciledReason,
		"The consumers run the spec's generation.")
}

// degradedCondition is True when something needs attention: a failing Job, a poll interval that
// cannot cover the worst case, a Deployment that cannot make progress.
func degradedCondition(s *scope) metav1.Condition {
	problems := s.problems
	if d := s.deployment; d != nil {
		for _, c := range d.Status.Conditions {
			stuck := c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue ||
				c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse
			if stuck {
				problems = append(problems, note{v1alpha1.DeploymentFailingReason, fmt.Sprintf("Deployment %s: %s: %s", d.Name, c.Reason, c.Message)})
			}
		}
	}
	if len(problems) == 0 {
		return condition(v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason, "Nothing needs attention.")
	}
	messages := make([]string, len(problems))
	for i, p := range problems {
		messages[i] = p.message
	}
	return condition(v1alpha1.ConditionDegraded, metav1.ConditionTrue, problems[0].reason, truncate(strings.Join(messages, " ")))
}

// deploymentAvailable reports whether the Deployment runs its current template on all replicas.
func deploymentAvailable(d *appsv1.Deployment) (bool, string) {
	if d == nil {
		return false, "The consumer Deployment does not exist yet."
	}
	want := desiredReplicas(d)
	switch {
	case d.Status.ObservedGeneration < d.Generation:
		return false, fmt.Sprintf("Deployment %s: generation %d is not observed yet.", d.Name, d.Generation)
	case d.Status.UpdatedReplicas < want:
		return false, fmt.Sprintf("Deployment %s: %d of %d consumers run the current template.", d.Name, d.Status.UpdatedReplicas, want)
	case d.Status.AvailableReplicas < want:
		return false, fmt.Sprintf("Deployment %s: %d of %d consumers are available.", d.Name, d.Status.AvailableReplicas, want)
	case d.Status.Replicas > want:
		return false, fmt.Sprintf("Deployment %s: %d old consumers are still terminating.", d.Name, d.Status.Replicas-want)
	}
	return true, ""
}

// summarize sets the conditions that depend on the whole pass, and the replica counts.
func summarize(s *scope) {
	s.setCondition(progressingCondition(s))
	s.setCondition(degradedCondition(s))
	s.setCondition(readyCondition(s))
	st := &s.inbox.Status
	st.Replicas = desiredReplicas(s.deployment)
	st.Selector = consumerSelector(s.inbox)
	st.ReplicasReady = 0
	if s.deployment != nil {
		st.ReplicasReady = s.deployment.Status.ReadyReplicas
	}
	st.RunningEngineVersion = s.running.Version
	st.RunningClaimProtocol = s.running.ClaimProtocol
}

// maxMessage keeps condition messages well below the API's 32 KiB limit.
const maxMessage = 2048

func truncate(msg string) string {
	if len(msg) <= maxMessage {
		return msg
	}
	return msg[:maxMessage-3] + "..."
}
