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
)

// ApproveRolloutAnnotation is the annotation that, set to the target engine version, lets a
// Supervised rollout stop the running consumers of another claim protocol.
const ApproveRolloutAnnotation = "inbox.seqinbox.dev/approve-rollout"
