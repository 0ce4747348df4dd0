package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/kafkaauth"
)

// KafkaConnection is how the operator reaches an inbox's brokers: the bootstrap servers and,
// from the inbox's Secrets, TLS and SASL.
type KafkaConnection struct {
	Bootstrap []string
	TLS       *tls.Config
	SASL      sasl.Mechanism
}

// GroupInspector lists the members of a Kafka consumer group: the rollout gate waits until the
// old consumers left the group, and members of another group protocol that keep the consumers
// out are named in the Degraded condition. It also counts the partitions of topics, which cap the
// consumers worth running. It is the reconciler's only view of Kafka.
type GroupInspector interface {
	GroupMembers(ctx context.Context, conn KafkaConnection, group string) ([]GroupMember, error)
	TopicPartitions(ctx context.Context, conn KafkaConnection, topics []string) (map[string]int32, error)
}

// GroupMember is a member of a Kafka consumer group, as a condition names it.
type GroupMember struct {
	ID, ClientID, Host string
	// Protocol is the group protocol the member takes part in: the protocol a classic group
	// chose (range, cooperative-sticky, seqinbox-<claim protocol>, ...; empty while the group
	// rebalances), or "consumer/<assignor>" in a KIP-848 group.
	Protocol string
}

// String names the member for a person: "id (client c, host h, protocol p)".
func (m GroupMember) String() string {
	protocol := m.Protocol
	if protocol == "" {
		protocol = "not chosen yet"
	}
	return fmt.Sprintf("%s (client %s, host %s, protocol %s)", m.ID, m.ClientID, m.Host, protocol)
}

func describeMembers(members []GroupMember) string {
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.String()
	}
	return strings.Join(names, ", ")
}

// KafkaGroups is the GroupInspector over franz-go's admin client; it describes classic groups
// and, where the brokers support KIP-848, consumer-protocol groups.
type KafkaGroups struct {
	// Timeout bounds one inspection (connect, describe); zero means ten seconds.
	Timeout time.Duration
}

// GroupMembers returns every member of the group; a group that does not exist has none.
func (k KafkaGroups) GroupMembers(ctx context.Context, conn KafkaConnection, group string) ([]GroupMember, error) {
	return withAdmin(ctx, k, conn, func(ctx context.Context, adm *kadm.Client) ([]GroupMember, error) {
		return groupMembers(ctx, adm, group)
	})
}

// withAdmin runs read through an admin client of conn within the reader's timeout, and explains
// its error when the brokers refused the operator's credentials.
func withAdmin[T any](ctx context.Context, k KafkaGroups, conn KafkaConnection, read func(context.Context, *kadm.Client) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, k.timeout())
	defer cancel()
	adm, watch, err := adminClient(conn)
	if err != nil {
		var none T
		return none, err
	}
	defer adm.Close()
	v, err := read(ctx, adm)
	return v, watch.Explain(err)
}

// groupMembers lists the members of the group through adm.
func groupMembers(ctx context.Context, adm *kadm.Client, group string) ([]GroupMember, error) {
	// A group converted to KIP-848 may list a member through both APIs: each is named once.
	var members []GroupMember
	seen := map[string]bool{}
	add := func(m GroupMember) {
		if !seen[m.ID] {
			seen[m.ID] = true
			members = append(members, m)
		}
	}
	classic, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", group, err)
	}
	if g, ok := classic[group]; ok {
		if g.Err != nil && !errors.Is(g.Err, kerr.GroupIDNotFound) {
			return nil, fmt.Errorf("describe group %s: %w", group, g.Err)
		}
		for _, m := range g.Members {
			add(GroupMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Protocol: g.Protocol})
		}
	}
	supported, err := supportsConsumerGroups(ctx, adm)
	if err != nil || !supported {
		return members, err
	}
	next, err := adm.DescribeConsumerGroups(ctx, group)
	if err != nil {
		return nil, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	if g, ok := next[group]; ok {
		if g.Err != nil && !errors.Is(g.Err, kerr.GroupIDNotFound) {
			return nil, fmt.Errorf("describe consumer group %s: %w", group, g.Err)
		}
		for _, m := range g.Members {
			add(GroupMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Protocol: "consumer/" + g.AssignorName})
		}
	}
	return members, nil
}

// timeout bounds one inspection.
func (k KafkaGroups) timeout() time.Duration {
	if k.Timeout == 0 {
		return 10 * time.Second
	}
	return k.Timeout
}

// adminClient connects to the brokers of conn as the operator; Close releases it. The watch
// explains an error of a client whose credentials the brokers refused.
func adminClient(conn KafkaConnection) (*kadm.Client, *kafkaauth.RefusalWatch, error) {
	watch := &kafkaauth.RefusalWatch{}
	opts := []kgo.Opt{kgo.SeedBrokers(conn.Bootstrap...), kgo.ClientID("seqinbox-operator"), kgo.WithHooks(watch)}
	if conn.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(conn.TLS))
	}
	if conn.SASL != nil {
		opts = append(opts, kgo.SASL(conn.SASL))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client for %v: %w", conn.Bootstrap, err)
	}
	return kadm.NewClient(cl), watch, nil
}

// supportsConsumerGroups reports whether every broker answers KIP-848's ConsumerGroupDescribe.
func supportsConsumerGroups(ctx context.Context, adm *kadm.Client) (bool, error) {
	versions, err := adm.ApiVersions(ctx)
	if err != nil {
		return false, fmt.Errorf("api versions: %w", err)
	}
	supported := len(versions) > 0
	versions.Each(func(v kadm.BrokerApiVersions) {
		if _, ok := v.KeyMaxVersion(int16(kmsg.ConsumerGroupDescribe)); v.Err != nil || !ok {
			supported = false
		}
	})
	return supported, nil
}

// kafkaConnection builds the connection of an inbox, reading its TLS and SASL Secrets (get only,
// without a cache: the operator keeps no Secret in memory).
func (r *Reconciler) kafkaConnection(ctx context.Context, inbox *v1alpha1.SequentialInbox) (KafkaConnection, error) {
	spec := &inbox.Spec.Kafka
	conn := KafkaConnection{Bootstrap: spec.BootstrapServers}
	var m kafkaauth.Material
	read := func(ref corev1.SecretKeySelector, into *[]byte) error {
		value, err := r.secretValue(ctx, inbox.Namespace, ref)
		*into = value
		return err
	}
	if t := spec.TLS; t != nil {
		if t.CASecretRef != nil {
			if err := read(*t.CASecretRef, &m.CA); err != nil {
				return conn, err
			}
		}
		if c := t.ClientCertificate; c != nil {
			certRef, keyRef := kafkaauth.ClientCertificateRefs(c)
			if err := read(certRef, &m.Certificate); err != nil {
				return conn, err
			}
			if err := read(keyRef, &m.PrivateKey); err != nil {
				return conn, err
			}
		}
	}
	if s := spec.SASL; s != nil {
		m.Username = s.Username
		if s.UsernameSecretRef != nil {
			var user []byte
			if err := read(*s.UsernameSecretRef, &user); err != nil {
				return conn, err
			}
			m.Username = string(user)
		}
		var pass []byte
		if err := read(s.PasswordSecretRef, &pass); err != nil {
			return conn, err
		}
		m.Password = string(pass)
	}
	var err error
	conn.TLS, conn.SASL, err = kafkaauth.Build(spec, m)
	return conn, err
}

// secretValue reads one key of a Secret in the inbox's namespace.
func (r *Reconciler) secretValue(ctx context.Context, namespace string, ref corev1.SecretKeySelector) ([]byte, error) {
	var secret corev1.Secret
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, &secret); err != nil {
		return nil, fmt.Errorf("read secret %s: %w", ref.Name, err)
	}
	value, ok := secret.Data[ref.Key]
	if !ok {
		return nil, fmt.Errorf("secret %s has no key %s", ref.Name, ref.Key)
	}
	return value, nil
}
