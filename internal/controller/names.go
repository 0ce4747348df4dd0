package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// Labels every object the operator creates carries; the manager's cache holds only objects with
// labelManagedBy, and the consumer pods are found through labelInstance and labelComponent.
const (
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelComponent = "app.kubernetes.io/component"
	labelManagedBy = "app.kubernetes.io/managed-by"

	appName   = "seqinbox"
	managedBy = "seqinbox-operator"

	// jobNameLabel is set by the Job controller on the pods of a Job.
	jobNameLabel = "batch.kubernetes.io/job-name"
)

// Components: the consumer pods and the kinds of Jobs run from the target image.
const (
	componentConsumer  = "consumer"
	componentProbe     = "probe"
	componentMigration = "migration"
	// componentAction: the Jobs that record the operator actions of SequentialInboxAction resources.
	componentAction = "action"
)

// Annotations the operator writes; the pod template's engine annotations are how a later pass
// knows what the running consumers speak, even when the status was lost.
const (
	annotationConfigHash    = "inbox.seqinbox.dev/config-hash"
	annotationEngineVersion = "inbox.seqinbox.dev/engine-version"
	annotationClaimProtocol = "inbox.seqinbox.dev/claim-protocol"
	annotationGroupProtocol = "inbox.seqinbox.dev/group-protocol"
	// annotationJobKey and annotationAttempt say which run a Job belongs to.
	annotationJobKey  = "inbox.seqinbox.dev/job-key"
	annotationAttempt = "inbox.seqinbox.dev/attempt"
	// annotationConsumersStopped on a probe Job records that no consumer of the inbox ran when
	// it was created, so its report may prove that the registry holds no old consumer.
	annotationConsumersStopped = "inbox.seqinbox.dev/consumers-stopped"
)

// fieldOwner is the server-side apply field manager of the operator.
const fieldOwner = "seqinbox-operator"

// finalizerName keeps a SequentialInbox until its consumers have stopped.
const finalizerName = "inbox.seqinbox.dev/stop-consumers"

// managedSelector selects every object the operator created; the manager caches only those.
func managedSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{labelManagedBy: managedBy})
}

// selectorLabels identify the objects of one component of one inbox (immutable Deployment selector).
func selectorLabels(inbox *v1alpha1.SequentialInbox, component string) map[string]string {
	return map[string]string{labelName: appName, labelInstance: inbox.Name, labelComponent: component}
}

// objectLabels are selectorLabels plus the management label.
func objectLabels(inbox *v1alpha1.SequentialInbox, component string) map[string]string {
	l := selectorLabels(inbox, component)
	l[labelManagedBy] = managedBy
	return l
}

func deploymentName(inbox *v1alpha1.SequentialInbox) string { return inbox.Name + "-consumer" }

func metricsServiceName(inbox *v1alpha1.SequentialInbox) string { return inbox.Name + "-metrics" }

func pdbName(inbox *v1alpha1.SequentialInbox) string { return inbox.Name + "-consumer" }

// stateSecretName names the Secret of the credentials the consumers serve their state with.
func stateSecretName(inbox *v1alpha1.SequentialInbox) string { return inbox.Name + "-consumer-state" }

// configMapName names the immutable ConfigMap of one rendered configuration: a new configuration
// is a new ConfigMap, so running pods keep theirs until the rollout replaces them.
func configMapName(inbox *v1alpha1.SequentialInbox, hash string) string {
	return inbox.Name + "-config-" + hash[:10]
}

// jobName names one attempt of a Job; the inbox name is at most 40 characters (CRD rule), so the
// result stays within the 63 characters of the Job's pod label.
func jobName(inbox *v1alpha1.SequentialInbox, component, key string, attempt int32) string {
	return fmt.Sprintf("%s-%s-%s-%d", inbox.Name, shortComponent(component), key, attempt)
}

func shortComponent(component string) string {
	if component == componentMigration {
		return "migrate"
	}
	return component
}

// hashOf returns a short, stable hash of the parts (8 hex characters, enough to tell runs apart).
func hashOf(parts ...string) string {
	return fullHash([]byte(strings.Join(parts, "\x00")))[:8]
}

// fullHash is the hex SHA-256 of data.
func fullHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
