package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SequentialInboxSpec declares one sequential inbox: where records come from, how they are
// sequenced, where the inbox state lives and where released messages go.
// +kubebuilder:validation:XValidation:rule="!has(self.database.connectionBudget) || self.database.poolSize <= self.database.connectionBudget",message="spec.database.poolSize must not exceed spec.database.connectionBudget"
// +kubebuilder:validation:XValidation:rule="!has(self.deadLetterTopic) || !(self.deadLetterTopic in self.kafka.topics)",message="spec.deadLetterTopic must not be one of spec.kafka.topics: the inbox would read its own dead letters"
type SequentialInboxSpec struct {
	// Kafka is where the records are read from.
	Kafka KafkaSpec `json:"kafka"`

	// Database is the PostgreSQL database that keeps the inbox state.
	Database DatabaseSpec `json:"database"`

	// Sink is the team's HTTP service that receives released messages as CloudEvents.
	Sink SinkSpec `json:"sink"`

	// DeadLetterTopic receives records that cannot be processed (undecodable, undeclared type,
	// invalid subtype, finally failed, or deleted by housekeeping while waiting).
	// Defaults to "<consumerGroup>.dlq".
	// +optional
	// +kubebuilder:validation:MaxLength=249
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9._-]+$`
	DeadLetterTopic string `json:"deadLetterTopic,omitempty"`

	// Sequences lists which message types form which sequence and in which order they are released.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	Sequences []SequenceSpec `json:"sequences"`

	// SequencingStartTime starts sequencing at this time. Before it, every message is delivered at
	// once and recorded as PROCESSED (recording mode), so that a sequence can be introduced on a
	// live topic. Unset: sequencing is active from the start.
	// +optional
	SequencingStartTime *metav1.Time `json:"sequencingStartTime,omitempty"`

	// Housekeeping controls the removal of closed and expired sequence instances.
	// +optional
	// +kubebuilder:default={}
	Housekeeping HousekeepingSpec `json:"housekeeping,omitempty"`

	// Replicas is the number of consumer pods asked for; the scale subresource (kubectl scale,
	// HorizontalPodAutoscaler, KEDA) sets it. The operator runs at most as many consumers as the
	// topics have partitions and the connection budget allows (condition ScalingLimited).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Replicas *int32 `json:"replicas,omitempty"`

	// Image of the consumer and the migration Job. Defaults to the operator's own image, so that
	// operator, migrations and engine are one release.
	// +optional
	Image string `json:"image,omitempty"`

	// UpgradeStrategy says whether a rollout that changes the claim protocol stops the old
	// consumers on its own (Automatic) or waits for approval (Supervised, annotation
	// inbox.seqinbox.dev/approve-rollout set to the target engine version).
	// +optional
	// +kubebuilder:default=Automatic
	UpgradeStrategy UpgradeStrategy `json:"upgradeStrategy,omitempty"`

	// Resources of the consumer container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// ImagePullSecrets are used to pull Image, for the consumer pods and the operator's Jobs.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
}

// UpgradeStrategy decides who lets an incompatible rollout stop the running consumers.
// +kubebuilder:validation:Enum=Automatic;Supervised
type UpgradeStrategy string

const (
	// UpgradeAutomatic stops old consumers on its own when the claim protocol changes.
	UpgradeAutomatic UpgradeStrategy = "Automatic"
	// UpgradeSupervised waits for the approval annotation before stopping old consumers.
	UpgradeSupervised UpgradeStrategy = "Supervised"
)

// KafkaSpec says where records are read from and as which consumer group.
// +kubebuilder:validation:XValidation:rule="!has(self.sessionTimeoutMs) || !has(self.maxPollIntervalMs) || self.sessionTimeoutMs <= self.maxPollIntervalMs",message="spec.kafka.sessionTimeoutMs must not exceed spec.kafka.maxPollIntervalMs"
// +kubebuilder:validation:XValidation:rule="!has(self.sessionTimeoutMs) || !has(self.heartbeatIntervalMs) || self.heartbeatIntervalMs * 3 <= self.sessionTimeoutMs",message="spec.kafka.heartbeatIntervalMs must be at most a third of spec.kafka.sessionTimeoutMs"
// +kubebuilder:validation:XValidation:rule="!has(self.sasl) || self.sasl.mechanism != 'PLAIN' || has(self.tls) || (has(self.sasl.allowPlainWithoutTLS) && self.sasl.allowPlainWithoutTLS)",message="SASL PLAIN sends the password in clear text: set spec.kafka.tls, or spec.kafka.sasl.allowPlainWithoutTLS on a trusted network"
type KafkaSpec struct {
	// BootstrapServers are host:port pairs of the Kafka brokers.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=atomic
	BootstrapServers []string `json:"bootstrapServers"`

	// Topics are read by the consumer group.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=249
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9._-]+$`
	// +listType=set
	Topics []string `json:"topics"`

	// ConsumerGroup is the Kafka consumer group. It cannot change: a new group would re-read the
	// topics from its reset offset.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=249
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.kafka.consumerGroup is immutable; create a new SequentialInbox for a new group"
	ConsumerGroup string `json:"consumerGroup"`

	// MaxPollIntervalMs is the longest a consumer may take for one record before the group
	// rebalances; it becomes franz-go's rebalance timeout and bounds each record's processing.
	// +optional
	// +kubebuilder:default=300000
	// +kubebuilder:validation:Minimum=10000
	// +kubebuilder:validation:Maximum=3600000
	MaxPollIntervalMs int32 `json:"maxPollIntervalMs,omitempty"`

	// SessionTimeoutMs is how long the group waits for a consumer that stopped heartbeating (a
	// crashed pod, a lost node) before its partitions go to the other consumers: a crash holds
	// its partitions for about this long plus one rebalance. The broker accepts it only within
	// its group.min.session.timeout.ms and group.max.session.timeout.ms (by default 6 s and
	// 30 min); at most maxPollIntervalMs.
	// +optional
	// +kubebuilder:default=10000
	// +kubebuilder:validation:Minimum=1000
	// +kubebuilder:validation:Maximum=1800000
	SessionTimeoutMs int32 `json:"sessionTimeoutMs,omitempty"`

	// HeartbeatIntervalMs is how often a consumer tells the group that it is alive, and so how
	// soon the surviving consumers learn of a rebalance; at most a third of sessionTimeoutMs, so
	// that one lost heartbeat does not cost the partitions.
	// +optional
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=600000
	HeartbeatIntervalMs int32 `json:"heartbeatIntervalMs,omitempty"`

	// GroupProtocolEpoch is part of the group protocol name the consumers announce
	// ("seqinbox-<claim protocol>", with "-epoch<N>" appended when N > 0). Raising it makes the
	// broker keep the new consumers and every consumer of a lower epoch out of one group
	// generation, and makes the rollout stop the old consumers first, as for a claim protocol
	// change. Raise it when a change is incompatible in a way the claim protocol does not show.
	// +optional
	// +kubebuilder:validation:Minimum=0
	GroupProtocolEpoch int32 `json:"groupProtocolEpoch,omitempty"`

	// MaxBufferedBytes bounds the bytes of the records one consumer holds between fetching and
	// finishing them: queued behind the record in process, waiting for an earlier record of their
	// key or sequence instance, or in process. Past it the consumer stops fetching the partitions
	// that hold records, until it is down to half (a partition that holds none fetches again, so
	// that one slow partition does not stop the others). A single record larger than the bound is
	// still read and processed. Each fetch asks the broker for at most a quarter of it. Unset: a
	// quarter of the consumer container's memory limit (the Go heap needs about twice what it
	// holds), or 128Mi when the container has no memory limit.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('1Mi')) >= 0",message="spec.kafka.maxBufferedBytes must be at least 1Mi"
	MaxBufferedBytes *resource.Quantity `json:"maxBufferedBytes,omitempty"`

	// TLS enables TLS to the brokers.
	// +optional
	TLS *KafkaTLS `json:"tls,omitempty"`

	// SASL authenticates to the brokers.
	// +optional
	SASL *KafkaSASL `json:"sasl,omitempty"`
}

// KafkaTLS configures TLS to the brokers.
type KafkaTLS struct {
	// CASecretRef names a Secret key holding the PEM CA bundle; unset uses the system roots.
	// Strimzi: the cluster CA Secret `<cluster>-cluster-ca-cert`, key `ca.crt`.
	// +optional
	CASecretRef *corev1.SecretKeySelector `json:"caSecretRef,omitempty"`

	// ClientCertificate authenticates the consumer to the brokers with a TLS client certificate.
	// +optional
	ClientCertificate *KafkaClientCertificate `json:"clientCertificate,omitempty"`
}

// KafkaClientCertificate names the Secret that holds a PEM client certificate and its private
// key: a Strimzi KafkaUser Secret (keys user.crt and user.key, the defaults) or a
// kubernetes.io/tls Secret (set the keys to tls.crt and tls.key).
type KafkaClientCertificate struct {
	// SecretName is the Secret in the inbox's namespace; for Strimzi, the KafkaUser's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`
	// CertificateKey is the key of the PEM certificate (chain); empty means user.crt.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CertificateKey string `json:"certificateKey,omitempty"`
	// PrivateKeyKey is the key of the PEM private key; empty means user.key.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PrivateKeyKey string `json:"privateKeyKey,omitempty"`
}

// KafkaSASL configures SASL authentication to the brokers. Strimzi's format: username is the
// KafkaUser's name and passwordSecretRef its Secret's key `password`; a plain key/value Secret
// names both keys (usernameSecretRef, passwordSecretRef).
// +kubebuilder:validation:XValidation:rule="has(self.username) != has(self.usernameSecretRef)",message="set exactly one of spec.kafka.sasl.username and spec.kafka.sasl.usernameSecretRef"
type KafkaSASL struct {
	// Mechanism is the SASL mechanism.
	// +kubebuilder:validation:Enum=PLAIN;SCRAM-SHA-256;SCRAM-SHA-512
	Mechanism string `json:"mechanism"`
	// Username is the user name, when it is not kept in a Secret (Strimzi: the KafkaUser's name).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Username string `json:"username,omitempty"`
	// UsernameSecretRef names the Secret key holding the user name.
	// +optional
	UsernameSecretRef *corev1.SecretKeySelector `json:"usernameSecretRef,omitempty"`
	// PasswordSecretRef names the Secret key holding the password (Strimzi: the KafkaUser's
	// Secret, key `password`).
	PasswordSecretRef corev1.SecretKeySelector `json:"passwordSecretRef"`
	// AllowPlainWithoutTLS lets the PLAIN mechanism send the password unencrypted, without
	// spec.kafka.tls. Refused otherwise.
	// +optional
	AllowPlainWithoutTLS bool `json:"allowPlainWithoutTLS,omitempty"`
}

// MaintenanceConnections is what each consumer pod holds besides spec.database.poolSize: a small
// pool of its own for housekeeping (one), operator actions (two) and the version fence (one), so
// that maintenance never takes a record's connection. The connection budget counts it.
const MaintenanceConnections = 4

// DatabaseSpec says where the inbox state lives and how many connections a consumer may use.
type DatabaseSpec struct {
	// URLSecretRef names the Secret key that holds the PostgreSQL connection URL.
	URLSecretRef corev1.SecretKeySelector `json:"urlSecretRef"`

	// Schema is the PostgreSQL schema that holds this inbox's tables, for a second inbox in one
	// database. The migration and every consumer check before they touch a table that the
	// connection resolves unqualified names to it (current_schema(): the first existing schema of
	// search_path) and refuse otherwise, naming the schema they found. Set search_path for the
	// database role or the database (ALTER ROLE … SET search_path), which works behind a
	// connection pooler, or in the URL when nothing pools the connections. Empty: not checked.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]*$`
	// +kubebuilder:validation:MaxLength=63
	Schema string `json:"schema,omitempty"`

	// PoolSize is the number of connections per consumer pod for records; a record in flight holds
	// up to two. Each pod holds 4 more for housekeeping, operator actions and the version fence.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=1000
	PoolSize int32 `json:"poolSize,omitempty"`

	// ConnectionBudget is the number of connections the database grants this inbox in total.
	// One consumer (poolSize + 4 maintenance connections) plus the migration Job's one must fit
	// into it; the operator runs only as many replicas as fit.
	// +optional
	// +kubebuilder:validation:Minimum=2
	ConnectionBudget *int32 `json:"connectionBudget,omitempty"`

	// IdleLockTimeout bounds how long the release transaction may hold the instance lock while idle
	// (PostgreSQL idle_in_transaction_session_timeout). The transaction holds the lock during a
	// sink call, so a consumer raises a lower value to the sink's deadline (every attempt of
	// spec.sink.timeout and every backoff between them) plus 5s, and logs the value it uses: with
	// the default sink settings that is 46.4s, and the default of 30s applies only to a sink whose
	// deadline is shorter.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="spec.database.idleLockTimeout must be a duration such as 30s, from 1s to 1h"
	IdleLockTimeout Duration `json:"idleLockTimeout,omitzero"`
}

// SinkSpec is the team's HTTP service that receives released messages: a URL or a Service
// reference, optionally with TLS (CA bundle, client certificate) and a bearer token.
// +kubebuilder:validation:XValidation:rule="has(self.url) != has(self.service)",message="set exactly one of spec.sink.url and spec.sink.service"
type SinkSpec struct {
	// URL receives an HTTP POST per released message, in CloudEvents binary mode.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://`
	URL string `json:"url,omitempty"`

	// Service names a Service in the cluster that receives the messages, instead of URL.
	// +optional
	Service *SinkServiceReference `json:"service,omitempty"`

	// TLS configures the HTTPS connection to the sink: the CA bundle to trust and a client certificate.
	// +optional
	TLS *SinkTLS `json:"tls,omitempty"`

	// BearerTokenSecretRef names a Secret key whose value is sent as `Authorization: Bearer <token>`;
	// a rotated token is used from the next request on.
	// +optional
	BearerTokenSecretRef *corev1.SecretKeySelector `json:"bearerTokenSecretRef,omitempty"`

	// Timeout of one delivery attempt.
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('10ms') && duration(self) <= duration('1h')",message="spec.sink.timeout must be a duration such as 10s, from 10ms to 1h"
	Timeout Duration `json:"timeout,omitzero"`

	// Retries after a failed attempt (non-2xx, timeout, connection error) before the message is
	// marked FAILED; attempts back off exponentially.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=20
	Retries *int32 `json:"retries,omitempty"`

	// InitialBackoff is the wait before the first retry; it doubles for each further retry.
	// +optional
	// +kubebuilder:default="200ms"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('1ms') && duration(self) <= duration('10m')",message="spec.sink.initialBackoff must be a duration such as 200ms, from 1ms to 10m"
	InitialBackoff Duration `json:"initialBackoff,omitzero"`

	// ForwardHeaders names record headers that are sent to the sink as HTTP headers, in any
	// case. The CloudEvents attributes (from the record's ce_ headers only), content-type,
	// traceparent and tracestate are always sent; no other record header is. Credential,
	// hop-by-hop, proxy and forwarding headers (Authorization, Cookie, Proxy-*, X-Forwarded-*,
	// Forwarded, Host, Connection, ...), ce- and ce_ names and seqinbox- names are refused.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	ForwardHeaders []string `json:"forwardHeaders,omitempty"`
}

// SinkServiceReference addresses a Service: <scheme>://<name>.<namespace>.svc:<port><path>.
type SinkServiceReference struct {
	// Name of the Service.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Namespace of the Service; empty means the inbox's namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace,omitempty"`
	// Port of the Service; empty means 80 for http and 443 for https.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
	// Path of the request, starting with a slash; empty means /.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^/`
	Path string `json:"path,omitempty"`
	// Scheme is http or https; empty means https when spec.sink.tls is set, else http.
	// +optional
	// +kubebuilder:validation:Enum=http;https
	Scheme string `json:"scheme,omitempty"`
}

// SinkTLS configures HTTPS to the sink.
type SinkTLS struct {
	// CASecretRef names a Secret key holding the PEM CA bundle; unset uses the system roots.
	// +optional
	CASecretRef *corev1.SecretKeySelector `json:"caSecretRef,omitempty"`
	// ClientCertificate authenticates the consumer to the sink with a TLS client certificate.
	// +optional
	ClientCertificate *SinkClientCertificate `json:"clientCertificate,omitempty"`
}

// SinkClientCertificate names the Secret that holds a PEM client certificate and its key: a
// kubernetes.io/tls Secret (tls.crt and tls.key, the defaults), such as cert-manager writes.
type SinkClientCertificate struct {
	// SecretName is the Secret in the inbox's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`
	// CertificateKey is the key of the PEM certificate (chain); empty means tls.crt.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CertificateKey string `json:"certificateKey,omitempty"`
	// PrivateKeyKey is the key of the PEM private key; empty means tls.key.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PrivateKeyKey string `json:"privateKeyKey,omitempty"`
}

// HousekeepingSpec controls the removal of closed and expired sequence instances.
type HousekeepingSpec struct {
	// Interval between housekeeping runs (one consumer at a time runs it).
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('24h')",message="spec.housekeeping.interval must be a duration such as 5m, from 1s to 24h"
	Interval Duration `json:"interval,omitzero"`

	// ExpiryDelay is how long an instance past its retention is kept before it is deleted.
	// +optional
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('0s') && duration(self) <= duration('8760h')",message="spec.housekeeping.expiryDelay must be a duration such as 1h, from 0s to 8760h"
	ExpiryDelay Duration `json:"expiryDelay,omitzero"`

	// BatchSize is the number of instances deleted per transaction.
	// +optional
	// +kubebuilder:default=500
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	BatchSize int32 `json:"batchSize,omitempty"`

	// MaxDuration bounds one housekeeping run.
	// +optional
	// +kubebuilder:default="1m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="spec.housekeeping.maxDuration must be a duration such as 1m, from 1s to 1h"
	MaxDuration Duration `json:"maxDuration,omitzero"`
}

// SequenceSpec is one sequence: the message types whose messages of one context are released in order.
type SequenceSpec struct {
	// Name of the sequence, unique within the inbox.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z][a-zA-Z0-9_-]*$`
	Name string `json:"name"`

	// Retention is how long an open instance of this sequence waits for its missing messages,
	// counted from its creation. An instance still open then is deleted by housekeeping after
	// spec.housekeeping.expiryDelay, its WAITING messages dead-lettered; its claims (the duplicate
	// protection of its messages) go with it. At least one minute.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('60s') && duration(self) <= duration('87600h')",message="spec.sequences[].retention must be a duration such as 168h, from 60s (one minute) to 87600h"
	Retention Duration `json:"retention"`

	// DuplicateProtection is how long a closed instance of this sequence and the claims of its
	// messages are kept, counted from its closing: until then a duplicate of any of its messages
	// is recognised (acknowledged, not delivered, no new instance). The first housekeeping run
	// after that deletes the instance with its messages and claims; a later duplicate is treated
	// as a new message. Unset: the retention. 0s deletes closed instances at the next
	// housekeeping run. The window in force when an instance closes applies to it.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('0s') && duration(self) <= duration('87600h')",message="spec.sequences[].duplicateProtection must be a duration such as 168h, from 0s to 87600h"
	DuplicateProtection *Duration `json:"duplicateProtection,omitempty"`

	// KeepDeliveredRecords keeps the raw record (key, value, headers) of every delivered message
	// of this sequence for as long as its instance is kept, so that a Consume action can deliver
	// a PROCESSED message again. Off (the default), a record is kept only while the consumer may
	// still have to deliver it: a buffered (WAITING) message until its release, a FAILED one until
	// a resend or an action settles it; a delivered message keeps its state and claim but not its
	// payload, and Consume of a PROCESSED message fails, naming this setting. Turning it on keeps
	// the records of messages delivered from then on.
	// +optional
	KeepDeliveredRecords bool `json:"keepDeliveredRecords,omitempty"`

	// Messages are the (qualified) message types of the sequence.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Messages []MessageSpec `json:"messages"`
}

// MessageSpec declares one (qualified) message type of a sequence and how to read it.
// +kubebuilder:validation:XValidation:rule="!has(self.subtype) || has(self.subtypeFrom)",message="subtypeFrom is required when subtype is set"
type MessageSpec struct {
	// Type is the message type: the CloudEvents type as producers send it, for example
	// `OrderCreated` or `com.example.order.created`. Any printable text, dots included.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:Pattern=`^[^\x00-\x1F\x7F-\x9F]+$`
	Type string `json:"type"`

	// Subtype makes the qualified type `<type>.<subtype>` (`com.example.order.validated.OK`);
	// the value is read per record from SubtypeFrom. It must not contain a dot or whitespace:
	// the last dot of a qualified type separates the subtype.
	// +optional
	// +kubebuilder:validation:Pattern=`^[^.\s]+$`
	Subtype string `json:"subtype,omitempty"`

	// SubtypeFrom says where a record carries its subtype. Required when subtype is set.
	// +optional
	SubtypeFrom *FieldSource `json:"subtypeFrom,omitempty"`

	// ContextID says where a record carries its context ID. Defaults to the record key.
	// A record whose context ID is empty is delivered without sequencing.
	// +optional
	ContextID *FieldSource `json:"contextId,omitempty"`

	// IdempotenceID says where a record carries its idempotence ID. Defaults to the CloudEvents id.
	// +optional
	IdempotenceID *FieldSource `json:"idempotenceId,omitempty"`

	// Filter is a CEL expression over the record (`type`, `headers`, `key`, `payload`); false
	// delivers the record without sequencing.
	// +optional
	Filter string `json:"filter,omitempty"`

	// ReleaseCondition says which qualified types of this sequence must have been processed in the
	// instance before a message of this type is released. Unset: released at once.
	// +optional
	ReleaseCondition *ReleaseCondition `json:"releaseCondition,omitempty"`
}

// FieldSource names one place of a record: a header, a JSON pointer into the payload, or the key.
// +kubebuilder:validation:XValidation:rule="[has(self.header), has(self.jsonPointer), has(self.key) && self.key].filter(x, x).size() == 1",message="set exactly one of header, jsonPointer or key"
type FieldSource struct {
	// Header is the name of a record header (CloudEvents attributes are `ce_<name>`, for example `ce_id`).
	// +optional
	Header string `json:"header,omitempty"`
	// JSONPointer is an RFC 6901 pointer into the JSON payload, for example `/orderId`.
	// +optional
	// +kubebuilder:validation:Pattern=`^(/.*)?$`
	JSONPointer string `json:"jsonPointer,omitempty"`
	// Key reads the record key.
	// +optional
	Key bool `json:"key,omitempty"`
}

// ReleaseCondition is the top of a release condition tree: exactly one of predecessor, and, or.
// Three levels of nesting are expressible, which keeps the CRD schema structural.
// +kubebuilder:validation:XValidation:rule="[has(self.predecessor), has(self.and), has(self.or)].filter(x, x).size() == 1",message="set exactly one of predecessor, and or or"
type ReleaseCondition struct {
	// Predecessor is a qualified type that must have been processed.
	// +optional
	Predecessor string `json:"predecessor,omitempty"`
	// And holds when every operand holds.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	And []ReleaseConditionTerm `json:"and,omitempty"`
	// Or holds when any operand holds.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Or []ReleaseConditionTerm `json:"or,omitempty"`
}

// ReleaseConditionTerm is the second level of a release condition tree.
// +kubebuilder:validation:XValidation:rule="[has(self.predecessor), has(self.and), has(self.or)].filter(x, x).size() == 1",message="set exactly one of predecessor, and or or"
type ReleaseConditionTerm struct {
	// Predecessor is a qualified type that must have been processed.
	// +optional
	Predecessor string `json:"predecessor,omitempty"`
	// And holds when every operand holds.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	And []ReleaseConditionLeaf `json:"and,omitempty"`
	// Or holds when any operand holds.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Or []ReleaseConditionLeaf `json:"or,omitempty"`
}

// ReleaseConditionLeaf is the third and last level of a release condition tree.
type ReleaseConditionLeaf struct {
	// Predecessor is a qualified type that must have been processed.
	// +kubebuilder:validation:MinLength=1
	Predecessor string `json:"predecessor"`
}

// SequentialInboxStatus is what the operator observed and decided.
type SequentialInboxStatus struct {
	// ObservedGeneration is the generation of the last fully reconciled spec.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, ConfigValid, SchemaReady, RolloutBlocked, Progressing, Degraded, ScalingLimited,
	// ConsumerStateServed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// SchemaVersion is the database schema version reported by the last successful migration.
	// +optional
	SchemaVersion int32 `json:"schemaVersion,omitempty"`

	// RunningEngineVersion is the engine version of the consumers currently allowed to run.
	// +optional
	RunningEngineVersion string `json:"runningEngineVersion,omitempty"`

	// RunningClaimProtocol is the claim protocol of the consumers currently allowed to run.
	// +optional
	RunningClaimProtocol string `json:"runningClaimProtocol,omitempty"`

	// TargetEngineVersion is the engine version of the image the spec asks for.
	// +optional
	TargetEngineVersion string `json:"targetEngineVersion,omitempty"`

	// TargetClaimProtocol is the claim protocol of the image the spec asks for.
	// +optional
	TargetClaimProtocol string `json:"targetClaimProtocol,omitempty"`

	// TargetImage is the image that TargetEngineVersion and TargetClaimProtocol were learned from.
	// +optional
	TargetImage string `json:"targetImage,omitempty"`

	// ConfigHash is the hash of the rendered engine configuration on the pod template.
	// +optional
	ConfigHash string `json:"configHash,omitempty"`

	// Replicas is the number of consumer pods the Deployment asks for.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// Selector is the label selector of the consumer pods, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`

	// ReplicasReady is the number of ready consumer pods.
	// +optional
	ReplicasReady int32 `json:"replicasReady,omitempty"`

	// Probe tracks the dry-run Jobs (`seqinbox migrate --dry-run` from the target image) that
	// learn the target's engine version and claim protocol and read the consumer registry
	// before a rollout.
	// +optional
	Probe *JobRunStatus `json:"probe,omitempty"`

	// Migration tracks the schema migration Jobs (`seqinbox migrate` from the target image).
	// +optional
	Migration *JobRunStatus `json:"migration,omitempty"`

	// Consumers summarises what the running consumers report to the operator: the lag, the
	// messages waiting in the buffer, the dead letters of the last hour and each pod's
	// partitions and blocked record. The operator reads the consumers every few seconds but
	// writes this at most every 30 seconds, and only when a value moved beyond a small band.
	// Absent while no consumer runs, and for an image whose consumers serve no state (see the
	// ConsumerStateServed condition).
	// +optional
	Consumers *ConsumersStatus `json:"consumers,omitempty"`
}

// ConsumersStatus is what the running consumers last reported, summarised for the inbox and per
// consumer pod. The counts are read from the consumers, never from the database.
type ConsumersStatus struct {
	// UpdatedAt is when the operator last wrote this summary.
	UpdatedAt metav1.Time `json:"updatedAt"`

	// Lag is the records not processed yet, summed over every partition the consumers hold.
	Lag int64 `json:"lag"`

	// WaitingMessages is the messages WAITING for their predecessors, database-wide, as the
	// consumer that leads housekeeping counts them; absent while no consumer leads it.
	// +optional
	WaitingMessages *int64 `json:"waitingMessages,omitempty"`

	// OldestWaitingSince is about when the oldest WAITING message arrived; absent while none waits.
	// +optional
	OldestWaitingSince *metav1.Time `json:"oldestWaitingSince,omitempty"`

	// InstancesExpiringSoon is the open sequence instances whose retention ends within
	// spec.housekeeping's window, database-wide; absent while no consumer leads housekeeping.
	// +optional
	InstancesExpiringSoon *int64 `json:"instancesExpiringSoon,omitempty"`

	// WaitingByType is WaitingMessages by qualified message type, with when the oldest of each
	// type arrived: the MaxWaitingTypes types with the most waiting messages, most first (the
	// rest count in WaitingMessages only). Absent while no consumer leads housekeeping or none waits.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=10
	WaitingByType []WaitingTypeStatus `json:"waitingByType,omitempty"`

	// DeadLettersLastHour is the records the running consumers dead-lettered in the last hour
	// (since they started, when that is less).
	DeadLettersLastHour int64 `json:"deadLettersLastHour"`

	// DeadLettersLastHourByReason is DeadLettersLastHour by dead-letter reason (docs/dead-letters.md
	// lists them), most first; only reasons with letters, at most MaxDeadLetterReasons.
	// +optional
	// +listType=map
	// +listMapKey=reason
	// +kubebuilder:validation:MaxItems=32
	DeadLettersLastHourByReason []DeadLetterReasonCount `json:"deadLettersLastHourByReason,omitempty"`

	// Pods is what each consumer pod reported.
	// +optional
	// +listType=map
	// +listMapKey=name
	Pods []ConsumerPodStatus `json:"pods,omitempty"`
}

// MaxWaitingTypes is how many message types status.consumers.waitingByType lists: enough for
// the types that hold a buffer, few enough for one screen and a small status.
const MaxWaitingTypes = 10

// MaxDeadLetterReasons bounds status.consumers.deadLettersLastHourByReason; every reason of this
// release fits.
const MaxDeadLetterReasons = 32

// WaitingTypeStatus is the WAITING messages of one qualified type.
type WaitingTypeStatus struct {
	// Type is the qualified message type (type.subtype for a subtyped one).
	Type string `json:"type"`

	// Count is the messages of the type WAITING for their predecessors, database-wide.
	Count int64 `json:"count"`

	// OldestSince is about when the oldest of them arrived; absent from consumers of earlier releases.
	// +optional
	OldestSince *metav1.Time `json:"oldestSince,omitempty"`
}

// DeadLetterReasonCount is the dead letters of one reason.
type DeadLetterReasonCount struct {
	// Reason is the dead-letter reason, header seqinbox-dlq-reason (InvalidJSON, ListenerFailed, ...).
	Reason string `json:"reason"`

	// Count is the records the running consumers dead-lettered for it in the last hour.
	Count int64 `json:"count"`
}

// ConsumerPodStatus is what one consumer pod reported.
type ConsumerPodStatus struct {
	// Name is the pod's name, which is also the consumer's instance ID.
	Name string `json:"name"`

	// Ready is the consumer's own readiness; Reason says why it is not ready.
	Ready bool `json:"ready"`

	// Reason says why the consumer is not ready.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`

	// Partitions lists the partitions the consumer holds, per topic: `orders[0,3] refunds[1]`.
	// +optional
	Partitions string `json:"partitions,omitempty"`

	// Lag is the records not processed yet on the consumer's partitions.
	Lag int64 `json:"lag"`

	// Blocked is the record the consumer has retried longest after infrastructure errors;
	// absent while it retries none. The inbox is Degraded (PartitionBlocked) once a record is
	// retried for longer than five minutes.
	// +optional
	Blocked *BlockedRecord `json:"blocked,omitempty"`

	// Unreachable says why the operator could not read the consumer's state at its last try;
	// the rest of the entry is then from the last read that succeeded, if any.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Unreachable string `json:"unreachable,omitempty"`
}

// BlockedRecord is a record a consumer retries after infrastructure errors; the records behind
// it on its partition wait, and its offset is not committed.
type BlockedRecord struct {
	// Topic and Partition name the partition the record holds back.
	Topic string `json:"topic"`
	// Partition is the record's partition of Topic.
	Partition int32 `json:"partition"`
	// Offset is the record's offset.
	Offset int64 `json:"offset"`
	// Since is the record's first failed attempt.
	Since metav1.Time `json:"since"`
	// Error is the last attempt's error (never the record's payload).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Error string `json:"error,omitempty"`
}

// JobRunStatus tracks the Jobs that the operator runs from the target image for one purpose, so
// that retries survive operator restarts: every attempt is a new Job, named after Key and Attempt.
type JobRunStatus struct {
	// Key identifies what the Jobs run for: a hash of the image (probe) or of the image and the
	// spec generation (migration). A new Key starts again at attempt 1.
	Key string `json:"key"`

	// Attempt numbers the current Job of Key, starting at 1.
	// +kubebuilder:validation:Minimum=1
	Attempt int32 `json:"attempt"`

	// JobName is the Job of the current attempt.
	// +optional
	JobName string `json:"jobName,omitempty"`

	// Succeeded is true when the Job of the current attempt completed successfully.
	// +optional
	Succeeded bool `json:"succeeded,omitempty"`

	// Failures counts the consecutive failed attempts; the wait before the next attempt doubles
	// with each.
	// +optional
	Failures int32 `json:"failures,omitempty"`

	// RetryAfter is the earliest time the Job of the current attempt may be created.
	// +optional
	RetryAfter *metav1.Time `json:"retryAfter,omitempty"`

	// LastFailure describes the last failed attempt: the Job's reason and the container's message.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	LastFailure string `json:"lastFailure,omitempty"`

	// LastFailureReason is the condition reason of the last failed attempt when the failure has
	// one of its own (DatabaseInUse); empty for any other failure.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	LastFailureReason string `json:"lastFailureReason,omitempty"`
}

// SequentialInbox runs a Kafka consumer that hands each logical message once, in sequence order,
// to the team's HTTP service.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 40 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label of at most 40 characters: it names the consumer Deployment, the metrics Service and the Jobs"
// +kubebuilder:resource:shortName=sqi,categories=seqinbox
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicasReady`
// +kubebuilder:printcolumn:name="Schema",type=integer,JSONPath=`.status.schemaVersion`
// +kubebuilder:printcolumn:name="Running",type=string,JSONPath=`.status.runningEngineVersion`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.status.targetEngineVersion`
// +kubebuilder:printcolumn:name="Lag",type=integer,JSONPath=`.status.consumers.lag`
// +kubebuilder:printcolumn:name="Waiting",type=integer,JSONPath=`.status.consumers.waitingMessages`
// +kubebuilder:printcolumn:name="Oldest-Waiting",type=date,JSONPath=`.status.consumers.oldestWaitingSince`,priority=1
// +kubebuilder:printcolumn:name="Dead-Letters",type=integer,JSONPath=`.status.consumers.deadLettersLastHour`,priority=1
// +kubebuilder:printcolumn:name="Blocked",type=string,JSONPath=`.status.conditions[?(@.type=="RolloutBlocked")].status`,priority=1
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=="ConfigValid")].status`,priority=1
// +kubebuilder:printcolumn:name="Schema-Ready",type=string,JSONPath=`.status.conditions[?(@.type=="SchemaReady")].status`,priority=1
// +kubebuilder:printcolumn:name="Progressing",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].status`,priority=1
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].status`,priority=1
// +kubebuilder:printcolumn:name="Protocol",type=string,JSONPath=`.status.runningClaimProtocol`,priority=1
// +kubebuilder:printcolumn:name="Target-Protocol",type=string,JSONPath=`.status.targetClaimProtocol`,priority=1
// +kubebuilder:printcolumn:name="Observed",type=integer,JSONPath=`.status.observedGeneration`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SequentialInbox struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec SequentialInboxSpec `json:"spec"`
	// +optional
	Status SequentialInboxStatus `json:"status,omitempty"`
}

// SequentialInboxList is a list of SequentialInbox, required by the API machinery.
// +kubebuilder:object:root=true
type SequentialInboxList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SequentialInbox `json:"items"`
}
