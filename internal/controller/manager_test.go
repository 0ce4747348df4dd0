package controller

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/internal/testenv/clustersim"
	"github.com/seqinbox/seqinbox/migrations"
)

// startManager runs the operator's manager (the cache options, the controller) against envtest
// together with clustersim's stand-ins for what envtest lacks (Job controller and kubelet,
// Deployment controller). They share the operator's cache, so they add no informers.
func startManager(tb testing.TB, opts Options) ctrl.Manager {
	tb.Helper()
	mgr, err := ctrl.NewManager(testConfig, ctrl.Options{
		Scheme:                 testScheme,
		Cache:                  CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Every test starts a manager with controllers of the same names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := Setup(mgr, opts); err != nil {
		tb.Fatal(err)
	}
	if err := clustersim.Start(mgr, k8s, func(job *batchv1.Job) migrations.Report { return reportOf(job) }); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			tb.Error(err)
		}
	})
	tb.Cleanup(func() { cancel(); wg.Wait() })
	return mgr
}

// waitUntilReady polls (with a deadline) until every inbox of the namespace is Ready.
func waitUntilReady(tb testing.TB, ns string, want int, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var list v1alpha1.SequentialInboxList
		if err := k8s.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			tb.Fatal(err)
		}
		ready := 0
		for _, in := range list.Items {
			if meta.IsStatusConditionTrue(in.Status.Conditions, v1alpha1.ConditionReady) {
				ready++
			}
		}
		if ready == want {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d inboxes Ready after %s", ready, want, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestManagerDrivesAnInboxToReadyThroughItsWatches(t *testing.T) {
	h := newHarness(t)
	startManager(t, Options{DefaultImage: imageV1})
	h.create("orders", nil)
	waitUntilReady(t, h.ns, 1, time.Minute)
	inbox := h.get("orders")
	if inbox.Status.ObservedGeneration != inbox.Generation || inbox.Status.RunningEngineVersion != "v1.0.0" {
		t.Errorf("status = %+v, want generation %d observed and v1.0.0 running", inbox.Status, inbox.Generation)
	}

	// A compatible upgrade goes through by itself: the Job and Deployment watches drive it.
	h.update("orders", func(in *v1alpha1.SequentialInbox) { in.Spec.Image = imageV1Patch })
	deadline := time.Now().Add(time.Minute)
	for {
		in := h.get("orders")
		if in.Status.RunningEngineVersion == "v1.0.1" && meta.IsStatusConditionTrue(in.Status.Conditions, v1alpha1.ConditionReady) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upgrade to v1.0.1 did not finish: %+v", in.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Deleting it runs the finalizer (no pods exist: envtest runs no ReplicaSet controller).
	h.must(k8s.Delete(h.ctx, h.get("orders")))
	deadline = time.Now().Add(time.Minute)
	for {
		err := k8s.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: "orders"}, &v1alpha1.SequentialInbox{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the inbox was not deleted: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// BenchmarkReconcile100InboxesToReady creates 100 SequentialInbox resources against the real API
// server and measures the time until all are Ready (each: probe Job, migration Job, Deployment,
// PDB, Service, status), and the memory of the process that runs the manager:
//
//	go test ./internal/controller -run '^$' -bench Reconcile100 -benchtime 1x
func BenchmarkReconcile100InboxesToReady(b *testing.B) {
	const inboxes = 100
	seeds := testenv.Kafka(b, 1, "orders")
	startManager(b, Options{DefaultImage: imageV1})
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		suffix := make([]byte, 4)
		_, _ = rand.Read(suffix)
		ns := "bench-" + hex.EncodeToString(suffix)
		h := &harness{t: nil, ns: ns, seeds: seeds}
		if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
		if err := k8s.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
			StringData: map[string]string{"url": "postgres://inbox@db.example:5432/orders"}}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		for i := range inboxes {
			inbox := &v1alpha1.SequentialInbox{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("inbox-%03d", i), Namespace: ns}, Spec: h.validSpec()}
			inbox.Spec.Kafka.ConsumerGroup = inbox.Name
			if err := k8s.Create(context.Background(), inbox); err != nil {
				b.Fatal(err)
			}
		}
		passesBefore := reconcilePasses(b)
		waitUntilReady(b, ns, inboxes, 10*time.Minute)
		b.ReportMetric(time.Since(start).Seconds(), "s/100-inboxes")
		b.ReportMetric(float64(reconcilePasses(b)-passesBefore)/inboxes, "passes/inbox")
	}
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapInuse)/(1<<20), "MiB-heap-inuse")
	b.ReportMetric(float64(after.HeapInuse-min(after.HeapInuse, base.HeapInuse))/(1<<20), "MiB-heap-growth")
	b.ReportMetric(float64(procStatusKiB("VmHWM"))/1024, "MiB-peak-RSS")
}

// procStatusKiB reads a memory line (VmRSS, VmHWM) of /proc/self/status.
func procStatusKiB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		if rest, ok := strings.CutPrefix(scanner.Text(), field+":"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kib
		}
	}
	return 0
}

// reconcilePasses is controller-runtime's count of SequentialInbox reconciles in this process.
func reconcilePasses(tb testing.TB) float64 {
	tb.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "sequentialinbox" {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
