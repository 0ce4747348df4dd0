package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ActionType is an operator action on a message or a sequence instance (docs/design.md#operator-actions).
// +kubebuilder:validation:Enum=Consume;Expire;ConsumeAll;Close
type ActionType string

const (
	// ActionConsume delivers one message now, whatever its state, then releases its dependents.
	ActionConsume ActionType = "Consume"
	// ActionExpire marks one message PROCESSED without delivering it; its dependents become releasable.
	ActionExpire ActionType = "Expire"
	// ActionConsumeAll delivers every buffered message of one instance, ignoring release conditions.
	ActionConsumeAll ActionType = "ConsumeAll"
	// ActionClose closes one instance without delivering its buffered messages.
	ActionClose ActionType = "Close"
)

// SequentialInboxActionSpec names the action and its target; it cannot change once created (an
// action is a request, recorded once: a new request is a new resource).
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable; create a new SequentialInboxAction for another request"
// +kubebuilder:validation:XValidation:rule="(self.action == 'Consume' || self.action == 'Expire') == has(self.message)",message="spec.message (type and idempotenceId) is required for Consume and Expire, and only for them"
// +kubebuilder:validation:XValidation:rule="(self.action == 'ConsumeAll' || self.action == 'Close') == has(self.instance)",message="spec.instance (sequence and contextId) is required for ConsumeAll and Close, and only for them"
type SequentialInboxActionSpec struct {
	// InboxName is the SequentialInbox (same namespace) whose database holds the target.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	InboxName string `json:"inboxName"`

	// Action is what to do: Consume or Expire a message, ConsumeAll or Close an instance.
	// +required
	Action ActionType `json:"action"`

	// Message is the target of Consume and Expire.
	// +optional
	Message *ActionMessageTarget `json:"message,omitempty"`

	// Instance is the target of ConsumeAll and Close.
	// +optional
	Instance *ActionInstanceTarget `json:"instance,omitempty"`
}

// ActionMessageTarget names one logical message, as the inbox identifies it.
type ActionMessageTarget struct {
	// Type is the qualified message type: type, or type.subtype for a subtyped message.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	Type string `json:"type"`

	// IdempotenceID is the message's idempotence ID.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	IdempotenceID string `json:"idempotenceId"`
}

// ActionInstanceTarget names one sequence instance.
type ActionInstanceTarget struct {
	// Sequence is the name of the sequence (spec.sequences[].name of the inbox).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Sequence string `json:"sequence"`

	// ContextID is the instance's context ID.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	ContextID string `json:"contextId"`
}

// ActionPhase is where a requested action stands.
// +kubebuilder:validation:Enum=Pending;Recorded;Executed;Failed
type ActionPhase string

const (
	// ActionPending says the action is not recorded yet (the inbox is missing or the Job runs).
	ActionPending ActionPhase = "Pending"
	// ActionRecorded says the action is recorded in the database and waits for a consumer.
	ActionRecorded ActionPhase = "Recorded"
	// ActionExecuted says a consumer ran the action and it did its work; final.
	ActionExecuted ActionPhase = "Executed"
	// ActionFailed says the action could not be recorded (e.g. the target does not exist), or a
	// consumer ran it and it could not do its work, or another request replaced it; final.
	ActionFailed ActionPhase = "Failed"
)

// ConditionRecorded is the condition of a SequentialInboxAction: True once the action is recorded
// in the database, False with the reason while it is not (or when it failed).
const ConditionRecorded = "Recorded"

// ConditionExecuted is True once a consumer ran the action and it did its work, False with the
// reason when it could not (or while it waits).
const ConditionExecuted = "Executed"

// SequentialInboxActionStatus is what the operator did with the request.
type SequentialInboxActionStatus struct {
	// Phase is Pending until the action is Recorded, then Executed or Failed; both are final.
	// +optional
	Phase ActionPhase `json:"phase,omitempty"`

	// Conditions: Recorded, Executed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// JobName is the Job (`seqinbox action` from the inbox's image) that records the action and
	// awaits its execution.
	// +optional
	JobName string `json:"jobName,omitempty"`

	// Attempt counts the Jobs run for the action: the first records it, later ones await its
	// execution when no consumer ran it in the first Job's time.
	// +optional
	Attempt int32 `json:"attempt,omitempty"`

	// Message says what happened, for a person: what was recorded, or why it failed.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
}

// SequentialInboxAction requests an operator action (docs/design.md#operator-actions) on a message or a sequence
// instance of a SequentialInbox: the operator records it in the inbox's database with a Job, and
// a consumer executes it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sqia,categories=seqinbox
// +kubebuilder:printcolumn:name="Inbox",type=string,JSONPath=`.spec.inboxName`
// +kubebuilder:printcolumn:name="Action",type=string,JSONPath=`.spec.action`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Job",type=string,JSONPath=`.status.jobName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SequentialInboxAction struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SequentialInboxActionSpec `json:"spec"`
	// +optional
	Status SequentialInboxActionStatus `json:"status,omitempty"`
}

// SequentialInboxActionList is a list of SequentialInboxAction, required by the API machinery.
// +kubebuilder:object:root=true
type SequentialInboxActionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SequentialInboxAction `json:"items"`
}
