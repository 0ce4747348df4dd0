package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/internal/testenv/clustersim"
	"github.com/seqinbox/seqinbox/migrations"
)

// The tests run against a real kube-apiserver and etcd (envtest). envtest runs no kubelet and no
// controllers: where the operator waits for the Job controller, the Deployment controller or a
// kubelet, the tests play their part — they create a Job's pod with a terminated container whose
// termination message is the migrate report, mark the Job Complete or Failed, create and delete
// consumer pods and set the Deployment's status — and say so where they do.

var (
	testConfig *rest.Config
	testScheme = runtime.NewScheme()
	// k8s is an uncached client: a test sees every write at once.
	k8s client.Client
	// recorder writes real Events (events.k8s.io/v1) to the API server.
	recorder events.EventRecorder
)

// Images of the tests and what they speak; the "kubelet" answers a probe or migration Job with
// the report of the Job's image.
var (
	imageV1      = "ghcr.io/seqinbox/seqinbox:v1.0.0"
	imageV1Patch = "ghcr.io/seqinbox/seqinbox:v1.0.1"
	imageV2      = "ghcr.io/seqinbox/seqinbox:v2.0.0"
	// imageBeforeState is a release from before the consumers served their state: its consume
	// command knows no --state-bind-address.
	imageBeforeState = "ghcr.io/seqinbox/seqinbox:v0.0.9"
	engines          = map[string]engine{
		imageV1:          {Image: imageV1, Version: "v1.0.0", ClaimProtocol: "insert-first-v1"},
		imageV1Patch:     {Image: imageV1Patch, Version: "v1.0.1", ClaimProtocol: "insert-first-v1"},
		imageV2:          {Image: imageV2, Version: "v2.0.0", ClaimProtocol: "insert-first-v2"},
		imageBeforeState: {Image: imageBeforeState, Version: "v0.0.9", ClaimProtocol: "insert-first-v1"},
	}
)

func TestMain(m *testing.M) {
	os.Exit(runWithAPIServer(m))
}

func runWithAPIServer(m *testing.M) int {
	env, err := testenv.APIServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start envtest:", err)
		return 2
	}
	defer func() { _ = env.Stop() }()
	testConfig = cfg
	_ = clientgoscheme.AddToScheme(testScheme)
	_ = v1alpha1.AddToScheme(testScheme)
	if k8s, err = client.New(cfg, client.Options{Scheme: testScheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: clientset.EventsV1()})
	stop := make(chan struct{})
	broadcaster.StartRecordingToSink(stop)
	defer func() { close(stop); broadcaster.Shutdown() }()
	recorder = broadcaster.NewRecorder(testScheme, fieldOwner)
	return m.Run()
}

// harness is one test's namespace, Kafka cluster, fake clock and reconciler.
type harness struct {
	t     *testing.T
	ctx   context.Context
	ns    string
	seeds []string
	clock *clocktesting.FakeClock
	r     *Reconciler
}

const (
	testRetryBase    = 10 * time.Second
	testRetryMax     = 80 * time.Second
	testPollInterval = 5 * time.Second
)

func newHarness(t *testing.T) *harness {
	t.Helper()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	h := &harness{t: t, ctx: t.Context(), ns: "t-" + hex.EncodeToString(suffix), seeds: testenv.Kafka(t, 4, "orders"),
		clock: clocktesting.NewFakeClock(time.Now().Truncate(time.Second))}
	h.must(k8s.Create(h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}))
	h.must(k8s.Create(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: h.ns},
		StringData: map[string]string{"url": "postgres://inbox@db.example:5432/orders"}}))
	h.r = NewReconciler(k8s, k8s, recorder, Options{DefaultImage: imageV1, Clock: h.clock,
		RetryBase: testRetryBase, RetryMax: testRetryMax, PollInterval: testPollInterval})
	return h
}

func (h *harness) must(err error) {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
}

// validSpec is an inbox of two sequences whose release conditions form chains.
func (h *harness) validSpec() v1alpha1.SequentialInboxSpec {
	ref := func(name, key string) corev1.SecretKeySelector {
		return corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}
	}
	hour := v1alpha1.Duration{Duration: time.Hour}
	return v1alpha1.SequentialInboxSpec{
		Kafka:    v1alpha1.KafkaSpec{BootstrapServers: h.seeds, Topics: []string{"orders"}, ConsumerGroup: "orders-" + h.ns},
		Database: v1alpha1.DatabaseSpec{URLSecretRef: ref("db", "url")},
		Sink:     v1alpha1.SinkSpec{URL: "http://orders.shop.svc:8080/events"},
		Replicas: ptr.To(int32(2)),
		Sequences: []v1alpha1.SequenceSpec{
			{Name: "order", Retention: hour, Messages: []v1alpha1.MessageSpec{
				{Type: "OrderCreated"},
				{Type: "OrderPaid", ReleaseCondition: &v1alpha1.ReleaseCondition{Predecessor: "OrderCreated"}},
				{Type: "OrderShipped", ReleaseCondition: &v1alpha1.ReleaseCondition{And: []v1alpha1.ReleaseConditionTerm{
					{Predecessor: "OrderCreated"}, {Predecessor: "OrderPaid"}}}},
			}},
			{Name: "invoice", Retention: hour, Messages: []v1alpha1.MessageSpec{
				{Type: "InvoiceIssued"},
				{Type: "InvoicePaid", ReleaseCondition: &v1alpha1.ReleaseCondition{Predecessor: "InvoiceIssued"}},
			}},
		},
	}
}

// create creates an inbox with the valid spec, changed by edit.
func (h *harness) create(name string, edit func(*v1alpha1.SequentialInbox)) *v1alpha1.SequentialInbox {
	h.t.Helper()
	inbox := &v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns}, Spec: h.validSpec()}
	if edit != nil {
		edit(inbox)
	}
	h.must(k8s.Create(h.ctx, inbox))
	return inbox
}

func (h *harness) get(name string) *v1alpha1.SequentialInbox {
	h.t.Helper()
	var inbox v1alpha1.SequentialInbox
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &inbox))
	return &inbox
}

// update changes an inbox (spec or annotations), retrying on conflicts.
func (h *harness) update(name string, edit func(*v1alpha1.SequentialInbox)) {
	h.t.Helper()
	for {
		inbox := h.get(name)
		edit(inbox)
		err := k8s.Update(h.ctx, inbox)
		if !apierrors.IsConflict(err) {
			h.must(err)
			return
		}
	}
}

// reconcile runs one pass, as the controller would after a watch event.
func (h *harness) reconcile(name string) ctrl.Result {
	h.t.Helper()
	res, err := h.r.Reconcile(h.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: h.ns, Name: name}})
	if err != nil {
		h.t.Fatalf("reconcile %s: %v", name, err)
	}
	return res
}

func (h *harness) condition(name, typ string) metav1.Condition {
	h.t.Helper()
	c := meta.FindStatusCondition(h.get(name).Status.Conditions, typ)
	if c == nil {
		h.t.Fatalf("%s has no %s condition", name, typ)
	}
	return *c
}

// expectCondition asserts a condition's status and reason, and that its message mentions each of mentions.
func (h *harness) expectCondition(name, typ string, status metav1.ConditionStatus, reason string, mentions ...string) metav1.Condition {
	h.t.Helper()
	c := h.condition(name, typ)
	if c.Status != status || c.Reason != reason {
		h.t.Fatalf("%s %s = %s/%s (%s), want %s/%s", name, typ, c.Status, c.Reason, c.Message, status, reason)
	}
	for _, m := range mentions {
		if !strings.Contains(c.Message, m) {
			h.t.Errorf("%s %s message %q does not mention %q", name, typ, c.Message, m)
		}
	}
	return c
}

func (h *harness) jobs(name, component string) []batchv1.Job {
	h.t.Helper()
	var jobs batchv1.JobList
	h.must(k8s.List(h.ctx, &jobs, client.InNamespace(h.ns), client.MatchingLabels{labelInstance: name, labelComponent: component}))
	return jobs.Items
}

// onlyJob returns the one unfinished Job of a component.
func (h *harness) onlyJob(name, component string) *batchv1.Job {
	h.t.Helper()
	var open []batchv1.Job
	for _, j := range h.jobs(name, component) {
		if finished, _, _ := jobFinished(&j); !finished {
			open = append(open, j)
		}
	}
	if len(open) != 1 {
		h.t.Fatalf("%s has %d unfinished %s Jobs, want 1", name, len(open), component)
	}
	return &open[0]
}

// reportOf is what `seqinbox migrate` of the Job's image reports.
func reportOf(job *batchv1.Job, live ...migrations.LiveConsumer) migrations.Report {
	e := engines[job.Spec.Template.Spec.Containers[0].Image]
	return migrations.Report{SchemaVersion: 3, Applied: []int{}, Pending: []int{}, ClaimProtocol: e.ClaimProtocol,
		EngineVersion: e.Version, LiveConsumers: live, DryRun: strings.Contains(strings.Join(job.Spec.Template.Spec.Containers[0].Args, " "), "--dry-run")}
}

func (h *harness) completeJob(job *batchv1.Job, live ...migrations.LiveConsumer) {
	h.t.Helper()
	h.must(clustersim.CompleteJob(h.ctx, k8s, job, reportOf(job, live...)))
}

func (h *harness) failJob(job *batchv1.Job, message string) {
	h.t.Helper()
	h.must(clustersim.FailJob(h.ctx, k8s, job, message))
}

func (h *harness) deployment(name string) *appsv1.Deployment {
	h.t.Helper()
	var d appsv1.Deployment
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name + "-consumer"}, &d))
	return &d
}

func (h *harness) noDeployment(name string) {
	h.t.Helper()
	var d appsv1.Deployment
	err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name + "-consumer"}, &d)
	if !apierrors.IsNotFound(err) {
		h.t.Fatalf("Deployment of %s exists (err %v); nothing may run yet", name, err)
	}
}

func (h *harness) rollOut(name string) {
	h.t.Helper()
	h.must(clustersim.RollOut(h.ctx, k8s, h.deployment(name)))
}

// startConsumerPods plays the ReplicaSet controller: pods of the inbox's consumers exist.
func (h *harness) startConsumerPods(name string, n int) []string {
	h.t.Helper()
	inbox := h.get(name)
	var names []string
	for i := range n {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-consumer-%d", name, i), Namespace: h.ns, Labels: objectLabels(inbox, componentConsumer)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: consumerContainer, Image: imageV1}}},
		}
		h.must(k8s.Create(h.ctx, pod))
		names = append(names, pod.Name)
	}
	return names
}

// deletePods plays the kubelet: the pods terminated and are gone.
func (h *harness) deletePods(names ...string) {
	h.t.Helper()
	for _, n := range names {
		h.must(k8s.Delete(h.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: h.ns}}, client.GracePeriodSeconds(0)))
	}
}

// bringUp drives a new inbox to Ready: probe, migration, Deployment rolled out.
func (h *harness) bringUp(name string) {
	h.t.Helper()
	h.reconcile(name)
	h.completeJob(h.onlyJob(name, componentProbe))
	h.reconcile(name)
	h.completeJob(h.onlyJob(name, componentMigration))
	h.reconcile(name)
	h.rollOut(name)
	h.reconcile(name)
	h.expectCondition(name, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason)
}

// events returns the notes of the Events about an inbox with the reason, waiting until at
// least one arrived (the recorder writes asynchronously).
func (h *harness) events(name, reason string) []string {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var list eventsv1.EventList
		h.must(k8s.List(h.ctx, &list, client.InNamespace(h.ns)))
		var notes []string
		for _, e := range list.Items {
			if e.Regarding.Name == name && e.Reason == reason {
				notes = append(notes, e.Note)
			}
		}
		if len(notes) > 0 || time.Now().After(deadline) {
			return notes
		}
		time.Sleep(50 * time.Millisecond)
	}
}
