package plugin

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
)

// update rewrites the golden files of the status screen: go test ./internal/plugin -run Status -update
var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// testNow is the clock of the status tests; every time they write is relative to it.
var testNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// ago is a time d before testNow.
func ago(d time.Duration) metav1.Time { return metav1.NewTime(testNow.Add(-d)) }

// selectorOf is the consumer selector the operator reports for an inbox.
func selectorOf(name string) string {
	return "app.kubernetes.io/component=consumer,app.kubernetes.io/instance=" + name + ",app.kubernetes.io/name=seqinbox"
}

// conditions are the seven conditions of an inbox, healthy, with the changes of edit.
func conditions(edit map[string]metav1.Condition) []metav1.Condition {
	healthy := []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ConsumersReadyReason, Message: "2 of 2 consumers are ready."},
		{Type: v1alpha1.ConditionConfigValid, Status: metav1.ConditionTrue, Reason: v1alpha1.ValidReason, Message: "The spec is valid."},
		{Type: v1alpha1.ConditionSchemaReady, Status: metav1.ConditionTrue, Reason: v1alpha1.MigratedReason, Message: "Schema version 9."},
		{Type: v1alpha1.ConditionRolloutBlocked, Status: metav1.ConditionFalse, Reason: v1alpha1.SameClaimProtocolReason, Message: "The target speaks the running claim protocol."},
		{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: v1alpha1.ReconciledReason, Message: "The consumers run generation 1."},
		{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: v1alpha1.AsExpectedReason, Message: "Nothing needs attention."},
		{Type: v1alpha1.ConditionScalingLimited, Status: metav1.ConditionFalse, Reason: v1alpha1.WithinLimitsReason, Message: "Every requested replica runs."},
	}
	for i, c := range healthy {
		if e, ok := edit[c.Type]; ok {
			healthy[i] = e
		}
		if healthy[i].LastTransitionTime.IsZero() {
			healthy[i].LastTransitionTime = ago(3 * time.Hour)
		}
	}
	return healthy
}

// runningStatus is the status of an inbox whose two consumers run engine v1.0.0.
func runningStatus(name string) *v1alpha1.SequentialInboxStatus {
	return &v1alpha1.SequentialInboxStatus{
		ObservedGeneration: 1, Conditions: conditions(nil), SchemaVersion: 9,
		RunningEngineVersion: "v1.0.0", RunningClaimProtocol: "insert-first-v1",
		TargetEngineVersion: "v1.0.0", TargetClaimProtocol: "insert-first-v1", TargetImage: "ghcr.io/seqinbox/seqinbox:v1.0.0",
		Replicas: 2, ReplicasReady: 2, Selector: selectorOf(name),
		Consumers: &v1alpha1.ConsumersStatus{UpdatedAt: ago(20 * time.Second), Lag: 12,
			WaitingMessages: ptr.To(int64(4)), OldestWaitingSince: ptr.To(ago(12 * time.Minute)), InstancesExpiringSoon: ptr.To(int64(1)),
			WaitingByType: []v1alpha1.WaitingTypeStatus{
				{Type: "OrderShipped", Count: 3, OldestSince: ptr.To(ago(12 * time.Minute))},
				{Type: "OrderValidated.STOCK_AVAILABLE", Count: 1, OldestSince: ptr.To(ago(2 * time.Minute))},
			},
			Pods: []v1alpha1.ConsumerPodStatus{
				{Name: name + "-consumer-0", Ready: true, Partitions: "orders[0,1]", Lag: 5},
				{Name: name + "-consumer-1", Ready: true, Partitions: "orders[2,3]", Lag: 7},
			}},
	}
}

// awaitingApprovalStatus is the status of a Supervised inbox whose rollout to v2.0.0 waits for approval.
func awaitingApprovalStatus(name string) *v1alpha1.SequentialInboxStatus {
	st := runningStatus(name)
	st.TargetEngineVersion, st.TargetClaimProtocol, st.TargetImage = "v2.0.0", "insert-first-v2", "ghcr.io/seqinbox/seqinbox:v2.0.0"
	blocked := "Engine v2.0.0 (claim protocol insert-first-v2) cannot run next to the running engine v1.0.0 (claim protocol insert-first-v1, " +
		"group protocol seqinbox-insert-first-v1); the Supervised rollout stops the old consumers once approved: " +
		"kubectl annotate sequentialinbox " + name + " inbox.seqinbox.dev/approve-rollout=v2.0.0"
	st.Conditions = conditions(map[string]metav1.Condition{
		v1alpha1.ConditionRolloutBlocked: {Type: v1alpha1.ConditionRolloutBlocked, Status: metav1.ConditionTrue, Reason: v1alpha1.AwaitingApprovalReason,
			Message: blocked, LastTransitionTime: ago(5 * time.Minute)},
		v1alpha1.ConditionProgressing: {Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: v1alpha1.AwaitingApprovalReason,
			Message: blocked, LastTransitionTime: ago(5 * time.Minute)},
	})
	st.ObservedGeneration = 1
	return st
}

// consumerPod creates a running consumer pod of the inbox with restarts container restarts.
func consumerPod(t *testing.T, inbox *v1alpha1.SequentialInbox, name string, restarts int32) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: inbox.Namespace, Labels: map[string]string{
			"app.kubernetes.io/name": "seqinbox", "app.kubernetes.io/instance": inbox.Name, "app.kubernetes.io/component": "consumer"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "consumer", Image: "ghcr.io/seqinbox/seqinbox:v1.0.0",
			Env: []corev1.EnvVar{{Name: "SEQINBOX_DATABASE_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: inbox.Name + "-database"}, Key: "url"}}}}}}},
	}
	must(t, k8s.Create(t.Context(), pod))
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "consumer", Ready: true, RestartCount: restarts}}}
	must(t, k8s.Status().Update(t.Context(), pod))
}

// inboxEvent records an event about the inbox, last seen d before testNow.
func inboxEvent(t *testing.T, inbox *v1alpha1.SequentialInbox, name, typ, reason, message string, d time.Duration, count int32) {
	t.Helper()
	must(t, k8s.Create(t.Context(), &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: inbox.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "SequentialInbox", APIVersion: v1alpha1.GroupVersion.String(),
			Namespace: inbox.Namespace, Name: inbox.Name, UID: inbox.UID},
		Type: typ, Reason: reason, Message: message, Count: count, Source: corev1.EventSource{Component: "seqinbox-operator"},
		FirstTimestamp: ago(d + time.Minute), LastTimestamp: ago(d),
	}))
}

// statusStates arrange the inbox states of the golden tests, each in a namespace of its own.
var statusStates = []struct {
	name    string
	arrange func(t *testing.T, ns string)
}{
	{"healthy", func(t *testing.T, ns string) {
		inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
		consumerPod(t, inbox, "order-inbox-consumer-0", 0)
		consumerPod(t, inbox, "order-inbox-consumer-1", 0)
		inboxEvent(t, inbox, "e1", corev1.EventTypeNormal, "MigrationSucceeded", "Job order-inbox-migration-4f2a-1 migrated the schema to version 9.", 3*time.Hour, 1)
		inboxEvent(t, inbox, "e2", corev1.EventTypeNormal, "RolledOut", "2 consumers of engine v1.0.0 are available.", 170*time.Minute, 1)
	}},
	{"degraded-blocked", func(t *testing.T, ns string) {
		st := runningStatus("order-inbox")
		since := ago(7 * time.Minute)
		st.Conditions = conditions(map[string]metav1.Condition{v1alpha1.ConditionDegraded: {Type: v1alpha1.ConditionDegraded,
			Status: metav1.ConditionTrue, Reason: v1alpha1.PartitionBlockedReason, LastTransitionTime: ago(2 * time.Minute),
			Message: "Consumer order-inbox-consumer-0 has retried orders[1] at offset 4711 since 2026-12-01T11:53:00Z: store state: connection refused."}})
		st.ReplicasReady = 1
		st.Consumers.Lag, st.Consumers.DeadLettersLastHour = 2412, 3
		st.Consumers.DeadLettersLastHourByReason = []v1alpha1.DeadLetterReasonCount{{Reason: "InvalidJSON", Count: 2}, {Reason: "ListenerFailed", Count: 1}}
		st.Consumers.Pods[0].Lag, st.Consumers.Pods[0].Blocked = 2400, &v1alpha1.BlockedRecord{Topic: "orders", Partition: 1, Offset: 4711, Since: since,
			Error: "store state: dial tcp 10.0.0.5:5432: connect: connection refused"}
		st.Consumers.Pods[1].Ready, st.Consumers.Pods[1].Reason = false, "joining the consumer group"
		st.Consumers.Pods[1].Unreachable = `Get "https://10.0.1.7:8443/state": context deadline exceeded`
		inbox := createInbox(t, ns, "order-inbox", nil, st)
		consumerPod(t, inbox, "order-inbox-consumer-0", 0)
		consumerPod(t, inbox, "order-inbox-consumer-1", 3)
		inboxEvent(t, inbox, "e1", corev1.EventTypeWarning, v1alpha1.PartitionBlockedReason,
			"Consumer order-inbox-consumer-0 has retried orders[1] at offset 4711 since 2026-12-01T11:53:00Z.", 2*time.Minute, 1)
	}},
	{"awaiting-approval", func(t *testing.T, ns string) {
		inbox := createInbox(t, ns, "order-inbox", func(in *v1alpha1.SequentialInbox) { in.Spec.UpgradeStrategy = v1alpha1.UpgradeSupervised },
			awaitingApprovalStatus("order-inbox"))
		consumerPod(t, inbox, "order-inbox-consumer-0", 0)
		consumerPod(t, inbox, "order-inbox-consumer-1", 0)
		inboxEvent(t, inbox, "e1", corev1.EventTypeNormal, "ProbeSucceeded", "Image ghcr.io/seqinbox/seqinbox:v2.0.0 speaks engine v2.0.0, claim protocol insert-first-v2.", 5*time.Minute, 1)
		inboxEvent(t, inbox, "e2", corev1.EventTypeNormal, v1alpha1.AwaitingApprovalReason, "The rollout to v2.0.0 waits for approval.", time.Minute, 4)
	}},
	{"many-types-and-reasons", func(t *testing.T, ns string) {
		st := runningStatus("order-inbox")
		st.Consumers.WaitingMessages, st.Consumers.OldestWaitingSince = ptr.To(int64(61)), ptr.To(ago(3*time.Hour))
		st.Consumers.WaitingByType = nil
		for i, typ := range []string{"OrderShipped", "OrderDelivered", "OrderPaid", "InvoiceSent", "RefundIssued", "OrderValidated.STOCK_AVAILABLE", "ReturnReceived"} {
			st.Consumers.WaitingByType = append(st.Consumers.WaitingByType,
				v1alpha1.WaitingTypeStatus{Type: typ, Count: int64(20 - 3*i), OldestSince: ptr.To(ago(time.Duration(3*60-20*i) * time.Minute))})
		}
		st.Consumers.DeadLettersLastHour = 21
		for i, reason := range []string{"ListenerFailed", "InvalidJSON", "UndeclaredType", "MissingIdempotenceID", "SequenceDeleted", "RecordRejected"} {
			st.Consumers.DeadLettersLastHourByReason = append(st.Consumers.DeadLettersLastHourByReason, v1alpha1.DeadLetterReasonCount{Reason: reason, Count: int64(6 - i)})
		}
		inbox := createInbox(t, ns, "order-inbox", nil, st)
		consumerPod(t, inbox, "order-inbox-consumer-0", 0)
		consumerPod(t, inbox, "order-inbox-consumer-1", 0)
	}},
	{"no-consumers", func(t *testing.T, ns string) {
		createInbox(t, ns, "order-inbox", func(in *v1alpha1.SequentialInbox) { in.Spec.Replicas = ptr.To(int32(0)) }, nil)
	}},
}

func TestStatusScreenOfEachInboxStateMatchesItsGoldenFile(t *testing.T) {
	for _, state := range statusStates {
		t.Run(state.name, func(t *testing.T) {
			ns := namespace(t, "status-"+state.name)
			state.arrange(t, ns)
			r := plugin(t, testNow, "", "status", "order-inbox", "-n", ns)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if strings.Contains(r.stdout, "\x1b[") {
				t.Errorf("the output to a non-terminal has colour codes:\n%s", r.stdout)
			}
			golden := filepath.Join("testdata", "status", state.name+".txt")
			if *update {
				must(t, os.MkdirAll(filepath.Dir(golden), 0o755))
				must(t, os.WriteFile(golden, []byte(r.stdout), 0o644))
			}
			want, err := os.ReadFile(golden)
			must(t, err)
			if r.stdout != string(want) {
				t.Errorf("status screen differs from %s (go test ./internal/plugin -run Status -update rewrites it):\n--- got\n%s--- want\n%s", golden, r.stdout, want)
			}
		})
	}
}

// TestStatusAsJSONAndYAMLIsTheDataOfTheScreen checks that -o json and -o yaml print the gathered
// struct: the blocked record, the unreachable consumer and the Degraded condition of the screen.
func TestStatusAsJSONAndYAMLIsTheDataOfTheScreen(t *testing.T) {
	ns := "status-degraded-blocked"
	for _, format := range []string{"json", "yaml"} {
		r := plugin(t, testNow, "", "status", "order-inbox", "-n", ns, "-o", format)
		if r.code != 0 {
			t.Fatalf("-o %s: exit %d, stderr %q", format, r.code, r.stderr)
		}
		var st Status
		data := []byte(r.stdout)
		if format == "yaml" {
			var err error
			data, err = yaml.YAMLToJSON(data)
			must(t, err)
		}
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatalf("-o %s is not the status: %v\n%s", format, err, r.stdout)
		}
		if len(st.Consumers) != 2 || st.Consumers[0].Blocked == nil || st.Consumers[0].Blocked.Offset != 4711 ||
			st.Consumers[1].Unreachable == "" || st.Consumers[1].Restarts != 3 {
			t.Errorf("-o %s consumers = %+v", format, st.Consumers)
		}
		if len(st.Attention) != 1 || st.Attention[0].Reason != v1alpha1.PartitionBlockedReason || st.DeadLettersLastHour != 3 || st.Lag != 2412 {
			t.Errorf("-o %s attention %+v, dead letters %d, lag %d", format, st.Attention, st.DeadLettersLastHour, st.Lag)
		}
	}
	if r := plugin(t, testNow, "", "status", "order-inbox", "-n", ns, "-o", "wide"); r.code != 2 || !strings.Contains(r.stderr, `--output "wide": use json or yaml`) {
		t.Errorf("-o wide: exit %d, stderr %q; want a usage error naming the formats", r.code, r.stderr)
	}
}

func TestStatusOfAMissingInboxSaysHowToListThem(t *testing.T) {
	r := plugin(t, testNow, "", "status", "no-such-inbox", "-n", "default")
	if r.code != 1 || !strings.Contains(r.stderr, `no SequentialInbox "no-such-inbox" in namespace "default": `+"`kubectl get sqi -n default`") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestStatusLeavesOutEventsOfAnEarlierInboxOfTheSameName(t *testing.T) {
	ns := namespace(t, "status-recreated")
	inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	inboxEvent(t, inbox, "old", corev1.EventTypeWarning, "MigrationFailed", "from the inbox before", time.Hour, 1)
	must(t, k8s.Delete(t.Context(), inbox))
	inbox = createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	inboxEvent(t, inbox, "new", corev1.EventTypeNormal, "MigrationSucceeded", "from this inbox", time.Minute, 1)
	r := plugin(t, testNow, "", "status", "order-inbox", "-n", ns)
	if r.code != 0 || strings.Contains(r.stdout, "from the inbox before") || !strings.Contains(r.stdout, "from this inbox") {
		t.Fatalf("exit %d, stdout:\n%s", r.code, r.stdout)
	}
}

// TestOnATerminalTheScreenIsColouredAndCutToItsWidth renders the degraded state for a terminal
// of 100 columns: the Degraded condition and the blocked record are red, and no line is wider
// than the terminal once the colour codes are taken out; the piped screen has the whole lines.
func TestOnATerminalTheScreenIsColouredAndCutToItsWidth(t *testing.T) {
	st := runningStatus("order-inbox")
	st.Conditions = conditions(map[string]metav1.Condition{v1alpha1.ConditionDegraded: {Type: v1alpha1.ConditionDegraded,
		Status: metav1.ConditionTrue, Reason: v1alpha1.PartitionBlockedReason, LastTransitionTime: ago(2 * time.Minute),
		Message: "Consumer order-inbox-consumer-0 has retried orders[1] at offset 4711 since 2026-12-01T11:53:00Z: store state: connection refused."}})
	st.Consumers.Pods[0].Blocked = &v1alpha1.BlockedRecord{Topic: "orders", Partition: 1, Offset: 4711, Since: ago(7 * time.Minute),
		Error: "store state: dial tcp 10.0.0.5:5432: connect: connection refused"}
	inbox := &v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Name: "order-inbox", Namespace: "shop", Generation: 1}, Status: *st}
	status := statusOf(inbox, testNow)
	status.Consumers = consumersOf(inbox, nil)

	var terminal, piped strings.Builder
	renderStatus(&terminal, screen{colour: true, width: 100}, status)
	renderStatus(&piped, screen{}, status)
	escape := regexp.MustCompile("\x1b\\[[0-9;]*m")
	for _, line := range strings.Split(strings.TrimRight(terminal.String(), "\n"), "\n") {
		if n := utf8.RuneCountInString(escape.ReplaceAllString(line, "")); n > 100 {
			t.Errorf("a line of %d columns on a terminal of 100:\n%s", n, line)
		}
	}
	for _, red := range []string{"\x1b[31mTrue\x1b[0m", "\x1b[31morders[1]@4711 retried for 7m"} {
		if !strings.Contains(terminal.String(), red) {
			t.Errorf("the terminal screen lacks %q:\n%s", red, terminal.String())
		}
	}
	if !strings.Contains(piped.String(), "store state: dial tcp 10.0.0.5:5432: connect: connection refused") || strings.Contains(piped.String(), "\x1b[") {
		t.Errorf("the piped screen is cut or coloured:\n%s", piped.String())
	}
	if escape.ReplaceAllString(terminal.String(), "") == piped.String() {
		t.Errorf("the terminal screen is not cut at all")
	}
}
