package plugin

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/cli"
)

// The exec of `seqinbox inspect` needs a kubelet and runs in test/e2e (case 4e); these tests
// prove what the API server alone decides, through the command line: which pod, which command
// line in it, and the errors before it runs. exec_test.go proves the pod choice and the rights.

// notReadyStatus is the status of an inbox whose consumers are not ready.
func notReadyStatus(name string) *v1alpha1.SequentialInboxStatus {
	st := runningStatus(name)
	st.ReplicasReady = 0
	st.Conditions = conditions(map[string]metav1.Condition{v1alpha1.ConditionReady: {Type: v1alpha1.ConditionReady,
		Status: metav1.ConditionFalse, Reason: v1alpha1.ConsumersUnavailableReason, Message: "0 of 2 consumers are ready."}})
	return st
}

func TestInspectWithoutAReadyConsumerPodSaysWhatKubectlGetSqiShows(t *testing.T) {
	ns := namespace(t, "inspect-none")
	inbox := createInbox(t, ns, "order-inbox", nil, notReadyStatus("order-inbox"))
	for _, pods := range []int{0, 1} {
		if pods == 1 {
			readyPod(t, inbox, "order-inbox-consumer-0", "ghcr.io/seqinbox/seqinbox:v1.0.0", "v1.0.0", false)
		}
		r := plugin(t, testNow, "", "inspect", "order-inbox", "-n", ns, "--context-id", "42")
		for _, want := range []string{
			fmt.Sprintf("kubectl seqinbox inspect: SequentialInbox inspect-none/order-inbox has no ready consumer pod (of %d) to run the command in", pods),
			"`kubectl get sqi order-inbox -n inspect-none` shows READY False, REASON ConsumersUnavailable, REPLICAS 0",
			"`kubectl seqinbox status order-inbox -n inspect-none` shows why",
		} {
			if r.code != cli.ExitFailed || !strings.Contains(r.stderr, want) || r.stdout != "" {
				t.Errorf("%d pods: exit %d, stdout %q, stderr %q; want exit 1 and %q", pods, r.code, r.stdout, r.stderr, want)
			}
		}
	}
}

func TestInspectRunsSeqinboxInspectOnThePodsManifestWithTheRequestsFlags(t *testing.T) {
	tests := []struct {
		req  inspectRequest
		want []string
	}{
		{inspectRequest{contextID: "42"},
			[]string{"inspect", "-f", "/etc/seqinbox/inbox.yaml", "-o", "text", "--context-id", "42"}},
		{inspectRequest{contextID: "42", sequence: "order", output: "json"},
			[]string{"inspect", "-f", "/etc/seqinbox/inbox.yaml", "-o", "json", "--context-id", "42", "--sequence", "order"}},
		{inspectRequest{message: "OrderShipped/order-42-shipped", output: "yaml"},
			[]string{"inspect", "-f", "/etc/seqinbox/inbox.yaml", "-o", "yaml", "--message", "OrderShipped/order-42-shipped"}},
	}
	for _, tt := range tests {
		if got := tt.req.podCommand(); !slices.Equal(got.Args, tt.want) || got.Since != inspectSince || got.name() != "seqinbox inspect" {
			t.Errorf("%+v: %+v; want %q since %s", tt.req, got, tt.want, inspectSince)
		}
	}

	// The command goes as far as the exec in the ready pod: the API server answers for it, which
	// envtest never schedules, that it has no node.
	ns := namespace(t, "inspect-exec")
	inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	readyPod(t, inbox, "order-inbox-consumer-a", "ghcr.io/seqinbox/seqinbox:v1.0.0", "v1.0.0", false)
	readyPod(t, inbox, "order-inbox-consumer-b", "ghcr.io/seqinbox/seqinbox:v1.0.0", "v1.0.0", true)
	r := plugin(t, testNow, "", "inspect", "order-inbox", "-n", ns, "--context-id", "42")
	if r.code != cli.ExitFailed || !strings.Contains(r.stderr, "run `seqinbox inspect` in pod inspect-exec/order-inbox-consumer-b") ||
		!strings.Contains(r.stderr, "does not have a host assigned") {
		t.Fatalf("exec: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestInspectNamesTheImageAndVersionWhenThePodsEngineHasNoInspect(t *testing.T) {
	ns := namespace(t, "inspect-old")
	inbox := createInbox(t, ns, "order-inbox", nil, runningStatus("order-inbox"))
	readyPod(t, inbox, "order-inbox-consumer-0", "ghcr.io/seqinbox/seqinbox:v0.0.9", "v0.0.9", true)
	r := plugin(t, testNow, "", "inspect", "order-inbox", "-n", ns, "--message", "OrderPaid/order-42-paid")
	for _, want := range []string{"runs image ghcr.io/seqinbox/seqinbox:v0.0.9 (seqinbox v0.0.9), which lacks `seqinbox inspect`",
		"this needs an image of seqinbox " + inspectSince + " or later"} {
		if r.code != cli.ExitFailed || !strings.Contains(r.stderr, want) {
			t.Errorf("exit %d, stderr %q; want %q", r.code, r.stderr, want)
		}
	}
}

func TestInspectRefusesACommandLineWithoutInstanceOrMessage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"inspect", "order-inbox"}, "kubectl seqinbox inspect: --context-id or --message is required"},
		{[]string{"inspect", "order-inbox", "--message", "OrderPaid"}, `kubectl seqinbox inspect: --message "OrderPaid": name the message as TYPE/ID`},
		{[]string{"inspect", "--context-id", "42"}, "kubectl seqinbox inspect: takes the name of one SequentialInbox, got 0 arguments"},
		{[]string{"inspect", "order-inbox", "--context-id", "42", "-o", "wide"}, `kubectl seqinbox inspect: --output "wide"`},
	} {
		r := pluginWithoutCluster(t, tt.args...)
		if r.code != cli.ExitUsage || !strings.HasPrefix(r.stderr, tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and %q", tt.args, r.code, r.stderr, tt.want)
		}
	}
}
