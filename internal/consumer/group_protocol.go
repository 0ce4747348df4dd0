package consumer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/kafkaauth"
	"github.com/seqinbox/seqinbox/internal/version"
)

// The broker is the last of the three fences that keep consumers of different claim semantics apart
// (docs/design.md#broker-group-protocol). A consumer announces exactly one group protocol, named
// after its claim protocol (manifest.GroupProtocol), and assigns partitions with franz-go's
// cooperative-sticky balancer under that name. The broker refuses a joining member that supports
// none of the protocols every member of the group supports (INCONSISTENT_GROUP_PROTOCOL), so
// whoever holds the group keeps it: a consumer of another claim protocol, or any client with the
// ordinary assignors (range, cooperative-sticky, ...), never shares a generation with ours. While
// refused, the consumer stays not ready, reports who holds the group, and franz-go retries the join
// with its backoff (250ms doubling to 5s); it consumes as soon as the holders left.

// build is what a consumer speaks: its engine version and claim protocol.
type build struct {
	engineVersion, claimProtocol string
}

// thisBuild is what this binary speaks.
func thisBuild() build {
	return build{engineVersion: version.Version, claimProtocol: inbox.ClaimProtocol}
}

// claimBalancer is franz-go's cooperative-sticky balancer announced under the inbox's group
// protocol name: the broker sees only the name, the assignment is cooperative-sticky.
type claimBalancer struct {
	kgo.GroupBalancer
	name string
}

// ProtocolName implements kgo.GroupBalancer.
func (b claimBalancer) ProtocolName() string { return b.name }

// groupHolder is a member of the consumer group that holds it while the broker refuses this
// consumer: who to look for when a consumer stays not ready.
type groupHolder struct {
	MemberID, ClientID, Host string
	// Protocol is the group protocol the holders agreed on (for example range or
	// cooperative-sticky, or seqinbox-<claim protocol> of another seqinbox build).
	Protocol string
}

// String names the member for a person: "member (client c, host h, protocol p)".
func (h groupHolder) String() string {
	return fmt.Sprintf("%s (client %s, host %s, protocol %s)", h.MemberID, h.ClientID, h.Host, h.Protocol)
}

// groupMembership is what a consumer knows about its place in the Kafka consumer group: joined,
// or refused and held by whom. Readiness and the metrics read it.
type groupMembership struct {
	group, protocol string
	log             logr.Logger
	clock           clock.PassiveClock
	// admin describes the group after a refusal; changed is called after every change.
	admin   *kadm.Client
	changed func()

	refusals *prometheus.CounterVec
	holders  *prometheus.GaugeVec
	// kafka is how the consumer connects; auth notices the brokers refusing its credentials.
	kafka *v1alpha1.KafkaSpec
	auth  kafkaauth.RefusalWatch

	mu sync.Mutex
	// joined is true from a completed join until the next group error or the session's end.
	joined bool
	// refusedSince is when the first of the current run of refusals happened (zero: not refused).
	refusedSince time.Time
	// held lists the members that held the group at the last refusal; describeErr is why they
	// are unknown.
	held        []groupHolder
	describeErr error
	// lastErr is the last group error other than a refusal.
	lastErr error
	// unreachable is the last failed dial of a broker, until a dial succeeds (nil: none failed).
	unreachable *brokerDialError
}

// brokerDialError is a failed connection to a broker: where, why and since when.
type brokerDialError struct {
	addr  string
	err   error
	since time.Time
}

func newGroupMembership(kafka *v1alpha1.KafkaSpec, protocol string, clk clock.PassiveClock, log logr.Logger) *groupMembership {
	return &groupMembership{
		group: kafka.ConsumerGroup, protocol: protocol, kafka: kafka, clock: clk, log: log, changed: func() {},
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_consumer_group_join_refusals_total",
			Help: "Joins the broker refused because members of another group protocol hold the consumer group (INCONSISTENT_GROUP_PROTOCOL).",
		}, []string{"group", "protocol"}),
		holders: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seqinbox_consumer_group_foreign_member",
			Help: "1 for each member of another group protocol that holds the consumer group while the broker refuses this consumer; no series while it is in the group.",
		}, []string{"group", "member_id", "client_id", "host", "protocol"}),
	}
}

func (m *groupMembership) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.refusals, m.holders}
}

// options are the franz-go group options that announce the inbox's group protocol and report
// refused joins and refused credentials.
func (m *groupMembership) options(instanceID string) []kgo.Opt {
	return []kgo.Opt{
		kgo.Balancers(claimBalancer{GroupBalancer: kgo.CooperativeStickyBalancer(), name: m.protocol}),
		// The holders a refused consumer reports, and the operator's condition, name this.
		kgo.ClientID("seqinbox-" + instanceID),
		kgo.WithHooks(m, &m.auth),
	}
}

// ready reports whether the consumer is a member of the group, or why not.
func (m *groupMembership) ready() (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	refused := m.auth.Refused()
	switch {
	case m.joined:
		return true, ""
	case refused != nil:
		return false, kafkaauth.Refusal(m.kafka, refused)
	case m.unreachable != nil:
		u := m.unreachable
		return false, fmt.Sprintf("cannot reach Kafka broker %s since %s: %v; retrying (check spec.kafka.bootstrapServers, or --bootstrap-servers outside Kubernetes)",
			u.addr, u.since.UTC().Format(time.RFC3339), u.err)
	case !m.refusedSince.IsZero():
		return false, m.refusalLocked()
	case m.lastErr != nil:
		return false, fmt.Sprintf("not in Kafka consumer group %s: %v; rejoining", m.group, m.lastErr)
	}
	return false, fmt.Sprintf("joining Kafka consumer group %s", m.group)
}

// refusalLocked says who holds the group, for readiness and the log.
func (m *groupMembership) refusalLocked() string {
	prefix := fmt.Sprintf("the Kafka broker refuses this consumer in group %s since %s: it announces only group protocol %s",
		m.group, m.refusedSince.UTC().Format(time.RFC3339), m.protocol)
	switch {
	case m.describeErr != nil:
		return fmt.Sprintf("%s, and describing who holds the group failed: %v; retrying the join", prefix, m.describeErr)
	case len(m.held) == 0:
		return prefix + ", and the members that held the group left; retrying the join"
	}
	return fmt.Sprintf("%s, and %d member(s) of another group protocol hold it: %s; retrying the join until they leave",
		prefix, len(m.held), strings.Join(holderNames(m.held), ", "))
}

// OnBrokerConnect implements kgo.HookBrokerConnect: a failed dial makes the consumer not ready
// with the broker and the error, logged once per outage; the next successful dial ends it.
func (m *groupMembership) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	m.mu.Lock()
	first := m.unreachable == nil
	switch {
	case err != nil && first:
		m.unreachable = &brokerDialError{addr: addr, err: err, since: m.clock.Now()}
	case err != nil:
		m.unreachable.addr, m.unreachable.err = addr, err
	case first:
		m.mu.Unlock()
		return
	default:
		since := m.unreachable.since
		m.unreachable = nil
		m.mu.Unlock()
		m.log.Info("reached the Kafka brokers again", "broker", addr, "unreachableFor", m.clock.Now().Sub(since).Round(time.Millisecond).String())
		m.changed()
		return
	}
	m.mu.Unlock()
	if first {
		m.log.Error(err, "cannot reach a Kafka broker; not consuming, retrying", "broker", addr, "group", m.group)
	}
	m.changed()
}

// OnGroupManageError implements kgo.HookGroupManageError: franz-go calls it on its group
// management goroutine after a failed join or a lost membership, before it backs off and rejoins.
func (m *groupMembership) OnGroupManageError(err error) {
	m.auth.Note(err)
	if !errors.Is(err, kerr.InconsistentGroupProtocol) {
		m.mu.Lock()
		m.joined, m.lastErr = false, err
		m.mu.Unlock()
		m.changed()
		return
	}
	m.refusals.WithLabelValues(m.group, m.protocol).Inc()
	held, describeErr := m.describe()
	m.mu.Lock()
	first := m.refusedSince.IsZero()
	if first {
		m.refusedSince = m.clock.Now()
	}
	news := first || (describeErr == nil) != (m.describeErr == nil) || !slices.Equal(held, m.held)
	m.joined, m.lastErr, m.held, m.describeErr = false, nil, held, describeErr
	reason := m.refusalLocked()
	m.mu.Unlock()
	m.exportHolders(held)
	if news {
		m.log.Info("not consuming: "+reason, "group", m.group, "groupProtocol", m.protocol, "holders", holderNames(held))
	}
	m.changed()
}

// joinedGroup records a completed join (franz-go calls OnPartitionsAssigned after every one).
func (m *groupMembership) joinedGroup() {
	m.mu.Lock()
	if m.joined {
		m.mu.Unlock()
		return
	}
	refusedSince := m.refusedSince
	m.joined, m.lastErr, m.refusedSince, m.held, m.describeErr = true, nil, time.Time{}, nil, nil
	m.mu.Unlock()
	m.auth.Reset()
	m.holders.Reset()
	if !refusedSince.IsZero() {
		m.log.Info("joined the Kafka consumer group: the members of another group protocol left",
			"group", m.group, "groupProtocol", m.protocol, "refusedFor", m.clock.Now().Sub(refusedSince).Round(time.Millisecond).String())
	}
	m.changed()
}

// reset forgets the previous session's membership: a new session joins anew.
func (m *groupMembership) reset() {
	m.mu.Lock()
	m.joined, m.lastErr, m.refusedSince, m.held, m.describeErr = false, nil, time.Time{}, nil, nil
	m.mu.Unlock()
	m.auth.Reset()
	m.holders.Reset()
	m.changed()
}

// describeTimeout bounds the description of the group after a refusal.
const describeTimeout = 5 * time.Second

// describe lists the members that hold the group.
func (m *groupMembership) describe() ([]groupHolder, error) {
	if m.admin == nil {
		return nil, errors.New("no admin client")
	}
	ctx, cancel := context.WithTimeout(context.Background(), describeTimeout)
	defer cancel()
	described, err := m.admin.DescribeGroups(ctx, m.group)
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", m.group, err)
	}
	g, ok := described[m.group]
	if !ok {
		return nil, nil
	}
	if g.Err != nil {
		return nil, fmt.Errorf("describe group %s: %w", m.group, g.Err)
	}
	held := make([]groupHolder, len(g.Members))
	for i, member := range g.Members {
		held[i] = groupHolder{MemberID: member.MemberID, ClientID: member.ClientID, Host: member.ClientHost, Protocol: g.Protocol}
	}
	return held, nil
}

func (m *groupMembership) exportHolders(held []groupHolder) {
	m.holders.Reset()
	for _, h := range held {
		m.holders.WithLabelValues(m.group, h.MemberID, h.ClientID, h.Host, h.Protocol).Set(1)
	}
}

func holderNames(held []groupHolder) []string {
	names := make([]string, len(held))
	for i, h := range held {
		names[i] = h.String()
	}
	return names
}
