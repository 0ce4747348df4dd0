package controller

import (
	"context"
	"fmt"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// watchGroup names the members that keep the consumers out of the Kafka consumer group. The
// consumers announce only their group protocol (docs/design.md#broker-group-protocol), so while
// members of another one hold the group — the team's previous application, a consumer of another
// claim protocol started by hand — the broker refuses them and they wait, not ready. Only a person
// can stop those members; the Degraded condition says which. The group is read only while consumers
// that should run are not all available, and again after PollInterval until they are.
func (r *Reconciler) watchGroup(ctx context.Context, s *scope) (phaseResult, error) {
	if desiredReplicas(s.deployment) == 0 || !s.target.known() {
		return proceed, nil
	}
	if ok, _ := deploymentAvailable(s.deployment); ok {
		return proceed, nil
	}
	view := r.observeGroup(ctx, s)
	if view.err != nil {
		// The consumers report an unreachable broker themselves; the Deployment's state stands.
		logf.FromContext(ctx).V(1).Info("cannot read the consumer group", "error", view.err.Error())
		return proceed, nil
	}
	foreign := otherProtocolMembers(s.target.GroupProtocol, view.members)
	if len(foreign) == 0 {
		return proceed, nil
	}
	s.problem(v1alpha1.ConsumerGroupHeldByOtherProtocolReason, fmt.Sprintf(
		"The Kafka consumer group %s is held by %d member(s) of another group protocol than this inbox's %s: %s. "+
			"The broker refuses the consumers until these leave; stop the application they belong to.",
		s.inbox.Spec.Kafka.ConsumerGroup, len(foreign), s.target.GroupProtocol, describeMembers(foreign)))
	s.recheckAfter(r.PollInterval)
	return proceed, nil
}

// otherProtocolMembers returns the members that take part in another group protocol than ours;
// while a group rebalances it has not chosen one, and nobody is named.
func otherProtocolMembers(ours string, members []GroupMember) []GroupMember {
	var others []GroupMember
	for _, m := range members {
		if m.Protocol != "" && m.Protocol != ours {
			others = append(others, m)
		}
	}
	return others
}
