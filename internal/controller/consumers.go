package controller

import (
	"cmp"
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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/consumerstate"
)

// What the running consumers know (their partitions and lag, a record they retry, the
// housekeeping leader's database-wide counts) the operator reads from the consumers themselves,
// as CloudNativePG's operator reads its instance managers: each consumer pod serves its state
// over HTTPS on the state port (internal/consumerstate), with a certificate and a token that the
// operator generated for the inbox and keeps in a Secret mounted into the pods. No pod is started
// to ask, and the operator never talks SQL.
//
// The reads run apart from the reconcile passes: a poller (pollConsumers, every
// StatePollInterval) reads every consumer pod that the last pass of each running inbox listed,
// and asks for a pass only when the pass would write something: a record crossed BlockedThreshold
// or stopped being retried (Degraded PartitionBlocked), or the summary in status.consumers is due
// (at most every StatusWriteInterval, and only when a value moved beyond its band). A steady
// inbox costs reads of its pods and nothing else: no pass, no Job, no write.

// stateReadTimeout bounds the read of one consumer's state.
const stateReadTimeout = 3 * time.Second

// credentialsRecheck is how often a pass checks that the credentials Secret still exists.
const credentialsRecheck = 5 * time.Minute

// pollParallelism bounds the inboxes whose consumers are read at once.
const pollParallelism = 8

// consumerReads are the operator's in-memory record, per inbox, of what its last pass listed and
// reported and of what the poller last read. It is lost on a restart and read anew.
type consumerReads struct {
	mu      sync.Mutex
	inboxes map[types.NamespacedName]*inboxReads
}

// inboxReads is the record of one inbox; consumerReads.mu guards it.
type inboxReads struct {
	// targets are the consumer pods to read (name to address), as the last pass listed them.
	targets map[string]string
	// client holds the inbox's credentials; nil until read from the Secret, and again after a
	// consumer refused them. credentialsAt is when a pass last made sure that the Secret exists.
	client        *consumerstate.Client
	credentialsAt time.Time
	readAt        time.Time
	pods          map[string]*podRead
	// blocked and summary are what the last pass reported: the Degraded verdict on blocked
	// records and status.consumers. reported is set by a pass that reported and cleared when the
	// poller asks for a pass: a pass that stops before reporting (a rollout waiting) is not
	// asked for again and again.
	reported bool
	blocked  string
	summary  *v1alpha1.ConsumersStatus
}

// podRead is the last read of one consumer pod: the state of the last successful read, and the
// error of the last read when it failed.
type podRead struct {
	state  *consumerstate.State
	readAt time.Time
	err    error
}

// forget drops the record of an inbox (stopped or deleted).
func (c *consumerReads) forget(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.inboxes[key]; in != nil && in.client != nil {
		in.client.Close()
	}
	delete(c.inboxes, key)
}

// ofLocked returns the record of one inbox, creating it; the caller holds c.mu.
func (c *consumerReads) ofLocked(key types.NamespacedName) *inboxReads {
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

// reportConsumers lists the consumer pods for the poller to read, names in Degraded the records
// retried for longer than BlockedThreshold, and writes the summary when it is due. It reads no
// consumer itself and never stops the pass. Consumers of an engine that serves no state
// (servesState) are not read: status.consumers is left out, and ConsumerStateServed says why.
func (r *Reconciler) reportConsumers(_ context.Context, s *scope) (phaseResult, error) {
	key := client.ObjectKeyFromObject(s.inbox)
	served := servesState(s.running.Version)
	s.setCondition(consumerStateServedCondition(s.running.Version, served))
	if !served || desiredReplicas(s.deployment) == 0 && len(s.consumerPods) == 0 {
		r.reads.forget(key)
		s.inbox.Status.Consumers = nil
		return proceed, nil
	}
	targets := map[string]string{}
	for i := range s.consumerPods {
		if addr, ok := stateAddress(&s.consumerPods[i]); ok {
			targets[s.consumerPods[i].Name] = addr
		}
	}
	r.reads.mu.Lock()
	defer r.reads.mu.Unlock()
	in := r.reads.ofLocked(key)
	in.targets = targets
	for name := range in.pods {
		if _, ok := targets[name]; !ok {
			delete(in.pods, name)
		}
	}
	blocked := blockedRecords(in, s.now, r.BlockedThreshold)
	for _, p := range blocked {
		s.problem(v1alpha1.PartitionBlockedReason, p)
	}
	in.blocked = strings.Join(blocked, "\n")
	if r.summaryDue(s.inbox.Status.Consumers, in, s.now) {
		s.inbox.Status.Consumers = summarizeConsumers(in, s.now)
	}
	in.summary = s.inbox.Status.Consumers.DeepCopy()
	in.reported = true
	return proceed, nil
}

// summaryDue reports whether status.consumers, now old, is to be written anew: when there is
// none, or StatusWriteInterval after the last write when a value moved beyond its band.
func (r *Reconciler) summaryDue(old *v1alpha1.ConsumersStatus, in *inboxReads, now time.Time) bool {
	return old == nil || now.Sub(old.UpdatedAt.Time) >= r.StatusWriteInterval && summaryMoved(old, summarizeConsumers(in, now))
}

// blockedRecords are the messages of the records retried for longer than threshold, by pod.
func blockedRecords(in *inboxReads, now time.Time, threshold time.Duration) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(in.pods)) {
		if st := in.pods[name].state; st != nil && st.Blocked != nil && now.Sub(st.Blocked.Since) > threshold {
			out = append(out, blockedMessage(name, *st.Blocked, threshold))
		}
	}
	return out
}

// pollConsumers reads the consumers of every inbox whose last read is StatePollInterval old (or
// that has a pod never read), and returns the inboxes whose next pass would write something.
func (r *Reconciler) pollConsumers(ctx context.Context) []types.NamespacedName {
	now := r.Clock.Now()
	r.reads.mu.Lock()
	var due []types.NamespacedName
	for key, in := range r.reads.inboxes {
		if len(in.targets) > 0 && (now.Sub(in.readAt) >= r.StatePollInterval || unread(in)) {
			due = append(due, key)
		}
	}
	r.reads.mu.Unlock()
	var (
		mu      sync.Mutex
		changed []types.NamespacedName
		wg      sync.WaitGroup
		slots   = make(chan struct{}, pollParallelism)
	)
	for _, key := range due {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if r.readInbox(ctx, key, now) {
				mu.Lock()
				changed = append(changed, key)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(changed, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	return changed
}

// readInbox reads every target pod of one inbox at once and reports whether its next pass would
// write something. A pod whose read fails keeps its last state for staleAfter poll intervals.
func (r *Reconciler) readInbox(ctx context.Context, key types.NamespacedName, now time.Time) bool {
	log := logf.FromContext(ctx).WithValues("sequentialinbox", key)
	r.reads.mu.Lock()
	in := r.reads.inboxes[key]
	if in == nil {
		r.reads.mu.Unlock()
		return false
	}
	targets, c := maps.Clone(in.targets), in.client
	in.readAt = now
	r.reads.mu.Unlock()
	if c == nil {
		var err error
		if c, err = r.stateClient(ctx, key); err != nil {
			log.Info("cannot read the consumers' state", "error", err.Error())
			return false
		}
	}
	type result struct {
		state consumerstate.State
		err   error
	}
	results := make(map[string]*result, len(targets))
	var wg sync.WaitGroup
	for name, addr := range targets {
		res := &result{}
		results[name] = res
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, stateReadTimeout)
			defer cancel()
			res.state, res.err = c.Get(rctx, addr)
		})
	}
	wg.Wait()

	r.reads.mu.Lock()
	defer r.reads.mu.Unlock()
	if r.reads.inboxes[key] != in {
		return false // forgotten meanwhile
	}
	in.client = c
	for name, res := range results {
		pr := in.pods[name]
		if pr == nil {
			pr = &podRead{}
			in.pods[name] = pr
		}
		pr.err = res.err
		switch {
		case res.err == nil:
			pr.state, pr.readAt = &res.state, now
		case now.Sub(pr.readAt) > staleAfter*r.StatePollInterval:
			pr.state = nil
		}
		if res.err != nil {
			log.V(1).Info("cannot read a consumer's state", "pod", name, "error", res.err.Error())
		}
		if errors.Is(res.err, consumerstate.ErrCredentials) && in.client != nil {
			// A Secret replaced since it was read: read it again next time.
			in.client.Close()
			in.client = nil
		}
	}
	ask := in.reported && (strings.Join(blockedRecords(in, now, r.BlockedThreshold), "\n") != in.blocked || r.summaryDue(in.summary, in, now))
	if ask {
		in.reported = false
	}
	return ask
}

// unread reports whether a target pod was never read: a new consumer is read at the next poll.
func unread(in *inboxReads) bool {
	for name := range in.targets {
		if in.pods[name] == nil {
			return true
		}
	}
	return false
}

// pollLoop runs pollConsumers every StatePollInterval until ctx ends, and asks for a pass of each
// inbox it returns.
func (r *Reconciler) pollLoop(ctx context.Context, passes chan<- event.GenericEvent) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		for _, key := range r.pollConsumers(ctx) {
			select {
			case passes <- event.GenericEvent{Object: &v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
			case <-ctx.Done():
				return
			}
		}
	}, r.StatePollInterval)
}

// staleAfter is how many poll intervals the last state of a pod that cannot be read stands.
const staleAfter = 3

// stateAddress is where a consumer pod serves its state: its IP and the container's state port.
// Pods not running yet or terminating are not read, nor pods without the state port: those of
// an engine that serves no state, during a rollout from or to one.
func stateAddress(pod *corev1.Pod) (string, bool) {
	if pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
		return "", false
	}
	for _, c := range pod.Spec.Containers {
		if c.Name != consumerContainer {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == statePortName {
				return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(p.ContainerPort))), true
			}
		}
	}
	return "", false
}

// stateClient builds the client of an inbox's consumers from its credentials Secret, read
// directly from the API server (the operator caches no Secret).
func (r *Reconciler) stateClient(ctx context.Context, key types.NamespacedName) (*consumerstate.Client, error) {
	var secret corev1.Secret
	name := client.ObjectKey{Namespace: key.Namespace, Name: stateSecretName(&v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Name: key.Name}})}
	if err := r.APIReader.Get(ctx, name, &secret); err != nil {
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
// ones: the operator creates them again, the pods' mounted files follow). A pass checks that it
// exists every credentialsRecheck.
func (r *Reconciler) ensureStateCredentials(ctx context.Context, s *scope) error {
	key := client.ObjectKeyFromObject(s.inbox)
	r.reads.mu.Lock()
	in := r.reads.ofLocked(key)
	checked := !in.credentialsAt.IsZero() && s.now.Sub(in.credentialsAt) < credentialsRecheck
	r.reads.mu.Unlock()
	if checked {
		return nil
	}
	name := stateSecretName(s.inbox)
	var existing corev1.Secret
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: s.inbox.Namespace, Name: name}, &existing)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.createStateCredentials(ctx, s, name); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("read consumer state credentials: %w", err)
	}
	r.reads.mu.Lock()
	r.reads.ofLocked(key).credentialsAt = s.now
	r.reads.mu.Unlock()
	return nil
}

// createStateCredentials creates the credentials Secret of an inbox.
func (r *Reconciler) createStateCredentials(ctx context.Context, s *scope, name string) error {
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
	byReason := map[string]int64{}
	defer func() { sum.DeadLettersLastHourByReason = reasonCounts(byReason) }()
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
			for reason, n := range st.DeadLettersLastHourByReason {
				byReason[reason] += n
			}
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
				sum.WaitingByType = waitingByType(db, pr.readAt)
			}
		}
		sum.Pods = append(sum.Pods, pod)
	}
	return sum
}

// waitingByType lists the leader's waiting messages per type, most first (then by type), at most
// MaxWaitingTypes, each with its oldest's arrival as of readAt.
func waitingByType(db *consumerstate.Database, readAt time.Time) []v1alpha1.WaitingTypeStatus {
	var out []v1alpha1.WaitingTypeStatus
	for typ, n := range db.WaitingByType {
		if n <= 0 {
			continue
		}
		w := v1alpha1.WaitingTypeStatus{Type: typ, Count: n}
		if age, ok := db.OldestWaitingSecondsByType[typ]; ok && age > 0 {
			w.OldestSince = ptr.To(metav1.NewTime(readAt.Add(-time.Duration(age * float64(time.Second))).Truncate(time.Second)))
		}
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b v1alpha1.WaitingTypeStatus) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Type, b.Type))
	})
	return out[:min(len(out), v1alpha1.MaxWaitingTypes)]
}

// reasonCounts lists the dead letters by reason, most first (then by reason), at most
// MaxDeadLetterReasons.
func reasonCounts(byReason map[string]int64) []v1alpha1.DeadLetterReasonCount {
	var out []v1alpha1.DeadLetterReasonCount
	for reason, n := range byReason {
		if n > 0 {
			out = append(out, v1alpha1.DeadLetterReasonCount{Reason: reason, Count: n})
		}
	}
	slices.SortFunc(out, func(a, b v1alpha1.DeadLetterReasonCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Reason, b.Reason))
	})
	return out[:min(len(out), v1alpha1.MaxDeadLetterReasons)]
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
		timeMoved(old.OldestWaitingSince, now.OldestWaitingSince) || len(old.Pods) != len(now.Pods) ||
		waitingByTypeMoved(old.WaitingByType, now.WaitingByType) || !slices.Equal(old.DeadLettersLastHourByReason, now.DeadLettersLastHourByReason) {
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

// waitingByTypeMoved reports whether the listed types changed, or a type's count or oldest moved
// beyond its band; two types whose counts swap places within the band are no change.
func waitingByTypeMoved(old, now []v1alpha1.WaitingTypeStatus) bool {
	if len(old) != len(now) {
		return true
	}
	byType := map[string]v1alpha1.WaitingTypeStatus{}
	for _, o := range old {
		byType[o.Type] = o
	}
	for _, n := range now {
		o, ok := byType[n.Type]
		if !ok || countMoved(o.Count, n.Count) || timeMoved(o.OldestSince, n.OldestSince) {
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
