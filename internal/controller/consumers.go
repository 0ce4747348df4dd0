package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/consumerstate"
)

// What the running consumers know (their partitions and lag, a record they retry, the
// housekeeping leader's database-wide counts) the operator reads from the consumers themselves,
// as CloudNativePG's operator reads its instance managers: each consumer pod serves its state
// over HTTPS on the state port (internal/consumerstate), with a certificate and a token that the
// operator generated for the inbox and keeps in a Secret mounted into the pods. No pod is started
// to ask, and the operator never talks SQL. The operator reads every consumer pod of a running
// inbox every StatePollInterval; a record retried for longer than BlockedThreshold is named in
// Degraded (PartitionBlocked) at once, while the summary in status.consumers is written at most
// every StatusWriteInterval, and only when a value moved beyond its band (summaryMoved).

// stateReadTimeout bounds the read of one consumer's state.
const stateReadTimeout = 3 * time.Second

// consumerReads are the operator's in-memory record of what it last read from the consumers of
// each inbox: when, with which credentials, and each pod's last state. It bounds the reads to
// one per StatePollInterval per inbox whatever the rate of reconcile passes; lost on a restart,
// it is read anew.
type consumerReads struct {
	mu      sync.Mutex
	inboxes map[types.NamespacedName]*inboxReads
}

// inboxReads is what the operator last read from the consumers of one inbox.
type inboxReads struct {
	// client holds the inbox's credentials; nil until read from the Secret, and again after a
	// consumer refused them.
	client *consumerstate.Client
	readAt time.Time
	pods   map[string]*podRead
}

// podRead is the last read of one consumer pod: the state of the last successful read, and the
// error of the last read when it failed.
type podRead struct {
	state  *consumerstate.State
	readAt time.Time
	err    error
}

// forget drops what was read from an inbox's consumers (stopped or deleted).
func (c *consumerReads) forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.inboxes[key]; in != nil && in.client != nil {
		in.client.Close()
	}
	delete(c.inboxes, key)
}

// of returns the record of one inbox, creating it.
func (c *consumerReads) of(key types.NamespacedName) *inboxReads {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inboxes == nil {
		c.inboxes = map[types.NamespacedName]*inboxReads{}
	}
	in := c.inboxes[key]
	if in == nil {
		in = &inboxReads{pods: map[string]*podRead{}}
		c.inboxes[key] = in
	}
	return in
}

// readConsumers reads the state of the running consumers (once per StatePollInterval, and at
// once when a new pod runs),
// names their blocked records in Degraded and writes the summary. It never stops the pass: a
// consumer that cannot be read is named in the summary, and its last state stands for a while.
func (r *Reconciler) readConsumers(ctx context.Context, s *scope) (phaseResult, error) {
	key := client.ObjectKeyFromObject(s.inbox)
	if desiredReplicas(s.deployment) == 0 && len(s.consumerPods) == 0 {
		r.reads.forget(key)
		s.inbox.Status.Consumers = nil
		return proceed, nil
	}
	s.recheckAfter(r.StatePollInterval)
	in := r.reads.of(key)
	if s.now.Sub(in.readAt) >= r.StatePollInterval || unread(in, s.consumerPods) {
		if err := r.readPods(ctx, s, in); err != nil {
			return proceed, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(in.pods)) {
		if st := in.pods[name].state; st != nil && st.Blocked != nil && s.now.Sub(st.Blocked.Since) > r.BlockedThreshold {
			s.problem(v1alpha1.PartitionBlockedReason, blockedMessage(name, *st.Blocked, r.BlockedThreshold))
		}
	}
	summary := summarizeConsumers(in, s.now)
	if old := s.inbox.Status.Consumers; old == nil || s.now.Sub(old.UpdatedAt.Time) >= r.StatusWriteInterval && summaryMoved(old, summary) {
		s.inbox.Status.Consumers = summary
	}
	return proceed, nil
}

// readPods reads every consumer pod that runs, all at once, and forgets the pods that are gone.
// A pod whose read fails keeps its last state for staleAfter reads.
func (r *Reconciler) readPods(ctx context.Context, s *scope, in *inboxReads) error {
	if in.client == nil {
		c, err := r.stateClient(ctx, s.inbox)
		if err != nil {
			return err
		}
		in.client = c
	}
	in.readAt = s.now
	current := map[string]bool{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	refused := false
	for i := range s.consumerPods {
		pod := &s.consumerPods[i]
		addr, ok := stateAddress(pod)
		if !ok {
			continue
		}
		current[pod.Name] = true
		pr := in.pods[pod.Name]
		if pr == nil {
			pr = &podRead{}
			in.pods[pod.Name] = pr
		}
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, stateReadTimeout)
			defer cancel()
			st, err := in.client.Get(rctx, addr)
			mu.Lock()
			defer mu.Unlock()
			pr.err = err
			switch {
			case err == nil:
				pr.state, pr.readAt = &st, s.now
			case s.now.Sub(pr.readAt) > staleAfter*r.StatePollInterval:
				pr.state = nil
			}
			if errors.Is(err, consumerstate.ErrCredentials) {
				refused = true
			}
		})
	}
	wg.Wait()
	for name := range in.pods {
		if !current[name] {
			delete(in.pods, name)
		}
	}
	if refused {
		// A Secret that was replaced since it was read: read it again next time.
		in.client.Close()
		in.client = nil
	}
	for name, pr := range in.pods {
		if pr.err != nil {
			logf.FromContext(ctx).V(1).Info("cannot read a consumer's state", "pod", name, "error", pr.err.Error())
		}
	}
	return nil
}

// unread reports whether a running pod was never read: a new consumer is read at once.
func unread(in *inboxReads, pods []corev1.Pod) bool {
	for i := range pods {
		if _, ok := stateAddress(&pods[i]); ok && in.pods[pods[i].Name] == nil {
			return true
		}
	}
	return false
}

// staleAfter is how many poll intervals the last state of a pod that cannot be read stands.
const staleAfter = 3

// stateAddress is where a consumer pod serves its state: its IP and the container's state port.
// Pods not running yet or terminating are not read.
func stateAddress(pod *corev1.Pod) (string, bool) {
	if pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
		return "", false
	}
	port := int32(statePort)
	for _, c := range pod.Spec.Containers {
		if c.Name != consumerContainer {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == statePortName {
				port = p.ContainerPort
			}
		}
	}
	return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(port))), true
}

// stateClient builds the client of an inbox's consumers from its credentials Secret, read
// directly from the API server (the operator caches no Secret).
func (r *Reconciler) stateClient(ctx context.Context, inbox *v1alpha1.SequentialInbox) (*consumerstate.Client, error) {
	var secret corev1.Secret
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: inbox.Namespace, Name: stateSecretName(inbox)}, &secret); err != nil {
		return nil, fmt.Errorf("read consumer state credentials: %w", err)
	}
	c, err := consumerstate.NewClient(secret.Data, stateReadTimeout)
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", secret.Name, err)
	}
	return c, nil
}

// ensureStateCredentials creates the Secret of the credentials that the consumers serve their
// state with, once per inbox; it is owned by the inbox and never changes (delete it to make new
// ones: the operator creates them again, the pods' mounted files follow).
func (r *Reconciler) ensureStateCredentials(ctx context.Context, s *scope) error {
	name := stateSecretName(s.inbox)
	var existing corev1.Secret
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.inbox.Namespace, Name: name}, &existing)
	if err == nil || !apierrors.IsNotFound(err) {
		return client.IgnoreNotFound(err)
	}
	data, err := consumerstate.NewCredentials(s.now)
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.inbox.Namespace, Labels: objectLabels(s.inbox, componentConsumer),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(s.inbox, v1alpha1.GroupVersion.WithKind("SequentialInbox"))}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	if err := r.Client.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create consumer state credentials: %w", err)
	}
	r.reads.forget(client.ObjectKeyFromObject(s.inbox))
	return nil
}

// blockedMessage names the consumer, the partition, the offset, since when and why. It does not
// count the time, so that the condition does not change while the record stays blocked.
func blockedMessage(pod string, b consumerstate.Blocked, threshold time.Duration) string {
	return fmt.Sprintf("Consumer %s has retried the record at offset %d of partition %s[%d] since %s, for longer than %s: %s. "+
		"The records behind it on the partition wait, and its offset is not committed; see docs/troubleshooting.md.",
		pod, b.Offset, b.Topic, b.Partition, b.Since.UTC().Format(time.RFC3339), threshold, strings.TrimSuffix(b.Error, "."))
}

// summarizeConsumers builds the status summary from the pods' last states.
func summarizeConsumers(in *inboxReads, now time.Time) *v1alpha1.ConsumersStatus {
	sum := &v1alpha1.ConsumersStatus{UpdatedAt: metav1.NewTime(now), Pods: []v1alpha1.ConsumerPodStatus{}}
	for _, name := range slices.Sorted(maps.Keys(in.pods)) {
		pr := in.pods[name]
		pod := v1alpha1.ConsumerPodStatus{Name: name}
		if pr.err != nil {
			pod.Unreachable = truncateTo(pr.err.Error(), 1024)
		}
		if st := pr.state; st != nil {
			pod.Ready, pod.Reason = st.Ready, truncateTo(st.Reason, 1024)
			pod.Partitions = partitionList(st.Partitions)
			pod.Lag = st.Lag()
			sum.Lag += pod.Lag
			sum.DeadLettersLastHour += st.DeadLettersLastHour
			if b := st.Blocked; b != nil {
				pod.Blocked = &v1alpha1.BlockedRecord{Topic: b.Topic, Partition: b.Partition, Offset: b.Offset,
					Since: metav1.NewTime(b.Since.Truncate(time.Second)), Error: truncateTo(b.Error, 512)}
			}
			if db := st.Database; db != nil {
				sum.WaitingMessages = ptr.To(db.Waiting())
				sum.InstancesExpiringSoon = ptr.To(db.InstancesExpiringSoon)
				if db.OldestWaitingSeconds > 0 {
					since := pr.readAt.Add(-time.Duration(db.OldestWaitingSeconds * float64(time.Second))).Truncate(time.Second)
					sum.OldestWaitingSince = ptr.To(metav1.NewTime(since))
				}
			}
		}
		sum.Pods = append(sum.Pods, pod)
	}
	return sum
}

// partitionList writes partitions as topic[p,q] per topic, in order.
func partitionList(ps []consumerstate.Partition) string {
	byTopic := map[string][]int32{}
	for _, p := range ps {
		byTopic[p.Topic] = append(byTopic[p.Topic], p.Partition)
	}
	var out []string
	for _, topic := range slices.Sorted(maps.Keys(byTopic)) {
		nums := byTopic[topic]
		slices.Sort(nums)
		parts := make([]string, len(nums))
		for i, n := range nums {
			parts[i] = strconv.Itoa(int(n))
		}
		out = append(out, topic+"["+strings.Join(parts, ",")+"]")
	}
	return strings.Join(out, " ")
}

// Bands of the summary: a count moved when it turned zero or non-zero or by more than
// countBand and a tenth; a time when by more than timeBand.
const (
	countBand = 10
	timeBand  = 30 * time.Second
)

// summaryMoved reports whether the new summary differs from the old one by more than the bands:
// any change of the pods, their partitions, readiness or blocked records, and counts and times
// that moved beyond their band. A lag that wobbles under load is not a change.
func summaryMoved(old, now *v1alpha1.ConsumersStatus) bool {
	if countMoved(old.Lag, now.Lag) || old.DeadLettersLastHour != now.DeadLettersLastHour ||
		optionalCountMoved(old.WaitingMessages, now.WaitingMessages) ||
		optionalCountMoved(old.InstancesExpiringSoon, now.InstancesExpiringSoon) ||
		timeMoved(old.OldestWaitingSince, now.OldestWaitingSince) || len(old.Pods) != len(now.Pods) {
		return true
	}
	for i, o := range old.Pods {
		n := now.Pods[i]
		if o.Name != n.Name || o.Ready != n.Ready || o.Reason != n.Reason || o.Partitions != n.Partitions ||
			(o.Unreachable == "") != (n.Unreachable == "") || countMoved(o.Lag, n.Lag) || blockedMoved(o.Blocked, n.Blocked) {
			return true
		}
	}
	return false
}

func countMoved(a, b int64) bool {
	if (a == 0) != (b == 0) {
		return true
	}
	band := max(countBand, max(a, b)/10)
	return a-b > band || b-a > band
}

func optionalCountMoved(a, b *int64) bool {
	if a == nil || b == nil {
		return (a == nil) != (b == nil)
	}
	return countMoved(*a, *b)
}

func timeMoved(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return (a == nil) != (b == nil)
	}
	d := a.Sub(b.Time)
	return d > timeBand || -d > timeBand
}

// blockedMoved compares where and since when; the error text of each attempt may differ.
func blockedMoved(a, b *v1alpha1.BlockedRecord) bool {
	if a == nil || b == nil {
		return (a == nil) != (b == nil)
	}
	return a.Topic != b.Topic || a.Partition != b.Partition || a.Offset != b.Offset || !a.Since.Equal(&b.Since)
}

// truncateTo cuts s to n bytes.
func truncateTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
