//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// Topics of case 8, seeded with the broker.
const (
	legacyTopic  = "legacy-orders"
	upgradeTopic = "upgrade-orders"
	upgradeInbox = "upgrade-inbox"
)

// testUpgradeFromLegacy first shows the failure claims prevent: two legacy consumers (claim
// protocol 0) in different groups race on duplicates and deliver logical messages twice. Then
// an inbox runs on the legacy image and is changed to the current image while duplicates keep
// arriving: the pods, the consumer registry and the sink show that no legacy and current consumer
// ever processed at the same time, and that nothing was delivered twice across the upgrade.
func testUpgradeFromLegacy(t *testing.T, s *suite) {
	t.Run("LegacyConsumersInTwoGroupsDeliverTwice", func(t *testing.T) { testLegacyDoubleDelivery(t, s) })
	if t.Failed() {
		return
	}
	t.Run("UpgradeUnderLoadNeverOverlaps", func(t *testing.T) { testUpgradeUnderLoad(t, s) })
	if t.Failed() {
		return
	}
	t.Run("CompatibleImageRollsWithoutStopping", func(t *testing.T) { testCompatibleRollout(t, s) })
	if t.Failed() {
		return
	}
	t.Run("SupervisedWaitsForApproval", func(t *testing.T) { testSupervisedRollout(t, s) })
}

// freshDatabase creates a fresh database and returns its URL for this process and for the pods.
func (s *suite) freshDatabase(t *testing.T, prefix string) (host, pod string) {
	t.Helper()
	dbURL, drop, err := testenv.NewDatabase(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	s.cleanup(drop)
	pu, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pu.Host = s.pgSvc
	return dbURL, pu.String()
}

func testLegacyDoubleDelivery(t *testing.T, s *suite) {
	_, podURL := s.freshDatabase(t, "e2e_legacy")
	kubectl(t, "-n", namespace, "create", "secret", "generic", "legacy-database", "--from-literal=url="+podURL)
	var manifests []string
	for _, group := range []string{"legacy-a", "legacy-b"} {
		in := sampleInbox(t, s)
		// Two consumer groups of one inbox: they share its tables, as the racing replicas of the
		// legacy engine do; two inboxes could not (the owner of the tables refuses the second).
		in.Name, in.Spec.Kafka.ConsumerGroup, in.Spec.Kafka.Topics = "legacy", group, []string{legacyTopic}
		raw, err := yaml.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		manifests = append(manifests, fmt.Sprintf("  %s.yaml: |\n%s", group, indent(string(raw), "    ")))
	}
	config := fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: legacy-consumers, namespace: %s}\ndata:\n%s",
		namespace, strings.Join(manifests, ""))
	if _, err := kubectlErr(t.Context(), []byte(config), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	for _, group := range []string{"legacy-a", "legacy-b"} {
		pod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %[1]s, namespace: %[2]s, labels: {e2e: legacy}}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532}
  initContainers:
  - name: migrate
    image: %[3]s
    args: [migrate]
    env: [{name: SEQINBOX_DATABASE_URL, valueFrom: {secretKeyRef: {name: legacy-database, key: url}}}]
  containers:
  - name: consume
    image: %[3]s
    args: [consume, -f, /config/%[1]s.yaml, --instance-id, %[1]s]
    env: [{name: SEQINBOX_DATABASE_URL, valueFrom: {secretKeyRef: {name: legacy-database, key: url}}}]
    volumeMounts: [{name: config, mountPath: /config}]
  volumes: [{name: config, configMap: {name: legacy-consumers}}]
`, group, namespace, env.legacyImage)
		if _, err := kubectlErr(t.Context(), []byte(pod), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = kubectlErr(context.Background(), nil, "-n", namespace, "delete", "pod,configmap,secret", "-l", "e2e=legacy", "--wait=false")
		_, _ = kubectlErr(context.Background(), nil, "-n", namespace, "delete", "configmap/legacy-consumers", "secret/legacy-database", "--ignore-not-found")
	})
	kubectl(t, "-n", namespace, "wait", "--for=condition=Ready", "pod/legacy-a", "pod/legacy-b", "--timeout=3m")

	// The sink takes a moment per message, as real services do: the window between a legacy
	// consumer's check and its insert.
	s.sink.setDelay("legacy-", 20*time.Millisecond)
	const orders = 20
	recs := orderRecordsFor(legacyTopic, "legacy-", 1, orders, 1)
	produce(t, s.producer, recs)
	for _, group := range []string{"legacy-a", "legacy-b"} {
		testenv.WaitUntil(t, "group "+group+" committed every record", 3*time.Minute, func() bool {
			left, err := s.unprocessedOf(t.Context(), legacyTopic, group)
			return err == nil && left == 0
		})
	}
	twice := 0
	counts := map[string]int{}
	for _, d := range s.sink.accepted() {
		if strings.HasPrefix(d.ID, "legacy-") {
			counts[d.ID]++
		}
	}
	for _, c := range counts {
		if c > 1 {
			twice++
		}
	}
	t.Logf("legacy engine, two groups, no fence: %d of %d logical messages delivered more than once", twice, len(counts))
	if len(counts) != orders*len(orderEvents) {
		t.Fatalf("the sink saw %d logical messages; want %d", len(counts), orders*len(orderEvents))
	}
	if twice == 0 {
		t.Fatal("no logical message was delivered twice: the legacy engine's race did not show")
	}
}

// podRecord is what the pod watcher learnt about one consumer pod.
type podRecord struct {
	Name, Image, IP  string
	Started, Stopped time.Time
}

// watchPods polls the upgrade inbox's consumer pods until the returned function is called,
// which returns what it saw.
func watchPods(ctx context.Context) func() map[string]*podRecord {
	pods := map[string]*podRecord{}
	var mu sync.Mutex
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			out, err := kubectlErr(ctx, nil, "-n", namespace, "get", "pods", "-l",
				"app.kubernetes.io/instance="+upgradeInbox+",app.kubernetes.io/component=consumer", "-o", "json")
			now := time.Now()
			if err == nil {
				var list struct {
					Items []struct {
						Metadata struct{ Name string }
						Spec     struct{ Containers []struct{ Image string } }
						Status   struct {
							PodIP             string
							ContainerStatuses []struct {
								State struct {
									Running    *struct{ StartedAt time.Time }
									Terminated *struct{ StartedAt, FinishedAt time.Time }
								}
							}
						}
					}
				}
				if json.Unmarshal([]byte(out), &list) == nil {
					seen := map[string]bool{}
					mu.Lock()
					for _, p := range list.Items {
						seen[p.Metadata.Name] = true
						r := pods[p.Metadata.Name]
						if r == nil {
							r = &podRecord{Name: p.Metadata.Name, Image: p.Spec.Containers[0].Image}
							pods[p.Metadata.Name] = r
						}
						if p.Status.PodIP != "" {
							r.IP = p.Status.PodIP
						}
						for _, c := range p.Status.ContainerStatuses {
							if c.State.Running != nil {
								r.Started = c.State.Running.StartedAt
							}
							if c.State.Terminated != nil {
								r.Started, r.Stopped = c.State.Terminated.StartedAt, c.State.Terminated.FinishedAt
							}
						}
					}
					for name, r := range pods {
						if !seen[name] && r.Stopped.IsZero() {
							r.Stopped = now // gone between two polls: at the latest now
						}
					}
					mu.Unlock()
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return func() map[string]*podRecord {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return pods
	}
}

// registryRow is one row of the consumer registry as the registry watcher saw it last.
type registryRow struct {
	Instance, Protocol   string
	Started, LastHeartbt time.Time
}

// watchRegistry polls the consumer registry of the database until the returned function is
// called; it keeps the last state of every row it saw (rows are deleted when consumers stop).
func watchRegistry(ctx context.Context, t *testing.T, dbURL string) func() map[string]*registryRow {
	rows := map[string]*registryRow{}
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	pool := testenv.Pool(t, dbURL)
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			rs, err := pool.Query(ctx, `SELECT instance_id, claim_protocol, started_at, heartbeat_at FROM consumer_registry`)
			if err == nil {
				var r registryRow
				_, _ = pgx.ForEachRow(rs, []any{&r.Instance, &r.Protocol, &r.Started, &r.LastHeartbt}, func() error {
					c := r
					rows[r.Instance] = &c
					return nil
				})
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() map[string]*registryRow {
		cancel()
		<-done
		return rows
	}
}

func testUpgradeUnderLoad(t *testing.T, s *suite) {
	dbURL, podURL := s.freshDatabase(t, "e2e_upgrade")
	kubectl(t, "-n", namespace, "create", "secret", "generic", "upgrade-database", "--from-literal=url="+podURL)
	s.sink.setDelay("upgrade-", 5*time.Millisecond)
	in := sampleInbox(t, s)
	in.Name, in.Spec.Kafka.ConsumerGroup, in.Spec.Kafka.Topics = upgradeInbox, upgradeInbox, []string{upgradeTopic}
	in.Spec.Database.URLSecretRef.Name = "upgrade-database"
	in.Spec.Image = env.legacyImage
	applyObject(t, in)
	kubectl(t, "-n", namespace, "wait", "--for=condition=Ready", "sqi/"+upgradeInbox, "--timeout=5m")
	if p := kubectl(t, "-n", namespace, "get", "sqi", upgradeInbox, "-o", "jsonpath={.status.runningClaimProtocol}"); p != "check-then-insert-v0" {
		t.Fatalf("running claim protocol %q; want the legacy check-then-insert-v0", p)
	}
	// The legacy engine predates the consumer state: its pods run without the state flags, and
	// the inbox says why status.consumers stays empty.
	if served := stateServed(t, upgradeInbox); served != "False "+v1alpha1.EnginePredatesStateReason {
		t.Errorf("ConsumerStateServed on the legacy image: %q; want False %s", served, v1alpha1.EnginePredatesStateReason)
	}
	if args := kubectl(t, "-n", namespace, "get", "deployment", "-l", "app.kubernetes.io/instance="+upgradeInbox,
		"-o", "jsonpath={.items[0].spec.template.spec.containers[0].args}"); strings.Contains(args, "--state-bind-address") {
		t.Errorf("the legacy consumers get the state flags: %s", args)
	}

	stopPods := watchPods(t.Context())
	stopRegistry := watchRegistry(t.Context(), t, dbURL)
	const batches, perBatch = 20, 3
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for b := range batches {
			recs := orderRecordsFor(upgradeTopic, "upgrade-", 1+b*perBatch, perBatch, 2)
			if err := s.producer.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
				t.Errorf("produce batch %d: %v", b, err)
				return
			}
			time.Sleep(2 * time.Second) // the load's pace, not synchronisation
		}
	}()
	time.Sleep(6 * time.Second) // let the legacy consumer work under load first
	upgradeAt := time.Now()
	kubectl(t, "-n", namespace, "patch", "sqi", upgradeInbox, "--type=merge", "-p",
		fmt.Sprintf(`{"spec":{"image":%q}}`, env.image))
	testenv.WaitUntil(t, "the current engine runs", 5*time.Minute, func() bool {
		out, err := kubectlErr(t.Context(), nil, "-n", namespace, "get", "sqi", upgradeInbox, "-o",
			`jsonpath={.status.runningClaimProtocol} {.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == inbox.ClaimProtocol+" True"
	})
	<-loadDone
	testenv.WaitUntil(t, "the upgraded inbox committed every record", 5*time.Minute, func() bool {
		left, err := s.unprocessedOf(t.Context(), upgradeTopic, upgradeInbox)
		return err == nil && left == 0
	})
	pods, registry := stopPods(), stopRegistry()

	// The timeline, from the pods.
	var lastLegacyStop, firstCurrentStart time.Time
	ipImage := map[string]string{}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
		ipImage[p.IP] = p.Image
		switch p.Image {
		case env.legacyImage:
			if p.Stopped.IsZero() {
				t.Fatalf("legacy pod %s never stopped", p.Name)
			}
			if p.Stopped.After(lastLegacyStop) {
				lastLegacyStop = p.Stopped
			}
		case env.image:
			if firstCurrentStart.IsZero() || p.Started.Before(firstCurrentStart) {
				firstCurrentStart = p.Started
			}
		}
	}
	sort.Strings(names)
	for _, n := range names {
		p := pods[n]
		t.Logf("pod %s image %s started %s stopped %s", p.Name, p.Image, p.Started.Format(time.RFC3339Nano), p.Stopped.Format(time.RFC3339Nano))
	}
	t.Logf("upgrade requested %s; last legacy consumer stopped %s (+%.1fs); first current consumer started %s (+%.1fs)",
		upgradeAt.Format(time.RFC3339Nano), lastLegacyStop.Format(time.RFC3339Nano), lastLegacyStop.Sub(upgradeAt).Seconds(),
		firstCurrentStart.Format(time.RFC3339Nano), firstCurrentStart.Sub(upgradeAt).Seconds())
	if lastLegacyStop.IsZero() || firstCurrentStart.IsZero() || !firstCurrentStart.After(lastLegacyStop) {
		t.Fatalf("legacy and current consumers overlapped: last legacy stop %s, first current start %s", lastLegacyStop, firstCurrentStart)
	}

	// The consumer registry: no current consumer registered while a legacy one was alive.
	var lastLegacyHeartbeat, firstCurrentRegistered time.Time
	for _, r := range registry {
		t.Logf("registry %s protocol %s started %s last heartbeat %s", r.Instance, r.Protocol, r.Started.Format(time.RFC3339Nano), r.LastHeartbt.Format(time.RFC3339Nano))
		switch r.Protocol {
		case "check-then-insert-v0":
			if r.LastHeartbt.After(lastLegacyHeartbeat) {
				lastLegacyHeartbeat = r.LastHeartbt
			}
		case inbox.ClaimProtocol:
			if firstCurrentRegistered.IsZero() || r.Started.Before(firstCurrentRegistered) {
				firstCurrentRegistered = r.Started
			}
		}
	}
	if lastLegacyHeartbeat.IsZero() || firstCurrentRegistered.IsZero() || !firstCurrentRegistered.After(lastLegacyHeartbeat) {
		t.Fatalf("registry: last legacy heartbeat %s, first current registration %s; want the registration after", lastLegacyHeartbeat, firstCurrentRegistered)
	}

	// The sink: every logical message once, in order; legacy deliveries all before current ones.
	var mine []delivery
	var lastLegacyDelivery, firstCurrentDelivery time.Time
	for _, d := range s.sink.accepted() {
		if !strings.HasPrefix(d.ID, "upgrade-") {
			continue
		}
		mine = append(mine, d)
		switch ipImage[d.From] {
		case env.legacyImage:
			if d.At.After(lastLegacyDelivery) {
				lastLegacyDelivery = d.At
			}
		case env.image:
			if firstCurrentDelivery.IsZero() {
				firstCurrentDelivery = d.At
			}
		default:
			t.Errorf("delivery of %s from %s, which is no consumer pod seen", d.ID, d.From)
		}
	}
	t.Logf("sink: %d deliveries; last by the legacy engine %s, first by the current engine %s",
		len(mine), lastLegacyDelivery.Format(time.RFC3339Nano), firstCurrentDelivery.Format(time.RFC3339Nano))
	if lastLegacyDelivery.IsZero() || firstCurrentDelivery.IsZero() || !firstCurrentDelivery.After(lastLegacyDelivery) {
		t.Errorf("sink: last legacy delivery %s, first current delivery %s; want every legacy delivery first", lastLegacyDelivery, firstCurrentDelivery)
	}
	checkExactlyOnceInOrderPrefixed(t, mine, "upgrade-", 1, batches*perBatch)
	testenv.WaitUntil(t, "ConsumerStateServed once the current engine runs", time.Minute, func() bool {
		return stateServed(t, upgradeInbox) == "True "+v1alpha1.StateServedReason
	})
}

// stateServed is the status and reason of an inbox's ConsumerStateServed condition.
func stateServed(t *testing.T, name string) string {
	return kubectl(t, "-n", namespace, "get", "sqi", name, "-o",
		`jsonpath={.status.conditions[?(@.type=="ConsumerStateServed")].status} {.status.conditions[?(@.type=="ConsumerStateServed")].reason}`)
}

// orderRecordsFor is orderRecords on another topic with an ID prefix; the copies of a logical
// message go to the partition of its order (a producer's retries), out of order within it.
func orderRecordsFor(topicName, prefix string, first, n, copies int) []*kgo.Record {
	recs := orderRecords(first, n, copies)
	for _, r := range recs {
		r.Topic = topicName
		for i, h := range r.Headers {
			if h.Key == "ce_id" {
				r.Headers[i].Value = append([]byte(prefix), h.Value...)
			}
		}
		h := fnv.New32a()
		_, _ = h.Write(r.Value)
		r.Partition = int32(h.Sum32() % partitions)
	}
	rand.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	return recs
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// rolloutState is one observation of the upgrade inbox during a rollout.
type rolloutState struct {
	ready   int
	blocked bool
}

// watchRollout polls the upgrade inbox's ready replicas and RolloutBlocked condition until the
// returned function is called, which returns the observations.
func watchRollout(ctx context.Context) func() []rolloutState {
	var seen []rolloutState
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			out, err := kubectlErr(ctx, nil, "-n", namespace, "get", "sqi", upgradeInbox, "-o",
				`jsonpath={.status.replicasReady}|{.status.conditions[?(@.type=="RolloutBlocked")].status}`)
			// An absent replicasReady (omitempty) is zero.
			if ready, blocked, ok := strings.Cut(out, "|"); err == nil && ok {
				var n int
				_, _ = fmt.Sscan(ready, &n)
				seen = append(seen, rolloutState{ready: n, blocked: blocked == "True"})
			}
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return func() []rolloutState {
		cancel()
		<-done
		return seen
	}
}

// testCompatibleRollout changes the upgrade inbox to a new tag of the same image (same engine,
// same claim protocol) while orders arrive: the consumers roll without ever all stopping, the
// rollout is never blocked, and every message reaches the sink once.
func testCompatibleRollout(t *testing.T, s *suite) {
	compat := env.image + "-compat"
	if _, err := script(nil, "bash", "-c", `source hack/cluster/lib.sh && ctr images tag --force "$0" "$1" >/dev/null`, env.image, compat); err != nil {
		t.Fatal(err)
	}
	stop := watchRollout(t.Context())
	const first, orders = 1001, 20
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for b := range orders / 2 {
			recs := orderRecordsFor(upgradeTopic, "upgrade-", first+2*b, 2, 2)
			if err := s.producer.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			time.Sleep(time.Second) // the load's pace, not synchronisation
		}
	}()
	start := time.Now()
	kubectl(t, "-n", namespace, "patch", "sqi", upgradeInbox, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"image":%q}}`, compat))
	awaitOnlyConsumer(t, compat)
	<-loadDone
	testenv.WaitUntil(t, "the inbox committed every record", 3*time.Minute, func() bool {
		left, err := s.unprocessedOf(t.Context(), upgradeTopic, upgradeInbox)
		return err == nil && left == 0
	})
	seen := stop()
	t.Logf("compatible rollout to %s done in %.1fs, %d observations", compat, time.Since(start).Seconds(), len(seen))
	for i, o := range seen {
		if o.blocked {
			t.Fatalf("observation %d: RolloutBlocked is True during a compatible rollout", i)
		}
		if o.ready < 1 {
			t.Fatalf("observation %d: no consumer ready during a compatible rollout", i)
		}
	}
	var mine []delivery
	for _, d := range s.sink.accepted() {
		if strings.HasPrefix(d.ID, "upgrade-") {
			mine = append(mine, d)
		}
	}
	checkExactlyOnceInOrderPrefixed(t, mine, "upgrade-", first, orders)
}

// testSupervisedRollout asks a Supervised inbox for an engine of another claim protocol: the
// rollout waits, RolloutBlocked says for what, the running consumer keeps running; the approval
// annotation lets it proceed.
func testSupervisedRollout(t *testing.T, s *suite) {
	before := awaitOnlyConsumer(t, env.image+"-compat")
	kubectl(t, "-n", namespace, "patch", "sqi", upgradeInbox, "--type=merge", "-p",
		fmt.Sprintf(`{"spec":{"upgradeStrategy":"Supervised","image":%q}}`, env.legacyImage))
	var message string
	testenv.WaitUntil(t, "RolloutBlocked asks for approval", 3*time.Minute, func() bool {
		out, err := kubectlErr(t.Context(), nil, "-n", namespace, "get", "sqi", upgradeInbox, "-o",
			`jsonpath={.status.conditions[?(@.type=="RolloutBlocked")].status} {.status.conditions[?(@.type=="RolloutBlocked")].message}`)
		message = out
		return err == nil && strings.HasPrefix(out, "True ") && strings.Contains(out, "approve-rollout")
	})
	t.Logf("RolloutBlocked: %s", message)
	if after := upgradeConsumers(t); len(after) != 1 || after[0] != before+" "+env.image+"-compat true" {
		t.Fatalf("consumer pods while waiting for approval: %q; want the running %s, ready", after, before)
	}
	version := kubectl(t, "-n", namespace, "get", "sqi", upgradeInbox, "-o", "jsonpath={.status.targetEngineVersion}")
	kubectl(t, "-n", namespace, "annotate", "sqi", upgradeInbox, "inbox.seqinbox.dev/approve-rollout="+version)
	testenv.WaitUntil(t, "the approved rollout finished", 5*time.Minute, func() bool {
		out, err := kubectlErr(t.Context(), nil, "-n", namespace, "get", "sqi", upgradeInbox, "-o",
			`jsonpath={.status.runningClaimProtocol} {.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "check-then-insert-v0 True"
	})
}

// upgradeConsumers lists the upgrade inbox's consumer pods as "name image ready[ deletionTimestamp]".
func upgradeConsumers(t *testing.T) []string {
	t.Helper()
	out, err := kubectlErr(t.Context(), nil, "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/instance="+upgradeInbox+",app.kubernetes.io/component=consumer",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.containers[0].image} {.status.containerStatuses[0].ready} {.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for _, line := range strings.Split(out, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			pods = append(pods, line)
		}
	}
	return pods
}

// awaitOnlyConsumer waits until the upgrade inbox has exactly one consumer pod, running image,
// ready and not terminating (the rollout's old pods are gone), and returns its name.
func awaitOnlyConsumer(t *testing.T, image string) string {
	t.Helper()
	var pods []string
	testenv.WaitUntil(t, "one ready consumer of "+image+" and no other", 3*time.Minute, func() bool {
		pods = upgradeConsumers(t)
		if len(pods) != 1 {
			return false
		}
		f := strings.Fields(pods[0])
		return len(f) == 3 && f[1] == image && f[2] == "true"
	})
	return strings.Fields(pods[0])[0]
}
