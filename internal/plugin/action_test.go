package plugin

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/testenv/clustersim"
)

// Outcomes the stand-in kubelet gives an action Job, by the idempotence ID or context ID of its target.
const (
	targetMissing      = "missing"       // not recorded: no such message
	targetSinkRejects  = "sink-rejects"  // recorded, executed, and the sink rejected it
	targetNeverRunning = "never-running" // recorded; no consumer runs it
)

// actionJobReport is what `seqinbox action` in the Job's pod would report for its target: the
// consumers execute every recorded action, except for the targets above.
func actionJobReport(job *batchv1.Job) string {
	args := job.Spec.Template.Spec.Containers[0].Args
	flag := func(name string) string {
		if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
			return args[i+1]
		}
		return ""
	}
	r := controller.ActionReport{Action: flag("--action"), Recorded: true}
	id := flag("--idempotence-id")
	if id != "" {
		r.Target = "message " + flag("--type") + "/" + id
	} else {
		id = flag("--context-id")
		r.Target = "instance " + flag("--sequence") + "/" + id
	}
	switch id {
	case targetMissing:
		r.Recorded, r.Error = false, "no such message"
	case targetSinkRejects:
		r.Executed, r.Outcome, r.Detail = true, controller.OutcomeFailed, "the sink answered 500 Internal Server Error"
	case targetNeverRunning:
	default:
		r.Executed, r.Outcome, r.Detail = true, controller.OutcomeExecuted, "done"
	}
	b, _ := json.Marshal(r)
	return string(b)
}

// runOperator runs the operator's action reconciler against envtest, with clustersim playing
// the Job controller and the kubelet of its Jobs (the pod's report is actionJobReport's).
func runOperator(t *testing.T) {
	t.Helper()
	mgr, err := ctrl.NewManager(testEnv.Config, ctrl.Options{
		Scheme: scheme, Cache: controller.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	must(t, err)
	r := controller.NewReconciler(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("seqinbox-operator"),
		controller.Options{DefaultImage: "ghcr.io/seqinbox/seqinbox:v1.0.0", PollInterval: time.Second})
	must(t, controller.NewActionReconciler(r).SetupWithManager(mgr))
	must(t, clustersim.StartWithMessages(mgr, k8s, actionJobReport))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// actionsOf lists the actions of the namespace.
func actionsOf(t *testing.T, ns string) []v1alpha1.SequentialInboxAction {
	t.Helper()
	var list v1alpha1.SequentialInboxActionList
	must(t, k8s.List(t.Context(), &list, client.InNamespace(ns)))
	return list.Items
}

func TestEachActionCommandCreatesItsActionAndPrintsTheOutcomeOnceExecuted(t *testing.T) {
	runOperator(t)
	ns := namespace(t, "actions-executed")
	createInbox(t, ns, "order-inbox", nil, nil)
	tests := []struct {
		args     []string
		action   v1alpha1.ActionType
		message  *v1alpha1.ActionMessageTarget
		instance *v1alpha1.ActionInstanceTarget
	}{
		{[]string{"consume", "order-inbox", "OrderPaid/order-42-paid"}, v1alpha1.ActionConsume,
			&v1alpha1.ActionMessageTarget{Type: "OrderPaid", IdempotenceID: "order-42-paid"}, nil},
		// An idempotence ID may hold a slash: the type ends at the first one.
		{[]string{"expire", "order-inbox", "OrderValidated.STOCK_AVAILABLE/shop/42"}, v1alpha1.ActionExpire,
			&v1alpha1.ActionMessageTarget{Type: "OrderValidated.STOCK_AVAILABLE", IdempotenceID: "shop/42"}, nil},
		{[]string{"consume-all", "order-inbox", "order/42"}, v1alpha1.ActionConsumeAll, nil,
			&v1alpha1.ActionInstanceTarget{Sequence: "order", ContextID: "42"}},
		{[]string{"close", "order-inbox", "order/43"}, v1alpha1.ActionClose, nil,
			&v1alpha1.ActionInstanceTarget{Sequence: "order", ContextID: "43"}},
	}
	for i, tt := range tests {
		t.Run(tt.args[0], func(t *testing.T) {
			r := plugin(t, time.Now(), "", append(tt.args, "-n", ns)...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
			}
			actions := actionsOf(t, ns)
			if len(actions) != i+1 {
				t.Fatalf("%d actions in the namespace, want %d", len(actions), i+1)
			}
			a := actions[slices.IndexFunc(actions, func(a v1alpha1.SequentialInboxAction) bool { return a.Spec.Action == tt.action })]
			want := v1alpha1.SequentialInboxActionSpec{InboxName: "order-inbox", Action: tt.action, Message: tt.message, Instance: tt.instance}
			if !equalSpec(a.Spec, want) || !strings.HasPrefix(a.Name, "order-inbox-"+tt.args[0]+"-") {
				t.Fatalf("action %s spec %+v, want %+v", a.Name, a.Spec, want)
			}
			if a.Status.Phase != v1alpha1.ActionExecuted {
				t.Fatalf("the command returned while the action is %q", a.Status.Phase)
			}
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			if len(lines) != 2 || lines[0] != "sequentialinboxaction/"+a.Name+" created: "+string(tt.action)+" on "+describeTarget(want) ||
				!strings.HasPrefix(lines[1], "Executed: "+string(tt.action)+" on ") {
				t.Fatalf("stdout:\n%s", r.stdout)
			}
		})
	}
}

func equalSpec(a, b v1alpha1.SequentialInboxActionSpec) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func TestAFailedActionExitsOneWithItsReason(t *testing.T) {
	runOperator(t)
	ns := namespace(t, "actions-failed")
	createInbox(t, ns, "order-inbox", nil, nil)
	for _, tt := range []struct{ target, reason string }{
		{"OrderPaid/" + targetMissing, v1alpha1.NotRecordedReason},
		{"OrderPaid/" + targetSinkRejects, v1alpha1.ExecutionFailedReason},
	} {
		r := plugin(t, time.Now(), "", "consume", "order-inbox", tt.target, "-n", ns)
		if r.code != 1 || !strings.HasPrefix(r.stderr, "kubectl seqinbox consume: sequentialinboxaction/order-inbox-consume-") ||
			!strings.Contains(r.stderr, " failed ("+tt.reason+"): ") || !strings.Contains(r.stdout, "Failed: ") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and the reason %s", tt.target, r.code, r.stdout, r.stderr, tt.reason)
		}
	}
}

func TestNoWaitReturnsOnceCreatedAndWaitingEndsAtTheTimeout(t *testing.T) {
	runOperator(t)
	ns := namespace(t, "actions-nowait")
	createInbox(t, ns, "order-inbox", nil, nil)
	// No consumer ever runs these actions: the operator would look again for as long as they exist.
	t.Cleanup(func() {
		must(t, k8s.DeleteAllOf(context.Background(), &v1alpha1.SequentialInboxAction{}, client.InNamespace(ns)))
	})

	r := plugin(t, time.Now(), "", "consume", "order-inbox", "OrderPaid/"+targetNeverRunning, "-n", ns, "--no-wait")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, " created: Consume on message OrderPaid/never-running") {
		t.Fatalf("--no-wait: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if a := actionsOf(t, ns); len(a) != 1 || a[0].Status.Phase == v1alpha1.ActionExecuted || a[0].Status.Phase == v1alpha1.ActionFailed {
		t.Fatalf("actions after --no-wait: %+v", a)
	}

	r = plugin(t, time.Now(), "", "close", "order-inbox", "order/"+targetNeverRunning, "-n", ns, "--timeout", "3s")
	if r.code != 1 || !strings.Contains(r.stderr, "after 3s") || !strings.Contains(r.stderr, "it stays requested, `kubectl get sqia order-inbox-close-") {
		t.Fatalf("--timeout 3s: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestActionAsJSONIsTheFinalResource(t *testing.T) {
	runOperator(t)
	ns := namespace(t, "actions-json")
	createInbox(t, ns, "order-inbox", nil, nil)
	r := plugin(t, time.Now(), "", "expire", "order-inbox", "OrderPaid/order-7", "-n", ns, "-o", "json")
	var a v1alpha1.SequentialInboxAction
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &a) != nil {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if a.Kind != "SequentialInboxAction" || a.Status.Phase != v1alpha1.ActionExecuted || a.Spec.Message.IdempotenceID != "order-7" || a.ManagedFields != nil {
		t.Fatalf("printed %+v", a)
	}
}

func TestActionCommandLinesThatNameNoTargetAreUsageErrorsAndCreateNothing(t *testing.T) {
	ns := namespace(t, "actions-usage")
	createInbox(t, ns, "order-inbox", nil, nil)
	for _, args := range [][]string{
		{"consume", "order-inbox", "OrderPaid"},
		{"expire", "order-inbox", "/order-42"},
		{"close", "order-inbox", "order/"},
		{"consume-all", "order-inbox"},
		{"consume", "order-inbox", "OrderPaid/1", "extra"},
	} {
		r := plugin(t, time.Now(), "", append(args, "-n", ns)...)
		if r.code != 2 || !strings.Contains(r.stderr, "Run 'kubectl seqinbox "+args[0]+" --help' for usage.") {
			t.Errorf("%q: exit %d, stderr %q; want a usage error", args, r.code, r.stderr)
		}
	}
	r := plugin(t, time.Now(), "", "consume", "other-inbox", "OrderPaid/order-42-paid", "-n", ns)
	if r.code != 1 || !strings.Contains(r.stderr, `no SequentialInbox "other-inbox" in namespace "actions-usage"`) {
		t.Errorf("missing inbox: exit %d, stderr %q", r.code, r.stderr)
	}
	if a := actionsOf(t, ns); len(a) != 0 {
		t.Fatalf("%d actions were created by wrong command lines", len(a))
	}
}
