package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/migrations"
)

// The rollout gate keeps consumers of different claim protocols from ever processing at the same
// time (docs/design.md#rollout-gate-and-claim-protocol). A rollout between images of the same claim
// protocol is a normal rolling update. Any other rollout — a different protocol, or one the
// operator cannot prove equal, such as pods of an unknown version — runs as: (approval, for
// Supervised) → stop the old consumers → wait until their pods are gone, the Kafka consumer group
// has no members and the database registry lists no live consumer of another protocol → migrate →
// start the new version.
//
// Each wait is a policy: a small function of the observed gateInput that returns a verdict: pass,
// or block with a reason, a message and when to look again. The policies form one chain, evaluated
// once per pass; before a policy the reconciler does what the policy needs (stop the old
// consumers, read the consumer group, read the registry), so that nothing is done or read before
// the policies ahead of it passed. The first blocking verdict becomes the RolloutBlocked
// condition, and the reconciler acts on the verdict alone.

// gateInput is what the rollout gate decides on; gateRollout observes it, the policies only read it.
type gateInput struct {
	strategy v1alpha1.UpgradeStrategy
	// approval is the value of the inbox's approve-rollout annotation.
	approval string
	inbox    string
	running  engine
	target   engine
	// replicas is what the consumer Deployment asks for; pods are the consumer pods that exist.
	replicas int32
	pods     []string
	group    groupView
	registry registryView
	// pollInterval is how often what no watch reports (the consumer group, the registry) is read again.
	pollInterval time.Duration
}

// groupView is what the Kafka consumer group looked like.
type groupView struct {
	checked bool
	members []GroupMember
	err     error
}

// registryView is what the consumer registry of the database looked like after the old
// consumers stopped (a probe report taken while no consumer of the inbox ran).
type registryView struct {
	checked bool
	// pending says why there is no report yet (probe running or failed).
	pending   string
	live      []migrations.LiveConsumer
	truncated bool
	// current is true when the report is the current probe attempt's, false when it is the
	// previous attempt's while a newer read runs.
	current bool
	// retryIn is how long the current probe attempt still waits for its backoff.
	retryIn time.Duration
}

// verdict is what a rollout policy decides: pass (the zero value), or block with a reason, a
// message for a person and when to look again.
type verdict struct {
	blocked bool
	reason  string
	message string
	// requeueAfter is when to look again; zero waits for a watched object to change.
	requeueAfter time.Duration
	// rereadRegistry asks for a new registry read at requeueAfter: heartbeats expire and
	// consumers deregister without any watched object changing.
	rereadRegistry bool
}

// blockedBy is a blocking verdict that waits for a watched object to change.
func blockedBy(reason, message string) verdict {
	return verdict{blocked: true, reason: reason, message: message}
}

// rolloutPolicy decides one wait of the rollout gate from the observed input.
type rolloutPolicy func(in gateInput) verdict

// gateStep is one link of the rollout gate's chain: what the reconciler does or observes before
// the policy can decide (nil when gateInput holds it from the start), then the policy.
type gateStep struct {
	prepare func(ctx context.Context, s *scope, in *gateInput) error
	policy  rolloutPolicy
}

// rolloutChain is the gate's chain, in order, once a rollout cannot be proven compatible.
func (r *Reconciler) rolloutChain() []gateStep {
	return []gateStep{
		{policy: awaitApproval},
		{prepare: r.stopOldConsumers, policy: awaitOldPodsGone},
		{prepare: r.readConsumerGroup, policy: awaitEmptyConsumerGroup},
		{prepare: r.readRegistry, policy: awaitRegistryClear},
	}
}

// evaluate runs the chain and returns the first blocking verdict, or a passing one.
func evaluate(ctx context.Context, s *scope, chain []gateStep, in *gateInput) (verdict, error) {
	for _, step := range chain {
		if step.prepare != nil {
			if err := step.prepare(ctx, s, in); err != nil {
				return verdict{}, err
			}
		}
		if v := step.policy(*in); v.blocked {
			return v, nil
		}
	}
	return verdict{}, nil
}

// sameClaimProtocol proves a rollout compatible: the running consumers' claim protocol is known
// and equals the target's, and so does the group protocol they announce to the broker (which
// also carries spec.kafka.groupProtocolEpoch). Otherwise the new consumers could never join the
// group next to the old ones, and a rolling update would wait for them forever. An unknown running
// protocol proves nothing.
func sameClaimProtocol(in gateInput) bool {
	return in.running.known() && in.target.known() && in.running.ClaimProtocol == in.target.ClaimProtocol &&
		in.running.GroupProtocol == in.target.GroupProtocol
}

// oldConsumersRun reports whether anything of the inbox runs or is asked to run.
func oldConsumersRun(in gateInput) bool { return in.replicas > 0 || len(in.pods) > 0 }

// awaitApproval blocks a Supervised rollout that would stop running consumers until the approval
// annotation names the target engine version.
func awaitApproval(in gateInput) verdict {
	if in.strategy != v1alpha1.UpgradeSupervised || !oldConsumersRun(in) || in.approval == in.target.Version {
		return verdict{}
	}
	return blockedBy(v1alpha1.AwaitingApprovalReason, fmt.Sprintf(
		"Engine %s (claim protocol %s) cannot run next to the running %s; the Supervised rollout stops the old consumers "+
			"once approved: kubectl annotate sequentialinbox %s %s=%s",
		in.target.Version, in.target.ClaimProtocol, describeRunning(in.running), in.inbox, v1alpha1.ApproveRolloutAnnotation, in.target.Version))
}

// awaitOldPodsGone blocks while consumer pods of the inbox exist.
func awaitOldPodsGone(in gateInput) verdict {
	if len(in.pods) == 0 {
		return verdict{}
	}
	return blockedBy(v1alpha1.WaitingForOldPodsReason, fmt.Sprintf("Waiting for %d consumer pod(s) of %s to terminate: %s.",
		len(in.pods), describeRunning(in.running), strings.Join(in.pods, ", ")))
}

// awaitEmptyConsumerGroup blocks while the Kafka consumer group has members (or could not be
// read), and looks again after the poll interval: no watch reports the group.
func awaitEmptyConsumerGroup(in gateInput) verdict {
	var v verdict
	switch {
	case in.group.err != nil:
		v = blockedBy(v1alpha1.ConsumerGroupUnknownReason, fmt.Sprintf("Cannot read the members of the Kafka consumer group: %v.", in.group.err))
	case !in.group.checked:
		v = blockedBy(v1alpha1.ConsumerGroupUnknownReason, "The Kafka consumer group was not read yet.")
	case len(in.group.members) > 0:
		v = blockedBy(v1alpha1.WaitingForConsumerGroupReason, fmt.Sprintf("Waiting for %d member(s) to leave the Kafka consumer group: %s.",
			len(in.group.members), describeMembers(in.group.members)))
	default:
		return verdict{}
	}
	v.requeueAfter = in.pollInterval
	return v
}

// awaitRegistryClear blocks until a registry read taken after the stop lists no live consumer of
// another claim protocol. A current read that still lists some is read again after the poll
// interval; otherwise the gate looks again when the probe's backoff ends or its Job changes.
func awaitRegistryClear(in gateInput) verdict {
	waitForProbe := func(v verdict) verdict {
		v.requeueAfter = max(in.registry.retryIn, 0)
		return v
	}
	if !in.registry.checked {
		return waitForProbe(blockedBy(v1alpha1.CheckingRegistryReason, in.registry.pending))
	}
	var others []string
	for _, c := range in.registry.live {
		if c.ClaimProtocol != in.target.ClaimProtocol {
			others = append(others, fmt.Sprintf("%s (engine %s, protocol %s, heartbeat %s)",
				c.InstanceID, c.EngineVersion, c.ClaimProtocol, c.HeartbeatAt.UTC().Format(time.RFC3339)))
		}
	}
	var v verdict
	switch {
	case len(others) > 0:
		v = blockedBy(v1alpha1.WaitingForRegistryReason, fmt.Sprintf("The database registry lists %d live consumer(s) of another claim protocol: %s.",
			len(others), strings.Join(others, ", ")))
	case in.registry.truncated:
		v = blockedBy(v1alpha1.WaitingForRegistryReason, "The database registry lists more live consumers than the report holds; waiting until it shrinks.")
	default:
		return verdict{}
	}
	if !in.registry.current {
		return waitForProbe(v)
	}
	v.requeueAfter, v.rereadRegistry = in.pollInterval, true
	return v
}

func describeRunning(e engine) string {
	if !e.known() {
		return "consumers of an unknown engine version"
	}
	return fmt.Sprintf("engine %s (claim protocol %s, group protocol %s)", e.Version, e.ClaimProtocol, orUnknown(e.GroupProtocol))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// gateRollout lets the rollout proceed when it is proven compatible or the rollout chain passes,
// and otherwise acts on the chain's verdict.
func (r *Reconciler) gateRollout(ctx context.Context, s *scope) (phaseResult, error) {
	in := gateInput{
		strategy:     s.inbox.Spec.UpgradeStrategy,
		approval:     s.inbox.Annotations[v1alpha1.ApproveRolloutAnnotation],
		inbox:        s.inbox.Name,
		running:      s.running,
		target:       s.target,
		replicas:     desiredReplicas(s.deployment),
		pods:         podNames(s.consumerPods),
		pollInterval: r.PollInterval,
	}
	if sameClaimProtocol(in) {
		s.setCondition(rolloutBlockedCondition(v1alpha1.SameClaimProtocolReason, fmt.Sprintf(
			"Engine %s speaks claim protocol %s and group protocol %s like the running consumers; they are replaced by a rolling update.",
			in.target.Version, in.target.ClaimProtocol, in.target.GroupProtocol), false))
		return proceed, nil
	}
	v, err := evaluate(ctx, s, r.rolloutChain(), &in)
	if err != nil {
		return proceed, err
	}
	if !v.blocked {
		s.setCondition(rolloutBlockedCondition(v1alpha1.NoOtherConsumersReason, fmt.Sprintf(
			"No consumer of another claim protocol runs (pods gone, consumer group empty, registry clear); engine %s may start.",
			in.target.Version), false))
		return proceed, nil
	}
	if v.rereadRegistry {
		startNextAttempt(s.inbox.Status.Probe, &metav1.Time{Time: s.now.Add(v.requeueAfter)})
	}
	s.setCondition(rolloutBlockedCondition(v.reason, v.message, true))
	s.wait(v.reason, v.message)
	if v.requeueAfter > 0 {
		return requeueAfter(v.requeueAfter), nil
	}
	return waitForEvent(), nil
}

// stopOldConsumers is the gate's step before awaitOldPodsGone: the rollout passed its approval,
// so the old consumers are stopped.
func (r *Reconciler) stopOldConsumers(ctx context.Context, s *scope, in *gateInput) error {
	return r.stopConsumers(ctx, s, fmt.Sprintf("engine %s (claim protocol %s) starts only after %s stopped",
		in.target.Version, in.target.ClaimProtocol, describeRunning(in.running)))
}

// readConsumerGroup is the gate's step before awaitEmptyConsumerGroup: the pods are gone.
func (r *Reconciler) readConsumerGroup(ctx context.Context, s *scope, in *gateInput) error {
	in.group = r.observeGroup(ctx, s)
	return nil
}

// readRegistry is the gate's step before awaitRegistryClear: the consumer group is empty.
func (r *Reconciler) readRegistry(ctx context.Context, s *scope, in *gateInput) error {
	view, err := r.observeRegistry(ctx, s)
	if err != nil {
		return err
	}
	view.retryIn = probeRetryIn(s)
	in.registry = view
	return nil
}

// observeGroup reads the members of the inbox's Kafka consumer group.
func (r *Reconciler) observeGroup(ctx context.Context, s *scope) groupView {
	conn, err := r.kafkaConnection(ctx, s.inbox)
	if err != nil {
		return groupView{err: err}
	}
	members, err := r.Groups.GroupMembers(ctx, conn, s.inbox.Spec.Kafka.ConsumerGroup)
	if err != nil {
		return groupView{err: err}
	}
	return groupView{checked: true, members: members}
}

// observeRegistry returns the registry as a probe saw it after the consumers stopped, starting
// such a probe when the current report is older than the stop.
func (r *Reconciler) observeRegistry(ctx context.Context, s *scope) (registryView, error) {
	out, err := r.runProbe(ctx, s)
	if err != nil {
		return registryView{}, err
	}
	if out.state == jobSucceeded && !stoppedWhenCreated(out) {
		startNextAttempt(s.inbox.Status.Probe, nil)
		if out, err = r.runProbe(ctx, s); err != nil {
			return registryView{}, err
		}
	}
	if out.state == jobSucceeded {
		return reportedRegistry(out.report, true), nil
	}
	// A newer read is under way: until it is done, what the previous read after the stop saw stands.
	previous, err := r.previousStoppedProbe(ctx, s)
	if err != nil {
		return registryView{}, err
	}
	if previous != nil {
		return reportedRegistry(previous, false), nil
	}
	run := s.inbox.Status.Probe
	if out.state == jobBackingOff && run.Failures > 0 {
		return registryView{pending: probeFailure(run, out)}, nil
	}
	return registryView{pending: fmt.Sprintf("Pods gone and consumer group empty; Job %s reads the database registry.",
		jobName(s.inbox, componentProbe, run.Key, run.Attempt))}, nil
}

func reportedRegistry(report *migrations.Report, current bool) registryView {
	return registryView{checked: true, live: report.LiveConsumers, truncated: report.LiveConsumersTruncated, current: current}
}

// previousStoppedProbe returns the report of the previous probe attempt when that attempt
// succeeded after the consumers had stopped; nil otherwise.
func (r *Reconciler) previousStoppedProbe(ctx context.Context, s *scope) (*migrations.Report, error) {
	run := s.inbox.Status.Probe
	if run == nil || run.Attempt < 2 {
		return nil, nil
	}
	name := jobName(s.inbox, componentProbe, run.Key, run.Attempt-1)
	var job batchv1.Job
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.inbox.Namespace, Name: name}, &job); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	finished, failed, _ := jobFinished(&job)
	if !finished || failed || job.Annotations[annotationConsumersStopped] != "true" || !metav1.IsControlledBy(&job, s.inbox) {
		return nil, nil
	}
	report, err := r.readReport(ctx, s, name)
	if err != nil {
		return nil, nil //nolint:nilerr // an unreadable old report is no report; the current read decides
	}
	return report, nil
}

// probeRetryIn is how long the current probe attempt waits for its backoff.
func probeRetryIn(s *scope) time.Duration {
	if run := s.inbox.Status.Probe; run != nil && run.RetryAfter != nil {
		return run.RetryAfter.Sub(s.now)
	}
	return 0
}

// stopConsumers scales the consumer Deployment to zero; its pods terminate gracefully (they finish
// in-flight records, commit and leave the group).
func (r *Reconciler) stopConsumers(ctx context.Context, s *scope, why string) error {
	d := s.deployment
	if desiredReplicas(d) == 0 {
		return nil
	}
	before := d.DeepCopy()
	d.Spec.Replicas = ptr.To(int32(0))
	if err := r.Client.Patch(ctx, d, client.MergeFrom(before), client.FieldOwner(fieldOwner)); err != nil {
		return fmt.Errorf("scale deployment %s to 0: %w", d.Name, err)
	}
	r.event(s.inbox, corev1.EventTypeNormal, "StoppingConsumers", "ScaleDown", "Scaled Deployment %s to 0: %s", d.Name, why)
	return nil
}

func podNames(pods []corev1.Pod) []string {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name
	}
	return names
}
