package controller

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/migrations"
)

var (
	engineV1 = engine{Image: "seqinbox:v1", Version: "v1.0.0", ClaimProtocol: "insert-first-v1", GroupProtocol: "seqinbox-insert-first-v1"}
	engineV2 = engine{Image: "seqinbox:v2", Version: "v2.0.0", ClaimProtocol: "insert-first-v2", GroupProtocol: "seqinbox-insert-first-v2"}
	// engineV1Patch speaks the same protocol as engineV1.
	engineV1Patch = engine{Image: "seqinbox:v1.0.1", Version: "v1.0.1", ClaimProtocol: "insert-first-v1", GroupProtocol: "seqinbox-insert-first-v1"}
	// engineV1Epoch1 is engineV1 after spec.kafka.groupProtocolEpoch was raised to 1.
	engineV1Epoch1 = engine{Image: "seqinbox:v1", Version: "v1.0.0", ClaimProtocol: "insert-first-v1", GroupProtocol: "seqinbox-insert-first-v1-epoch1"}
	// engineV1Unrecorded runs from a Deployment that does not say which group protocol it announces.
	engineV1Unrecorded = engine{Image: "seqinbox:v1", Version: "v1.0.0", ClaimProtocol: "insert-first-v1"}
)

// drained is a gate input in which nothing of the old version is left anywhere.
func drained(running, target engine) gateInput {
	return gateInput{
		strategy: v1alpha1.UpgradeAutomatic, inbox: "orders", running: running, target: target,
		group:    groupView{checked: true},
		registry: registryView{checked: true, current: true},
	}
}

func TestSameClaimProtocolIsProvenOnlyWhenBothAreKnown(t *testing.T) {
	cases := []struct {
		name            string
		running, target engine
		want            bool
	}{
		{name: "patch release of the same protocol", running: engineV1, target: engineV1Patch, want: true},
		{name: "different protocol", running: engineV1, target: engineV2, want: false},
		{name: "same claim protocol, raised group protocol epoch", running: engineV1, target: engineV1Epoch1, want: false},
		{name: "group protocol of the running consumers unknown", running: engineV1Unrecorded, target: engineV1Patch, want: false},
		{name: "unknown running protocol proves nothing", running: engine{Image: "seqinbox:old"}, target: engineV1, want: false},
		{name: "nothing running proves nothing", running: engine{}, target: engineV1, want: false},
		{name: "unknown target proves nothing", running: engineV1, target: engine{}, want: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameClaimProtocol(drained(tc.running, tc.target)); got != tc.want {
				t.Errorf("sameClaimProtocol() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAwaitApproval(t *testing.T) {
	cases := []struct {
		name        string
		strategy    v1alpha1.UpgradeStrategy
		approval    string
		replicas    int32
		pods        []string
		wantBlocked bool
	}{
		{name: "automatic never waits", strategy: v1alpha1.UpgradeAutomatic, replicas: 3},
		{name: "supervised with running consumers waits", strategy: v1alpha1.UpgradeSupervised, replicas: 3, wantBlocked: true},
		{name: "supervised with leftover pods waits", strategy: v1alpha1.UpgradeSupervised, pods: []string{"p-1"}, wantBlocked: true},
		{name: "approval of another version does not count", strategy: v1alpha1.UpgradeSupervised, replicas: 3, approval: "v1.0.1", wantBlocked: true},
		{name: "approval of the target version", strategy: v1alpha1.UpgradeSupervised, replicas: 3, approval: "v2.0.0"},
		{name: "nothing to stop needs no approval", strategy: v1alpha1.UpgradeSupervised},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := drained(engineV1, engineV2)
			in.strategy, in.approval, in.replicas, in.pods = tc.strategy, tc.approval, tc.replicas, tc.pods
			v := awaitApproval(in)
			if v.blocked != tc.wantBlocked {
				t.Fatalf("awaitApproval() blocked = %v (%s), want %v", v.blocked, v.message, tc.wantBlocked)
			}
			if !v.blocked {
				return
			}
			if v.reason != v1alpha1.AwaitingApprovalReason {
				t.Errorf("reason = %q, want %q", v.reason, v1alpha1.AwaitingApprovalReason)
			}
			wantCommand := "kubectl annotate sequentialinbox orders inbox.seqinbox.dev/approve-rollout=v2.0.0"
			if !strings.Contains(v.message, wantCommand) {
				t.Errorf("message %q does not say how to approve (%q)", v.message, wantCommand)
			}
			if v.requeueAfter != 0 {
				t.Errorf("requeue after %s, want none: the approval is a change of the inbox, which is watched", v.requeueAfter)
			}
		})
	}
}

func TestAwaitOldPodsGoneNamesThePods(t *testing.T) {
	in := drained(engineV1, engineV2)
	if awaitOldPodsGone(in).blocked {
		t.Fatal("blocked without pods")
	}
	in.pods = []string{"orders-consumer-abc", "orders-consumer-def"}
	v := awaitOldPodsGone(in)
	if !v.blocked || v.reason != v1alpha1.WaitingForOldPodsReason {
		t.Fatalf("awaitOldPodsGone() = %q, %v; want %q, blocked", v.reason, v.blocked, v1alpha1.WaitingForOldPodsReason)
	}
	for _, pod := range in.pods {
		if !strings.Contains(v.message, pod) {
			t.Errorf("message %q does not name pod %s", v.message, pod)
		}
	}
}

func TestAwaitEmptyConsumerGroup(t *testing.T) {
	cases := []struct {
		name        string
		group       groupView
		wantReason  string
		wantMention string
	}{
		{name: "empty group passes", group: groupView{checked: true}},
		{name: "a member blocks and is named", group: groupView{checked: true, members: []GroupMember{{ID: "m-1", ClientID: "legacy-app", Host: "/10.0.0.7", Protocol: "range"}}},
			wantReason: v1alpha1.WaitingForConsumerGroupReason, wantMention: "m-1 (client legacy-app, host /10.0.0.7, protocol range)"},
		{name: "an unreadable group blocks", group: groupView{err: errors.New("dial tcp: connection refused")},
			wantReason: v1alpha1.ConsumerGroupUnknownReason, wantMention: "connection refused"},
		{name: "an unread group blocks", group: groupView{}, wantReason: v1alpha1.ConsumerGroupUnknownReason},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := drained(engineV1, engineV2)
			in.group, in.pollInterval = tc.group, time.Minute
			v := awaitEmptyConsumerGroup(in)
			if v.blocked != (tc.wantReason != "") || v.reason != tc.wantReason {
				t.Fatalf("awaitEmptyConsumerGroup() = %q, %v; want %q", v.reason, v.blocked, tc.wantReason)
			}
			if !strings.Contains(v.message, tc.wantMention) {
				t.Errorf("message %q does not mention %q", v.message, tc.wantMention)
			}
			if v.blocked && v.requeueAfter != time.Minute {
				t.Errorf("requeue after %s, want the poll interval: no watch reports the group", v.requeueAfter)
			}
		})
	}
}

func TestAwaitRegistryClear(t *testing.T) {
	heartbeat := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	oldConsumer := migrations.LiveConsumer{InstanceID: "orders-consumer-abc", EngineVersion: "v1.0.0", ClaimProtocol: "insert-first-v1", HeartbeatAt: heartbeat}
	newConsumer := migrations.LiveConsumer{InstanceID: "laptop", EngineVersion: "v2.0.0", ClaimProtocol: "insert-first-v2", HeartbeatAt: heartbeat}
	cases := []struct {
		name        string
		registry    registryView
		wantReason  string
		wantMention string
		// wantRequeue and wantReread say when and how the gate looks again.
		wantRequeue time.Duration
		wantReread  bool
	}{
		{name: "no live consumer passes", registry: registryView{checked: true, current: true}},
		{name: "a live consumer of the target protocol passes", registry: registryView{checked: true, current: true, live: []migrations.LiveConsumer{newConsumer}}},
		{name: "a live consumer of the old protocol blocks and is named", registry: registryView{checked: true, current: true, live: []migrations.LiveConsumer{newConsumer, oldConsumer}},
			wantReason: v1alpha1.WaitingForRegistryReason, wantMention: "orders-consumer-abc (engine v1.0.0, protocol insert-first-v1, heartbeat 2026-05-01T12:00:00Z)",
			wantRequeue: time.Minute, wantReread: true},
		{name: "a truncated list proves nothing", registry: registryView{checked: true, current: true, truncated: true, live: []migrations.LiveConsumer{newConsumer}},
			wantReason: v1alpha1.WaitingForRegistryReason, wantMention: "more live consumers", wantRequeue: time.Minute, wantReread: true},
		{name: "the previous read stands while a newer one backs off", registry: registryView{checked: true, retryIn: 7 * time.Second, live: []migrations.LiveConsumer{oldConsumer}},
			wantReason: v1alpha1.WaitingForRegistryReason, wantMention: "orders-consumer-abc", wantRequeue: 7 * time.Second},
		{name: "no read after the stop yet", registry: registryView{pending: "Job orders-probe-x-2 reads the database registry."},
			wantReason: v1alpha1.CheckingRegistryReason, wantMention: "orders-probe-x-2"},
		{name: "the read after the stop backs off", registry: registryView{pending: "The probe failed.", retryIn: 7 * time.Second},
			wantReason: v1alpha1.CheckingRegistryReason, wantMention: "probe failed", wantRequeue: 7 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := drained(engineV1, engineV2)
			in.registry, in.pollInterval = tc.registry, time.Minute
			v := awaitRegistryClear(in)
			if v.blocked != (tc.wantReason != "") || v.reason != tc.wantReason {
				t.Fatalf("awaitRegistryClear() = %q, %v (%s); want %q", v.reason, v.blocked, v.message, tc.wantReason)
			}
			if !strings.Contains(v.message, tc.wantMention) {
				t.Errorf("message %q does not mention %q", v.message, tc.wantMention)
			}
			if v.blocked && strings.Contains(v.message, "laptop") {
				t.Errorf("message %q names a consumer of the target protocol", v.message)
			}
			if v.requeueAfter != tc.wantRequeue || v.rereadRegistry != tc.wantReread {
				t.Errorf("looks again after %s (new read %v), want %s (new read %v)", v.requeueAfter, v.rereadRegistry, tc.wantRequeue, tc.wantReread)
			}
		})
	}
}

func TestPolicyChainReportsTheFirstBlockingPolicyInOrder(t *testing.T) {
	everything := drained(engineV1, engineV2)
	everything.strategy = v1alpha1.UpgradeSupervised
	everything.replicas = 2
	everything.pods = []string{"orders-consumer-abc"}
	everything.group = groupView{checked: true, members: []GroupMember{{ID: "m-1"}}}
	everything.registry = registryView{pending: "not read"}

	steps := []struct {
		name   string
		fix    func(*gateInput)
		reason string
	}{
		{name: "approval first", fix: func(*gateInput) {}, reason: v1alpha1.AwaitingApprovalReason},
		{name: "then the pods", fix: func(in *gateInput) { in.approval = "v2.0.0" }, reason: v1alpha1.WaitingForOldPodsReason},
		{name: "then the group", fix: func(in *gateInput) { in.pods, in.replicas = nil, 0 }, reason: v1alpha1.WaitingForConsumerGroupReason},
		{name: "then the registry", fix: func(in *gateInput) { in.group.members = nil }, reason: v1alpha1.CheckingRegistryReason},
		{name: "then nothing", fix: func(in *gateInput) { in.registry = registryView{checked: true} }, reason: ""},
	}
	// The chain's policies alone: the input already holds what the reconciler's steps observe.
	chain := (&Reconciler{}).rolloutChain()
	for i := range chain {
		chain[i].prepare = nil
	}
	in := everything
	for _, step := range steps {
		step.fix(&in)
		v, err := evaluate(context.Background(), nil, chain, &in)
		if err != nil {
			t.Fatal(err)
		}
		if v.reason != step.reason || v.blocked != (step.reason != "") {
			t.Fatalf("%s: evaluate() = %q, %v; want %q", step.name, v.reason, v.blocked, step.reason)
		}
	}
}

func TestOtherProtocolMembers(t *testing.T) {
	ours := GroupMember{ID: "a", ClientID: "seqinbox-orders-0", Protocol: "seqinbox-insert-first-v1"}
	legacy := GroupMember{ID: "b", ClientID: "legacy-app", Protocol: "range"}
	rebalancing := GroupMember{ID: "c", ClientID: "unknown"}
	cases := []struct {
		name    string
		members []GroupMember
		want    []GroupMember
	}{
		{name: "empty group", members: nil, want: nil},
		{name: "only ours", members: []GroupMember{ours}, want: nil},
		{name: "a legacy application", members: []GroupMember{legacy}, want: []GroupMember{legacy}},
		{name: "a rebalancing group (no protocol chosen) proves nothing", members: []GroupMember{ours, rebalancing}, want: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := otherProtocolMembers("seqinbox-insert-first-v1", tc.members); !slices.Equal(got, tc.want) {
				t.Errorf("otherProtocolMembers() = %v, want %v", got, tc.want)
			}
		})
	}
}
