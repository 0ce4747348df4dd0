package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/kafkaauth"
)

// Scaling: spec.replicas is the one place a replica count is set — by the user, `kubectl scale`
// or an autoscaler through the scale subresource. The operator never writes it; it derives the
// Deployment's replicas from it, capped by what can usefully run: a consumer beyond the topics'
// partition count gets no partition, and consumers beyond the connection budget would exhaust
// the database's connections. The ScalingLimited condition says when a cap applies.

// partitionRecheck is how often a pass reads the partition count again while it caps or could
// not be read: partitions added to a topic lift the cap without any watch event.
const partitionRecheck = time.Minute

// replicaCap is one upper bound of the consumers worth running, with why it holds.
type replicaCap struct {
	limit  int32
	reason string
	why    string
}

// capReplicas returns the replicas to run for requested and the cap that lowered them (nil
// when none did); the lowest cap binds, the first of equal ones is named.
func capReplicas(requested int32, caps []replicaCap) (int32, *replicaCap) {
	var binding *replicaCap
	replicas := requested
	for i := range caps {
		if caps[i].limit < replicas {
			replicas = caps[i].limit
			binding = &caps[i]
		}
	}
	return replicas, binding
}

// budgetCap is the connection budget as a replica cap; false without a budget.
func budgetCap(spec *v1alpha1.SequentialInboxSpec) (replicaCap, bool) {
	n, ok := budgetReplicas(spec)
	if !ok {
		return replicaCap{}, false
	}
	return replicaCap{limit: n, reason: v1alpha1.ConnectionBudgetReason, why: fmt.Sprintf(
		"spec.database.connectionBudget %d fits %d consumer(s) of poolSize %d (+%d maintenance connections each) next to the migration Job's connection",
		*spec.Database.ConnectionBudget, n, spec.Database.PoolSize, v1alpha1.MaintenanceConnections)}, true
}

// partitionCap is the topics' partition count as a replica cap; false when no topic exists yet
// (the count is unknown, not zero).
func partitionCap(partitions map[string]int32) (replicaCap, bool) {
	var total int32
	topics := make([]string, 0, len(partitions))
	for topic, n := range partitions {
		total += n
		topics = append(topics, fmt.Sprintf("%s (%d)", topic, n))
	}
	if total == 0 {
		return replicaCap{}, false
	}
	slices.Sort(topics)
	return replicaCap{limit: total, reason: v1alpha1.PartitionCountReason, why: fmt.Sprintf(
		"the topics have %d partition(s) in total: %s; a consumer beyond that would get no partition",
		total, strings.Join(topics, ", "))}, true
}

// planReplicas decides how many consumers the Deployment asks for and sets ScalingLimited. It
// reads the partition count from Kafka only when more than one consumer could run.
func (r *Reconciler) planReplicas(ctx context.Context, s *scope) (phaseResult, error) {
	requested := ptr.Deref(s.inbox.Spec.Replicas, 1)
	var caps []replicaCap
	if c, ok := budgetCap(&s.inbox.Spec); ok {
		caps = append(caps, c)
	}
	replicas, _ := capReplicas(requested, caps)
	var readErr error
	if replicas > 1 {
		partitions, err := r.topicPartitions(ctx, s)
		switch c, ok := partitionCap(partitions); {
		case err != nil:
			readErr = err
			s.problem(v1alpha1.KafkaAccessFailedReason, fmt.Sprintf("The operator cannot read the topics: %v.", err))
		case ok:
			caps = append(caps, c)
		default:
			readErr = fmt.Errorf("none of the topics %s exists yet", strings.Join(s.inbox.Spec.Kafka.Topics, ", "))
		}
	}
	replicas, binding := capReplicas(requested, caps)
	s.replicas = replicas
	switch {
	case binding != nil:
		s.recheck = partitionRecheck
		s.setCondition(condition(v1alpha1.ConditionScalingLimited, metav1.ConditionTrue, binding.reason, fmt.Sprintf(
			"spec.replicas asks for %d consumer(s); %d run: %s.", requested, replicas, binding.why)))
	case readErr != nil:
		s.recheck = partitionRecheck
		s.setCondition(condition(v1alpha1.ConditionScalingLimited, metav1.ConditionUnknown, v1alpha1.PartitionCountUnknownReason, truncate(fmt.Sprintf(
			"%d consumer(s) run as spec.replicas asks, uncapped by the partition count, which is unknown: %v.", replicas, readErr))))
	default:
		s.setCondition(condition(v1alpha1.ConditionScalingLimited, metav1.ConditionFalse, v1alpha1.WithinLimitsReason, fmt.Sprintf(
			"%d consumer(s) run as spec.replicas asks.", replicas)))
	}
	return proceed, nil
}

// topicPartitions reads the partition counts of the inbox's topics; an error names how the
// operator connected, so that a wrong password or certificate is recognisable.
func (r *Reconciler) topicPartitions(ctx context.Context, s *scope) (map[string]int32, error) {
	spec := &s.inbox.Spec.Kafka
	conn, err := r.kafkaConnection(ctx, s.inbox)
	if err == nil {
		var partitions map[string]int32
		if partitions, err = r.Groups.TopicPartitions(ctx, conn, spec.Topics); err == nil {
			return partitions, nil
		}
	}
	brokers := strings.Join(spec.BootstrapServers, ",")
	if errors.Is(err, kafkaauth.ErrRefused) {
		return nil, fmt.Errorf("brokers %s, %s: %s", brokers, kafkaauth.Describe(spec), kafkaauth.Refusal(spec, err))
	}
	return nil, fmt.Errorf("brokers %s, %s: %w", brokers, kafkaauth.Describe(spec), err)
}

// consumerSelector is the label selector of the consumer pods, as the scale subresource reports it.
func consumerSelector(inbox *v1alpha1.SequentialInbox) string {
	return labels.SelectorFromSet(selectorLabels(inbox, componentConsumer)).String()
}
