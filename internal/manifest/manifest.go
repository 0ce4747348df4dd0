// Package manifest loads a SequentialInbox from the YAML file a user applies with kubectl, so that
// `seqinbox consume -f inbox.yaml` runs outside Kubernetes with exactly the configuration the API
// server would have stored: the file is checked with the CRD's own schema and CEL rules (every
// error with its field path, unknown fields too) and the CRD defaults are applied.
package manifest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// Load reads the SequentialInbox from a YAML file (which may hold other documents, such as the
// Secrets it references; they are skipped), rejects what the API server would refuse, and applies
// the CRD defaults.
func Load(path string) (*v1alpha1.SequentialInbox, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	inbox, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", path, err)
	}
	return inbox, nil
}

// Parse decodes the one SequentialInbox of a (multi-document) YAML stream and applies the CRD
// defaults; Load is its file-reading wrapper.
func Parse(data []byte) (*v1alpha1.SequentialInbox, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var found *v1alpha1.SequentialInbox
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &meta); err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		if meta.Kind != "SequentialInbox" {
			continue
		}
		if meta.APIVersion != v1alpha1.GroupVersion.String() {
			return nil, fmt.Errorf("document %d: apiVersion %q: this build reads %s", doc, meta.APIVersion, v1alpha1.GroupVersion)
		}
		if found != nil {
			return nil, fmt.Errorf("document %d: a second SequentialInbox; a consumer runs exactly one", doc)
		}
		errs, err := validateAsTheAPIServer(context.Background(), raw)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", doc, err)
		}
		var inbox v1alpha1.SequentialInbox
		decodeErr := yaml.Unmarshal(raw, &inbox)
		if len(errs) > 0 {
			return nil, fmt.Errorf("document %d (SequentialInbox %s): %w", doc, inbox.Name, utilerrors.NewAggregate(errs))
		}
		if decodeErr != nil {
			return nil, fmt.Errorf("document %d (SequentialInbox %s): %w", doc, inbox.Name, decodeErr)
		}
		found = &inbox
	}
	if found == nil {
		return nil, fmt.Errorf("no SequentialInbox (apiVersion %s) in the manifest", v1alpha1.GroupVersion)
	}
	Default(&found.Spec)
	return found, nil
}

// The CRD defaults (the +kubebuilder:default markers of api/v1alpha1); TestDefaultsMatchTheCRD
// proves they equal what the API server applies from config/crd/bases.
const (
	defaultMaxPollIntervalMs = 300000
	defaultSessionTimeoutMs  = 10000
	defaultHeartbeatMs       = 1000
	defaultPoolSize          = 10
	defaultIdleLockTimeout   = 30 * time.Second
	defaultSinkTimeout       = 10 * time.Second
	defaultSinkRetries       = 3
	defaultInitialBackoff    = 200 * time.Millisecond
	defaultHousekeeping      = 5 * time.Minute
	defaultExpiryDelay       = time.Hour
	defaultBatchSize         = 500
	defaultMaxDuration       = time.Minute
	defaultReplicas          = 1
)

// Default applies the defaults that the API server applies from the CRD schema, in place, so a
// spec read from a file equals the one a consumer pod would get from the cluster. A typed spec
// cannot tell an absent field from an explicit zero: an explicit zero duration (which would mean
// "no time at all") is treated as unset; every other defaulted field's zero is outside its CRD
// range or the field is a pointer.
func Default(spec *v1alpha1.SequentialInboxSpec) {
	if spec.Kafka.MaxPollIntervalMs == 0 {
		spec.Kafka.MaxPollIntervalMs = defaultMaxPollIntervalMs
	}
	if spec.Kafka.SessionTimeoutMs == 0 {
		spec.Kafka.SessionTimeoutMs = defaultSessionTimeoutMs
	}
	if spec.Kafka.HeartbeatIntervalMs == 0 {
		spec.Kafka.HeartbeatIntervalMs = defaultHeartbeatMs
	}
	if spec.Database.PoolSize == 0 {
		spec.Database.PoolSize = defaultPoolSize
	}
	defaultDuration(&spec.Database.IdleLockTimeout, defaultIdleLockTimeout)
	defaultDuration(&spec.Sink.Timeout, defaultSinkTimeout)
	if spec.Sink.Retries == nil {
		retries := int32(defaultSinkRetries)
		spec.Sink.Retries = &retries
	}
	defaultDuration(&spec.Sink.InitialBackoff, defaultInitialBackoff)
	defaultDuration(&spec.Housekeeping.Interval, defaultHousekeeping)
	defaultDuration(&spec.Housekeeping.ExpiryDelay, defaultExpiryDelay)
	if spec.Housekeeping.BatchSize == 0 {
		spec.Housekeeping.BatchSize = defaultBatchSize
	}
	defaultDuration(&spec.Housekeeping.MaxDuration, defaultMaxDuration)
	if spec.Replicas == nil {
		replicas := int32(defaultReplicas)
		spec.Replicas = &replicas
	}
	if spec.UpgradeStrategy == "" {
		spec.UpgradeStrategy = v1alpha1.UpgradeAutomatic
	}
}

// DeadLetterTopic returns the spec's dead-letter topic, or "<consumerGroup>.dlq" when unset (the
// documented default, which the CRD cannot express because it depends on another field).
func DeadLetterTopic(spec *v1alpha1.SequentialInboxSpec) string {
	if spec.DeadLetterTopic != "" {
		return spec.DeadLetterTopic
	}
	return spec.Kafka.ConsumerGroup + ".dlq"
}

// SinkURL returns where released messages go: spec.sink.url, or the URL of spec.sink.service,
// <scheme>://<name>.<namespace>.svc:<port><path>, with the inbox's namespace, the scheme's port,
// https when spec.sink.tls is set, and / as the defaults.
func SinkURL(inbox *v1alpha1.SequentialInbox) string {
	sink := &inbox.Spec.Sink
	svc := sink.Service
	if svc == nil {
		return sink.URL
	}
	scheme := svc.Scheme
	if scheme == "" {
		scheme = "http"
		if sink.TLS != nil {
			scheme = "https"
		}
	}
	namespace := svc.Namespace
	if namespace == "" {
		namespace = inbox.Namespace
	}
	port := svc.Port
	if port == 0 {
		port = 80
		if scheme == "https" {
			port = 443
		}
	}
	path := svc.Path
	if path == "" {
		path = "/"
	}
	return fmt.Sprintf("%s://%s.%s.svc:%d%s", scheme, svc.Name, namespace, port, path)
}

// GroupProtocol is the only group protocol the consumers of an inbox announce when they join the
// Kafka consumer group: "seqinbox-<claimProtocol>", with "-epoch<N>" for spec.kafka.groupProtocolEpoch
// N > 0. The broker refuses a member that supports none of the group's protocols, so consumers of
// another claim protocol or epoch, and clients with the ordinary range or cooperative-sticky
// assignors, never share a group generation with these. The engine version is not part of it: a
// compatible upgrade keeps the name and rolls as usual.
func GroupProtocol(claimProtocol string, kafka *v1alpha1.KafkaSpec) string {
	name := "seqinbox-" + claimProtocol
	if kafka.GroupProtocolEpoch > 0 {
		name += fmt.Sprintf("-epoch%d", kafka.GroupProtocolEpoch)
	}
	return name
}

// defaultDuration fills in an unset duration; a malformed one stays, for validation to report.
func defaultDuration(d *v1alpha1.Duration, def time.Duration) {
	if _, malformed := d.Malformed(); d.Duration == 0 && !malformed {
		d.Duration = def
	}
}

// InboxName is how the database records the inbox that owns its tables (migrations.OwnerTable):
// namespace/name, with the namespace "default" for a manifest that names none, as kubectl would
// apply it. The operator's migrate Job and the consumers use it, so both name an inbox alike.
func InboxName(inbox *v1alpha1.SequentialInbox) string {
	namespace := inbox.Namespace
	if namespace == "" {
		namespace = "default"
	}
	return namespace + "/" + inbox.Name
}
