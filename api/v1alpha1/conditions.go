package v1alpha1

// Condition types of SequentialInbox.status.conditions, set by the operator and read by anyone who
// waits on them (`kubectl wait --for=condition=Ready sqi/orders`) or alerts on their reasons.
const (
	// ConditionReady summarises the others: the configuration is valid, the schema is migrated,
	// no rollout is blocked and the consumer Deployment is available.
	ConditionReady = "Ready"
	// ConditionConfigValid says whether the spec passed the semantic validation and budget checks.
	ConditionConfigValid = "ConfigValid"
	// ConditionSchemaReady says whether the database schema was migrated for the target image.
	ConditionSchemaReady = "SchemaReady"
	// ConditionRolloutBlocked is True while a rollout waits for old consumers to go (or for approval).
	ConditionRolloutBlocked = "RolloutBlocked"
	// ConditionProgressing is True while the operator works towards the spec (Jobs, rollout).
	ConditionProgressing = "Progressing"
	// ConditionDegraded is True when something needs a person's attention although the inbox may run.
	ConditionDegraded = "Degraded"
	// ConditionScalingLimited is True when fewer consumers run than spec.replicas asks for: the
	// topics' partition count or the connection budget caps them.
	ConditionScalingLimited = "ScalingLimited"
	// ConditionConsumerStateServed says whether the consumers serve their state to the operator,
	// which status.consumers, the Lag and Waiting columns and Degraded PartitionBlocked come from:
	// False when the image's engine version predates it, and its consumers run without it.
	ConditionConsumerStateServed = "ConsumerStateServed"
)

// ApproveRolloutAnnotation is the annotation that, set to the target engine version, lets a
// Supervised rollout stop the running consumers of another claim protocol.
const ApproveRolloutAnnotation = "inbox.seqinbox.dev/approve-rollout"

// Reasons of the SequentialInbox conditions. They are API: scripts, alerts and docs/troubleshooting.md
// match on them, so each constant is named as its value and a value never changes.
const (
	// ValidReason (ConfigValid True): the spec passed the semantic validation.
	ValidReason = "Valid"
	// InvalidSpecReason (ConfigValid False, Ready, Progressing): the message lists every invalid field.
	InvalidSpecReason = "InvalidSpec"
	// MaxPollIntervalTooShortReason (Degraded): maxPollIntervalMs cannot hold the longest release chain.
	MaxPollIntervalTooShortReason = "MaxPollIntervalTooShort"
	// DatabaseSecretMissingReason (SchemaReady, Degraded): the Secret with the database URL does not exist.
	DatabaseSecretMissingReason = "DatabaseSecretMissing"

	// ProbingTargetImageReason (Ready, Progressing): a dry-run Job learns the target's claim protocol.
	ProbingTargetImageReason = "ProbingTargetImage"
	// ProbeFailedReason (Ready, Progressing, Degraded): that Job failed.
	ProbeFailedReason = "ProbeFailed"
	// MigrationPendingReason (SchemaReady, Ready): the schema is not migrated for the target yet.
	MigrationPendingReason = "MigrationPending"
	// MigrationRunningReason (SchemaReady, Progressing): the migration Job runs.
	MigrationRunningReason = "MigrationRunning"
	// MigrationFailedReason (SchemaReady, Degraded): the migration Job failed; it is retried with backoff.
	MigrationFailedReason = "MigrationFailed"
	// DatabaseInUseReason (SchemaReady, Degraded): the database's tables belong to another inbox
	// (the message names it); nothing runs for this one.
	DatabaseInUseReason = "DatabaseInUse"
	// MigratedReason (SchemaReady True): the schema has the version the target image needs.
	MigratedReason = "Migrated"

	// SameClaimProtocolReason (RolloutBlocked False): the target speaks the running claim protocol.
	SameClaimProtocolReason = "SameClaimProtocol"
	// NoOtherConsumersReason (RolloutBlocked False): no consumer of another claim protocol runs.
	NoOtherConsumersReason = "NoOtherConsumers"
	// AwaitingApprovalReason (RolloutBlocked): a Supervised rollout waits for ApproveRolloutAnnotation.
	AwaitingApprovalReason = "AwaitingApproval"
	// WaitingForOldPodsReason (RolloutBlocked): the old consumer pods are terminating.
	WaitingForOldPodsReason = "WaitingForOldPods"
	// WaitingForConsumerGroupReason (RolloutBlocked): the Kafka consumer group still has members.
	WaitingForConsumerGroupReason = "WaitingForConsumerGroup"
	// ConsumerGroupUnknownReason (RolloutBlocked): the consumer group could not be read.
	ConsumerGroupUnknownReason = "ConsumerGroupUnknown"
	// CheckingRegistryReason (RolloutBlocked): a Job reads the database's consumer registry.
	CheckingRegistryReason = "CheckingRegistry"
	// WaitingForRegistryReason (RolloutBlocked): the registry shows live consumers of another protocol.
	WaitingForRegistryReason = "WaitingForRegistry"
	// ConsumerGroupHeldByOtherProtocolReason (Degraded): members of another group protocol hold the group.
	ConsumerGroupHeldByOtherProtocolReason = "ConsumerGroupHeldByOtherProtocol"
	// KafkaAccessFailedReason (Degraded): the brokers refused or did not answer the operator, which
	// connects with the same settings and Secrets as the consumers.
	KafkaAccessFailedReason = "KafkaAccessFailed"

	// PartitionBlockedReason (Degraded): a consumer has retried a record after infrastructure errors
	// for longer than five minutes; the message names the partition, the offset and the error.
	PartitionBlockedReason = "PartitionBlocked"

	// RollingOutReason (Progressing): the consumer Deployment rolls out.
	RollingOutReason = "RollingOut"
	// ConsumersUnavailableReason (Ready False): the consumer Deployment is not available.
	ConsumersUnavailableReason = "ConsumersUnavailable"
	// DeploymentFailingReason (Degraded): the Deployment reports a failure.
	DeploymentFailingReason = "DeploymentFailing"
	// ConsumersReadyReason (Ready True): the consumers run and are ready.
	ConsumersReadyReason = "ConsumersReady"
	// ReconciledReason (Progressing False): the consumers run the spec's generation.
	ReconciledReason = "Reconciled"
	// AsExpectedReason (Degraded False): nothing needs attention.
	AsExpectedReason = "AsExpected"
	// DeletingReason (Ready, Progressing): the consumers stop before the resource goes.
	DeletingReason = "Deleting"

	// PartitionCountReason (ScalingLimited): spec.replicas exceeds the topics' partitions.
	PartitionCountReason = "PartitionCount"
	// ConnectionBudgetReason (ScalingLimited): spec.replicas × (poolSize + MaintenanceConnections),
	// plus the migration Job's connection, would exceed the connection budget.
	ConnectionBudgetReason = "ConnectionBudget"
	// PartitionCountUnknownReason (ScalingLimited Unknown): the partition count could not be read.
	PartitionCountUnknownReason = "PartitionCountUnknown"
	// WithinLimitsReason (ScalingLimited False): every requested replica runs.
	WithinLimitsReason = "WithinLimits"

	// StateServedReason (ConsumerStateServed True): the consumers' engine serves its state, and
	// the operator reads it.
	StateServedReason = "StateServed"
	// EnginePredatesStateReason (ConsumerStateServed False): the image's engine version is older
	// than the first release whose consumers serve their state; they run without it.
	EnginePredatesStateReason = "EnginePredatesState"
)

// Reasons of the SequentialInboxAction conditions (Recorded, Executed), named as their values.
const (
	// InboxNotFoundReason (Pending): no SequentialInbox of spec.inboxName in the namespace.
	InboxNotFoundReason = "InboxNotFound"
	// RecordingReason (Pending): the `seqinbox action` Job runs.
	RecordingReason = "Recording"
	// RecordedReason (Recorded): the action is pending in the database for the consumers.
	RecordedReason = "Recorded"
	// NotRecordedReason (Failed): the Job refused or failed; the message says why.
	NotRecordedReason = "NotRecorded"
	// JobLostReason (Failed): the Job disappeared before it reported.
	JobLostReason = "JobLost"
	// AwaitingExecutionReason (Executed False, Recorded): no consumer has run the action yet.
	AwaitingExecutionReason = "AwaitingExecution"
	// ExecutedReason (Executed True): a consumer ran the action and it did its work.
	ExecutedReason = "Executed"
	// ExecutionFailedReason (Executed False, Failed): a consumer ran the action and it could not do its work.
	ExecutionFailedReason = "ExecutionFailed"
	// SupersededReason (Executed False, Failed): another request replaced the action before it ran.
	SupersededReason = "Superseded"
)
