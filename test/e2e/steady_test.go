//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

const (
	// steadyInboxCount inboxes run for steadyWindow beside cases 5 to 8, each with its own
	// database, topic and consumer group.
	steadyInboxCount = 5
	// steadyWindow is more than twice the two minutes at which the operator used to start a
	// Job per running inbox to read the consumer registry.
	steadyWindow = 5 * time.Minute
	// steadyOrderEvery is the pace of the light load each steady inbox gets.
	steadyOrderEvery = 20 * time.Second
	// statusWriteInterval is the operator's default least time between two writes of an inbox's
	// status.consumers.
	statusWriteInterval = 30 * time.Second
)

// steadyName is the name of steady inbox i, also its topic, consumer group and ID prefix.
func steadyName(i int) string { return fmt.Sprintf("steady-%d", i) }

// steadyTopics are the topics of the steady inboxes, seeded with the broker.
func steadyTopics() []string {
	var topics []string
	for i := 1; i <= steadyInboxCount; i++ {
		topics = append(topics, steadyName(i))
	}
	return topics
}

// steadyRun is what case 4d leaves running for case 8b.
type steadyRun struct {
	start  time.Time
	writes *writeCounter
	stop   context.CancelFunc
	loaded sync.WaitGroup
	mu     sync.Mutex
	orders int // orders produced per inbox, numbered from 1
	err    error
}

// testSteadyInboxesStart applies five inboxes (pool size 2, a database each) and, once they are
// Ready, starts counting every write the operator makes to them and what they own, and a light
// load of one order per inbox every 20 s. Case 8b ends it after the steady window.
func testSteadyInboxesStart(t *testing.T, s *suite) {
	var names []string
	for i := 1; i <= steadyInboxCount; i++ {
		name := steadyName(i)
		_, podURL := s.freshDatabase(t, "e2e_steady")
		kubectl(t, "-n", namespace, "create", "secret", "generic", name+"-database", "--from-literal=url="+podURL)
		in := sampleInbox(t, s)
		in.Name, in.Spec.Kafka.ConsumerGroup, in.Spec.Kafka.Topics = name, name, []string{name}
		in.Spec.Database.URLSecretRef.Name = name + "-database"
		in.Spec.Database.PoolSize = 2
		applyObject(t, in)
		names = append(names, "sqi/"+name)
	}
	kubectl(t, append([]string{"-n", namespace, "wait", "--for=condition=Ready", "--timeout=5m"}, names...)...)

	ctx, cancel := context.WithCancel(context.Background())
	s.cleanup(cancel)
	run := &steadyRun{start: time.Now(), stop: cancel, writes: countWrites(ctx, t, namespace, steadyTopics())}
	s.steady = run
	run.loaded.Go(func() {
		tick := time.NewTicker(steadyOrderEvery)
		defer tick.Stop()
		for {
			run.mu.Lock()
			run.orders++
			order := run.orders
			run.mu.Unlock()
			for i := 1; i <= steadyInboxCount; i++ {
				name := steadyName(i)
				if err := s.producer.ProduceSync(ctx, orderRecordsFor(name, name+"-", order, 1, 2)...).FirstErr(); err != nil && ctx.Err() == nil {
					run.mu.Lock()
					run.err = fmt.Errorf("produce order %d to %s: %w", order, name, err)
					run.mu.Unlock()
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	t.Logf("%d inboxes Ready; the steady window of %s runs beside the next cases", steadyInboxCount, steadyWindow)
}

// testSteadyInboxesCreatedNoJob ends what case 4d started once the steady window has passed: the
// operator created no Job for any of the five inboxes, wrote each inbox's status at most once per
// StatusWriteInterval, and every order reached the sink exactly once and in order. It reports
// the Jobs and API writes per inbox per hour, then deletes the five inboxes.
func testSteadyInboxesCreatedNoJob(t *testing.T, s *suite) {
	run := s.steady
	if run == nil {
		t.Fatal("case 4d did not start the steady inboxes")
	}
	if left := steadyWindow - time.Since(run.start); left > 0 {
		t.Logf("waiting %s for the steady window to end", left.Round(time.Second))
		time.Sleep(left)
	}
	run.stop()
	run.loaded.Wait()
	elapsed := time.Since(run.start)
	writes := run.writes.stop()
	if run.err != nil {
		t.Fatal(run.err)
	}
	for i := 1; i <= steadyInboxCount; i++ {
		name := steadyName(i)
		testenv.WaitUntil(t, name+" committed every record", 2*time.Minute, func() bool {
			left, err := s.unprocessedOf(t.Context(), name, name)
			return err == nil && left == 0
		})
		checkExactlyOnceInOrderPrefixed(t, s.sink.accepted(), name+"-", 1, run.orders)
	}

	perHour := func(n int) float64 { return float64(n) / elapsed.Hours() }
	var report strings.Builder
	fmt.Fprintf(&report, "%d inboxes for %s, %d orders each; per inbox and hour:\n", steadyInboxCount, elapsed.Round(time.Second), run.orders)
	fmt.Fprintf(&report, "%-9s %9s %14s %10s %s\n", "INBOX", "JOBS/H", "STATUS/SPEC/H", "EVENTS/H", "OTHER WRITES")
	maxStatusWrites := int(elapsed/statusWriteInterval) + 2
	for i := 1; i <= steadyInboxCount; i++ {
		name := steadyName(i)
		w := writes[name]
		if created := w["Job ADDED"]; created > 0 {
			t.Errorf("%s: the operator created %d Jobs in the steady state", name, created)
		}
		if n := w["SequentialInbox MODIFIED"]; n > maxStatusWrites {
			t.Errorf("%s: %d writes of the inbox in %s; at most one per %s is allowed (%d)", name, n, elapsed.Round(time.Second), statusWriteInterval, maxStatusWrites)
		}
		var other []string
		for _, k := range slices.Sorted(maps.Keys(w)) {
			if !strings.HasPrefix(k, "Job ") && k != "SequentialInbox MODIFIED" && k != "Event ADDED" && k != "Event MODIFIED" {
				other = append(other, fmt.Sprintf("%s %d", k, w[k]))
			}
		}
		fmt.Fprintf(&report, "%-9s %9.1f %14.1f %10.1f %s\n", name, perHour(w["Job ADDED"]), perHour(w["SequentialInbox MODIFIED"]),
			perHour(w["Event ADDED"]+w["Event MODIFIED"]), strings.Join(other, ", "))
	}
	t.Log(report.String())
	args := []string{"-n", namespace, "delete", "sqi", "--timeout=3m"}
	kubectl(t, append(args, steadyTopics()...)...)
}

// writeCounter counts the changes to the objects of a set of inboxes, as watch events by
// "Kind TYPE" per inbox: the inbox itself, what it owns (labelled with its instance name) and
// the events that name it. A Deployment or PodDisruptionBudget counts only when its generation
// moved, since their status is written by Kubernetes' own controllers, not by the operator.
type writeCounter struct {
	mu     sync.Mutex
	counts map[string]map[string]int
	done   sync.WaitGroup
	cancel context.CancelFunc
}

// countWrites starts watching the namespace for writes to the named inboxes and what they own.
func countWrites(parent context.Context, t *testing.T, ns string, inboxes []string) *writeCounter {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(parent)
	w := &writeCounter{counts: map[string]map[string]int{}, cancel: cancel}
	for _, name := range inboxes {
		w.counts[name] = map[string]int{}
	}
	for _, r := range []struct {
		kind string
		gvr  schema.GroupVersionResource
		of   func(u *unstructured.Unstructured) string
	}{
		{"SequentialInbox", v1alpha1.GroupVersion.WithResource("sequentialinboxes"), (*unstructured.Unstructured).GetName},
		{"Deployment", schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, instanceOf},
		{"Job", schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}, instanceOf},
		{"ConfigMap", schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, instanceOf},
		{"Service", schema.GroupVersionResource{Version: "v1", Resource: "services"}, instanceOf},
		{"PodDisruptionBudget", schema.GroupVersionResource{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"}, instanceOf},
		{"Event", schema.GroupVersionResource{Version: "v1", Resource: "events"}, func(u *unstructured.Unstructured) string {
			if kind, _, _ := unstructured.NestedString(u.Object, "involvedObject", "kind"); kind != "SequentialInbox" {
				return ""
			}
			name, _, _ := unstructured.NestedString(u.Object, "involvedObject", "name")
			return name
		}},
	} {
		client := dyn.Resource(r.gvr).Namespace(ns)
		list, err := client.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", r.gvr.Resource, err)
		}
		generations := map[string]int64{}
		for _, u := range list.Items {
			generations[u.GetName()] = u.GetGeneration()
		}
		watcher, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), &cache.ListWatch{
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return client.Watch(ctx, o) },
		})
		if err != nil {
			t.Fatalf("watch %s: %v", r.gvr.Resource, err)
		}
		w.done.Go(func() {
			defer watcher.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case e, ok := <-watcher.ResultChan():
					if !ok {
						return
					}
					u, isObject := e.Object.(*unstructured.Unstructured)
					if !isObject {
						continue
					}
					if e.Type == watch.Modified && (r.kind == "Deployment" || r.kind == "PodDisruptionBudget") {
						if generations[u.GetName()] == u.GetGeneration() {
							continue
						}
					}
					generations[u.GetName()] = u.GetGeneration()
					w.add(r.of(u), r.kind+" "+string(e.Type))
				}
			}
		})
	}
	return w
}

// instanceOf is the inbox an owned object belongs to, by the label the operator sets.
func instanceOf(u *unstructured.Unstructured) string {
	return u.GetLabels()["app.kubernetes.io/instance"]
}

func (w *writeCounter) add(inbox, what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := w.counts[inbox]; ok {
		c[what]++
	}
}

// stop ends the watches and returns the counts.
func (w *writeCounter) stop() map[string]map[string]int {
	w.cancel()
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts
}
