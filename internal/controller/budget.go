package controller

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/sink"
)

// migrationJobConnections is what a probe or migration Job holds while it runs next to the consumers.
const migrationJobConnections = 1

// checkConnectionBudget rejects a spec in which not even one consumer (poolSize plus its
// maintenance pool) plus one Job connection fits into spec.database.connectionBudget. More
// replicas than the budget fits are not an error: the operator runs as many as fit
// (budgetReplicas) and says so in ScalingLimited, so that an autoscaler asking for more never
// invalidates the inbox.
func checkConnectionBudget(spec *v1alpha1.SequentialInboxSpec) *field.Error {
	if spec.Database.ConnectionBudget == nil {
		return nil
	}
	budget := *spec.Database.ConnectionBudget
	needed := consumerConnections(spec) + migrationJobConnections
	if needed <= budget {
		return nil
	}
	return field.Invalid(field.NewPath("spec", "database", "poolSize"), spec.Database.PoolSize,
		fmt.Sprintf("one consumer's %d connections + %d for its maintenance + %d for the migration Job = %d exceed spec.database.connectionBudget %d; "+
			"lower poolSize or raise the budget", spec.Database.PoolSize, v1alpha1.MaintenanceConnections, migrationJobConnections, needed, budget))
}

// consumerConnections is what one consumer pod holds: its records' pool and its maintenance pool.
func consumerConnections(spec *v1alpha1.SequentialInboxSpec) int32 {
	return spec.Database.PoolSize + v1alpha1.MaintenanceConnections
}

// budgetReplicas is how many consumers fit into spec.database.connectionBudget next to the
// migration Job's connection; false without a budget.
func budgetReplicas(spec *v1alpha1.SequentialInboxSpec) (int32, bool) {
	if spec.Database.ConnectionBudget == nil || spec.Database.PoolSize <= 0 {
		return 0, false
	}
	free := max(*spec.Database.ConnectionBudget-migrationJobConnections, 0)
	return free / consumerConnections(spec), true
}

// worstCaseRecordTime is the longest one record may take: it can release a chain of longestChain
// messages, and each delivery may use every attempt and every backoff between them, exactly as
// the consumer's sink bounds one delivery (sink.Config.Deadline, backoff doubling up to its cap).
func worstCaseRecordTime(spec *v1alpha1.SequentialInboxSpec, longestChain int) time.Duration {
	return time.Duration(max(longestChain, 1)) * sink.ConfigFor(&spec.Sink).Deadline()
}

// checkPollInterval warns when spec.kafka.maxPollIntervalMs cannot cover the worst-case time of
// one record: the group would rebalance while a record is still being delivered. It is a
// warning (Degraded), not an error: the worst case needs every delivery of a chain to time out.
func checkPollInterval(spec *v1alpha1.SequentialInboxSpec, longestChain int) *field.Error {
	worst := worstCaseRecordTime(spec, longestChain)
	limit := time.Duration(spec.Kafka.MaxPollIntervalMs) * time.Millisecond
	if worst <= limit {
		return nil
	}
	return field.Invalid(field.NewPath("spec", "kafka", "maxPollIntervalMs"), spec.Kafka.MaxPollIntervalMs,
		fmt.Sprintf("a record may take up to %s (release chain of %d × (sink timeout %s × %d attempts + backoff)); "+
			"raise maxPollIntervalMs to at least %d or lower the sink timeout or retries",
			worst, max(longestChain, 1), spec.Sink.Timeout.Duration, ptr.Deref(spec.Sink.Retries, 0)+1, worst.Milliseconds()))
}
