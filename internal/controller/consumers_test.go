package controller

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/consumerstate"
)

// stateServer is a consumer pod's state endpoint, played by the real server of internal/
// consumerstate on the loopback interface with the credentials of a Secret, as a consumer serves
// it from the Secret mounted into its pod; the test sets the state it serves.
type stateServer struct {
	dir  string
	addr string

	mu    sync.Mutex
	state consumerstate.State
	reads int
	// oldestArrival, when set, makes the served oldest waiting age grow with clock, as a real
	// message's does.
	oldestArrival time.Time
	clock         clock.PassiveClock
}

func (s *stateServer) set(edit func(*consumerstate.State)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	edit(&s.state)
}

func (s *stateServer) readCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// mount writes a credentials Secret's data where the server reads its files, as the kubelet
// updates a mounted Secret.
func (s *stateServer) mount(t *testing.T, data map[string][]byte) {
	t.Helper()
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(s.dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// serveState starts a state endpoint with the given credentials.
func serveState(t *testing.T, data map[string][]byte, state consumerstate.State) *stateServer {
	t.Helper()
	s := &stateServer{dir: t.TempDir(), state: state}
	s.mount(t, data)
	files := consumerstate.Files{Dir: s.dir}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0), Handler: files.Handler(func(context.Context) consumerstate.State {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reads++
		if st := s.state; st.Database != nil && !s.oldestArrival.IsZero() {
			db := *st.Database
			db.OldestWaitingSeconds = s.clock.Since(s.oldestArrival).Seconds()
			// The oldest of all is an OrderPaid; the InvoicePaid arrived a minute later.
			db.OldestWaitingSecondsByType = map[string]float64{"OrderPaid": db.OldestWaitingSeconds, "InvoicePaid": db.OldestWaitingSeconds - 60}
			st.Database = &db
			return st
		}
		return s.state
	})}
	go func() { _ = srv.Serve(tls.NewListener(ln, files.TLSConfig())) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

// credentials returns the data of the inbox's consumer state Secret, which the operator created.
func (h *harness) credentials(name string) map[string][]byte {
	h.t.Helper()
	var secret corev1.Secret
	h.must(k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name + "-consumer-state"}, &secret))
	return secret.Data
}

// startReadablePod plays the ReplicaSet controller and the kubelet: a running consumer pod of the
// inbox whose state port is the server's.
func (h *harness) startReadablePod(name, pod string, srv *stateServer) {
	h.t.Helper()
	_, portText, _ := net.SplitHostPort(srv.addr)
	port, _ := strconv.Atoi(portText)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: h.ns, Labels: objectLabels(h.get(name), componentConsumer)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: consumerContainer, Image: imageV1,
			Ports: []corev1.ContainerPort{{Name: statePortName, ContainerPort: int32(port)}}}}},
	}
	h.must(k8s.Create(h.ctx, p))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}}}
	h.must(k8s.Status().Update(h.ctx, p))
}

// consumerState is a ready consumer of the test build holding the partitions with their lag.
func consumerState(pod string, lag ...int64) consumerstate.State {
	st := consumerstate.State{Instance: pod, Ready: true, EngineVersion: "v1.0.0", ClaimProtocol: "insert-first-v1"}
	for i, l := range lag {
		st.Partitions = append(st.Partitions, consumerstate.Partition{Topic: "orders", Partition: int32(i), Lag: l})
	}
	return st
}

// poll runs one round of the consumer state poller, as its loop does every StatePollInterval, and
// reports whether it asked for a pass of the inbox.
func (h *harness) poll(name string) bool {
	h.t.Helper()
	return slices.Contains(h.r.pollConsumers(h.ctx), client.ObjectKey{Namespace: h.ns, Name: name})
}

// allJobs lists every Job of the test's namespace.
func (h *harness) allJobs() []batchv1.Job {
	h.t.Helper()
	var jobs batchv1.JobList
	h.must(k8s.List(h.ctx, &jobs, client.InNamespace(h.ns)))
	return jobs.Items
}

func TestConsumersServeTheirStateWithCredentialsTheOperatorMadeAndMountedIntoTheirPods(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	data := h.credentials("orders")
	if _, err := consumerstate.NewClient(data, time.Second); err != nil || len(data[consumerstate.KeyKey]) == 0 {
		t.Fatalf("consumer state Secret %v: %v", mapKeys(data), err)
	}
	pod := h.deployment("orders").Spec.Template.Spec
	c := pod.Containers[0]
	args := strings.Join(c.Args, " ")
	if !strings.Contains(args, "--state-bind-address :8443") || !strings.Contains(args, "--state-credentials-dir "+stateDir) {
		t.Errorf("consumer args %q do not serve the state", args)
	}
	var mounted bool
	for _, v := range pod.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "orders-consumer-state" {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("the pods do not mount orders-consumer-state: %+v", pod.Volumes)
	}
	// A second pass keeps the credentials: the running pods hold them.
	h.reconcile("orders")
	if again := h.credentials("orders"); string(again[consumerstate.TokenKey]) != string(data[consumerstate.TokenKey]) {
		t.Fatalf("the credentials changed on a second pass")
	}
}

func TestARecordRetriedPastTheThresholdDegradesTheInboxAtTheNextReadAndClearsAtTheOneAfter(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	jobsBefore := len(h.allJobs())
	data := h.credentials("orders")
	s0 := serveState(t, data, consumerState("orders-consumer-0", 5, 7))
	s1 := serveState(t, data, consumerState("orders-consumer-1", 0, 0))
	h.startReadablePod("orders", "orders-consumer-0", s0)
	h.startReadablePod("orders", "orders-consumer-1", s1)
	h.reconcile("orders") // the pod events' pass lists the pods to read
	if h.poll("orders") {
		t.Fatal("the poller asked for a pass although nothing the pass writes changed")
	}
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)

	// The record crosses the threshold 5s after this read: the next read, one StatePollInterval
	// later, asks for the pass that names it.
	since := h.clock.Now().Add(-h.r.BlockedThreshold + 5*time.Second)
	s0.set(func(st *consumerstate.State) {
		st.Blocked = &consumerstate.Blocked{Topic: "orders", Partition: 1, Offset: 1234, Since: since,
			Error: "claim OrderCreated/o-1: ERROR: out of resources (SQLSTATE 53000)"}
	})
	h.clock.Step(h.r.StatePollInterval)
	if !h.poll("orders") {
		t.Fatal("the poller did not ask for a pass when a record crossed the threshold")
	}
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.PartitionBlockedReason,
		"orders-consumer-0", "offset 1234", "orders[1]", "SQLSTATE 53000", since.UTC().Format(time.RFC3339))
	h.expectCondition("orders", v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ConsumersReadyReason)
	if notes := h.events("orders", v1alpha1.PartitionBlockedReason); len(notes) != 1 {
		t.Errorf("PartitionBlocked events %q, want one", notes)
	}
	// While it stays blocked the condition does not change: no pass is asked for, and a pass
	// (a pod event) writes nothing.
	rv := h.get("orders").ResourceVersion
	h.clock.Step(h.r.StatePollInterval)
	if h.poll("orders") {
		t.Error("the poller asked for a pass while the same record stays blocked")
	}
	h.reconcile("orders")
	if got := h.get("orders").ResourceVersion; got != rv {
		t.Errorf("status written again while the same record stays blocked")
	}

	s0.set(func(st *consumerstate.State) { st.Blocked = nil })
	h.clock.Step(h.r.StatePollInterval)
	if !h.poll("orders") {
		t.Fatal("the poller did not ask for a pass when the record was processed")
	}
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)
	if jobs := h.allJobs(); len(jobs) != jobsBefore {
		t.Errorf("Jobs %v after bring-up, want only the %d of the bring-up", jobNames(jobs), jobsBefore)
	}
}

func TestTheSummaryShowsTheConsumersAndIsWrittenAtMostEvery30sAndOnlyBeyondItsBand(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	data := h.credentials("orders")
	s0 := serveState(t, data, consumerState("orders-consumer-0", 5, 7))
	leader := consumerState("orders-consumer-1", 0, 100)
	leader.DeadLettersLastHour = 2
	leader.DeadLettersLastHourByReason = map[string]int64{"ListenerFailed": 1, "InvalidJSON": 1}
	leader.Database = &consumerstate.Database{WaitingByType: map[string]int64{"OrderPaid": 3, "InvoicePaid": 1}, InstancesExpiringSoon: 4}
	s1 := serveState(t, data, leader)
	// The oldest message arrived two minutes before the summary's first write, 30s from now.
	s1.mu.Lock()
	s1.oldestArrival, s1.clock = h.clock.Now().Add(h.r.StatusWriteInterval-2*time.Minute), h.clock
	s1.mu.Unlock()
	h.startReadablePod("orders", "orders-consumer-0", s0)
	h.startReadablePod("orders", "orders-consumer-1", s1)
	h.reconcile("orders") // the pod events' pass lists the pods to read
	// The summary of the bring-up (no pod yet) was just written: the next comes 30s later.
	h.clock.Step(h.r.StatusWriteInterval)
	t0 := h.clock.Now()
	if !h.poll("orders") {
		t.Fatal("the poller did not ask for the pass that writes the new pods' summary")
	}
	h.reconcile("orders")

	sum := h.get("orders").Status.Consumers
	if sum == nil {
		t.Fatal("no status.consumers")
	}
	if sum.Lag != 112 || sum.WaitingMessages == nil || *sum.WaitingMessages != 4 || sum.DeadLettersLastHour != 2 ||
		sum.InstancesExpiringSoon == nil || *sum.InstancesExpiringSoon != 4 ||
		sum.OldestWaitingSince == nil || !sum.OldestWaitingSince.Time.Equal(t0.Add(-2*time.Minute)) || !sum.UpdatedAt.Time.Equal(t0) {
		t.Fatalf("status.consumers %+v, want lag 112, 4 waiting since %s, 2 dead letters, 4 expiring, updated %s", sum, t0.Add(-2*time.Minute), t0)
	}
	wantWaiting := []v1alpha1.WaitingTypeStatus{
		{Type: "OrderPaid", Count: 3, OldestSince: ptr.To(metav1.NewTime(t0.Add(-2 * time.Minute)))},
		{Type: "InvoicePaid", Count: 1, OldestSince: ptr.To(metav1.NewTime(t0.Add(-time.Minute)))},
	}
	if !equality.Semantic.DeepEqual(sum.WaitingByType, wantWaiting) {
		t.Errorf("status.consumers.waitingByType %+v, want %+v", sum.WaitingByType, wantWaiting)
	}
	if want := []v1alpha1.DeadLetterReasonCount{{Reason: "InvalidJSON", Count: 1}, {Reason: "ListenerFailed", Count: 1}}; !slices.Equal(sum.DeadLettersLastHourByReason, want) {
		t.Errorf("status.consumers.deadLettersLastHourByReason %+v, want %+v", sum.DeadLettersLastHourByReason, want)
	}
	if len(sum.Pods) != 2 || sum.Pods[0].Name != "orders-consumer-0" || sum.Pods[0].Partitions != "orders[0,1]" || sum.Pods[0].Lag != 12 ||
		sum.Pods[1].Partitions != "orders[0,1]" || sum.Pods[1].Lag != 100 || !sum.Pods[1].Ready {
		t.Fatalf("status.consumers.pods %+v", sum.Pods)
	}

	// A lag that moved beyond the band is written only 30s after the last write.
	s0.set(func(st *consumerstate.State) { st.Partitions[0].Lag = 500 })
	h.clock.Step(h.r.StatePollInterval)
	if h.poll("orders") {
		t.Error("the poller asked for a pass 10s after the last write of the summary")
	}
	h.reconcile("orders") // a pod event's pass
	if got := h.get("orders").Status.Consumers; got.Lag != 112 || !got.UpdatedAt.Time.Equal(t0) {
		t.Fatalf("status.consumers written %s after the last write (lag %d)", h.clock.Since(t0), got.Lag)
	}
	h.clock.Step(h.r.StatusWriteInterval - h.r.StatePollInterval)
	if !h.poll("orders") {
		t.Fatal("the poller did not ask for a pass 30s after the last write, with the lag beyond its band")
	}
	// Until a pass reported, the poller does not ask again (a pass may stop before it reports).
	h.clock.Step(h.r.StatePollInterval)
	if h.poll("orders") {
		t.Error("the poller asked again before the pass it asked for reported")
	}
	h.reconcile("orders")
	t1 := h.clock.Now()
	if got := h.get("orders").Status.Consumers; got.Lag != 607 || !got.UpdatedAt.Time.Equal(t1) {
		t.Fatalf("status.consumers lag %d updated %s, want 607 at %s", got.Lag, got.UpdatedAt, t1)
	}

	// Ten minutes of reads in which the values wobble within their band and the oldest message
	// ages as it waits: no pass asked for, no write (even by passes of pod events), no Job.
	rv, jobs, reads := h.get("orders").ResourceVersion, len(h.allJobs()), s0.readCount()
	for i := range 60 {
		h.clock.Step(h.r.StatePollInterval)
		s0.set(func(st *consumerstate.State) { st.Partitions[0].Lag = 500 + int64(i%5) })
		if h.poll("orders") {
			t.Fatalf("the poller asked for a pass at %s of steady state", h.clock.Since(t1))
		}
		h.reconcile("orders")
	}
	if got := h.get("orders").ResourceVersion; got != rv {
		t.Errorf("the inbox was written during ten minutes of values within their band: %+v", h.get("orders").Status.Consumers)
	}
	if got := len(h.allJobs()); got != jobs {
		t.Errorf("%d Jobs created during ten minutes of steady state, want none", got-jobs)
	}
	if got := s0.readCount() - reads; got != 60 {
		t.Errorf("the consumer was read %d times in 60 poll intervals, want 60", got)
	}
	// Neither passes nor polls between two poll intervals read the consumers again.
	for range 5 {
		h.reconcile("orders")
		h.poll("orders")
	}
	if got := s0.readCount() - reads; got != 60 {
		t.Errorf("the consumer was read %d times in 60 poll intervals and 5 passes and polls between them, want 60", got)
	}
}

func TestOnlyTheInboxsCredentialsReadItsConsumersAndNewOnesAreReadAfterARefusal(t *testing.T) {
	h := newHarness(t)
	h.create("orders", nil)
	h.bringUp("orders")
	foreign, err := consumerstate.NewCredentials(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// A pod that serves another inbox's certificate is refused, and its blocked record counts for nothing.
	impostor := consumerState("orders-consumer-0", 1)
	impostor.Blocked = &consumerstate.Blocked{Topic: "orders", Partition: 0, Since: h.clock.Now().Add(-time.Hour), Error: "fake"}
	s0 := serveState(t, foreign, impostor)
	h.startReadablePod("orders", "orders-consumer-0", s0)
	h.reconcile("orders")
	h.clock.Step(h.r.StatusWriteInterval)
	h.poll("orders")
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.AsExpectedReason)
	sum := h.get("orders").Status.Consumers
	if len(sum.Pods) != 1 || !strings.Contains(sum.Pods[0].Unreachable, "certificate") || sum.Pods[0].Blocked != nil {
		t.Fatalf("status.consumers.pods %+v, want the pod unreachable for its certificate", sum.Pods)
	}
	if s0.readCount() != 0 {
		t.Fatalf("the impostor's state handler ran %d times; the operator must not send it the token", s0.readCount())
	}

	// New credentials (the Secret deleted and made again) reach the pods' files; the operator,
	// refused meanwhile, reads the new Secret and then the pod.
	h.must(k8s.Delete(h.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "orders-consumer-state", Namespace: h.ns}}))
	h.clock.Step(credentialsRecheck)
	h.reconcile("orders")
	fresh := h.credentials("orders")
	s0.mount(t, fresh)
	if !h.poll("orders") {
		t.Fatal("the poller did not ask for a pass once it read the pod's blocked record with the new credentials")
	}
	h.reconcile("orders")
	h.expectCondition("orders", v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.PartitionBlockedReason, "orders-consumer-0")
	if sum := h.get("orders").Status.Consumers; sum.Pods[0].Unreachable != "" || sum.Pods[0].Blocked == nil {
		t.Fatalf("status.consumers.pods %+v, want the pod read with the new credentials", sum.Pods)
	}
}

func mapKeys(m map[string][]byte) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// The new lists of the summary follow its rule: written when a type or reason comes or goes or a
// count or time moves beyond its band, not when counts within it swap the order of two types.
func TestWaitingByTypeAndDeadLettersByReasonMoveOnlyBeyondTheBand(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	later := func(d time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(at.Add(d))) }
	base := func() *v1alpha1.ConsumersStatus {
		return &v1alpha1.ConsumersStatus{
			WaitingByType:               []v1alpha1.WaitingTypeStatus{{Type: "OrderPaid", Count: 12, OldestSince: later(0)}, {Type: "OrderShipped", Count: 11, OldestSince: later(0)}},
			DeadLettersLastHourByReason: []v1alpha1.DeadLetterReasonCount{{Reason: "InvalidJSON", Count: 2}},
		}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*v1alpha1.ConsumersStatus)
		moved bool
	}{
		{"unchanged", func(*v1alpha1.ConsumersStatus) {}, false},
		{"two types swap places within the band", func(s *v1alpha1.ConsumersStatus) {
			s.WaitingByType = []v1alpha1.WaitingTypeStatus{{Type: "OrderShipped", Count: 13, OldestSince: later(0)}, {Type: "OrderPaid", Count: 11, OldestSince: later(0)}}
		}, false},
		{"a count beyond the band", func(s *v1alpha1.ConsumersStatus) { s.WaitingByType[0].Count = 40 }, true},
		{"an oldest within 30s", func(s *v1alpha1.ConsumersStatus) { s.WaitingByType[0].OldestSince = later(20 * time.Second) }, false},
		{"an oldest beyond 30s", func(s *v1alpha1.ConsumersStatus) { s.WaitingByType[0].OldestSince = later(time.Minute) }, true},
		{"a type goes", func(s *v1alpha1.ConsumersStatus) { s.WaitingByType = s.WaitingByType[:1] }, true},
		{"another type instead", func(s *v1alpha1.ConsumersStatus) { s.WaitingByType[1].Type = "OrderDelivered" }, true},
		{"one more dead letter", func(s *v1alpha1.ConsumersStatus) { s.DeadLettersLastHourByReason[0].Count = 3 }, true},
		{"a new reason", func(s *v1alpha1.ConsumersStatus) {
			s.DeadLettersLastHourByReason = append(s.DeadLettersLastHourByReason, v1alpha1.DeadLetterReasonCount{Reason: "ListenerFailed", Count: 1})
		}, true},
	} {
		now := base()
		tc.edit(now)
		if got := summaryMoved(base(), now); got != tc.moved {
			t.Errorf("%s: moved %v, want %v", tc.name, got, tc.moved)
		}
	}
}
