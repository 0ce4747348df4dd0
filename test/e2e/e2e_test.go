//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

const (
	operatorNamespace = "seqinbox-system"
	operatorName      = "seqinbox-controller-manager"
	namespace         = "seqinbox-e2e"
	inboxName         = "order-inbox"
	topic             = "orders"
	deadLetterTopic   = "orders.dlq"
	partitions        = 3
)

// suite is what the cases share, in the order the cases build it up.
type suite struct {
	broker    string // the broker's address, for this process
	sink      *sink
	dbURL     string // the inbox database, for this process
	podDBURL  string // the same database, through its Service, for the pods
	kafkaSvc  string
	sinkSvc   string
	pgSvc     string
	producer  *kgo.Client
	admin     *kadm.Client
	nextOrder int
	steady    *steadyRun // the inboxes of case 4d, ended by case 8b
	// cleanup registers a function that runs when the whole suite ends.
	cleanup func(func())
}

// TestEndToEnd runs the cases in order on one installation; each case needs the ones before it.
func TestEndToEnd(t *testing.T) {
	s := &suite{cleanup: t.Cleanup}
	cases := []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"1_InstallBundleOperatorReady", testInstall},
		{"2_BrokerDatabaseSinkReachableFromPods", testParts},
		{"3_InboxReady", testInboxReady},
		{"4_OutOfOrderDuplicatedStreamExactlyOnceInOrder", testStream},
		{"4b_ConsumerStateInStatusMatchesMetrics", testConsumerStateInStatus},
		{"4c_RecordBlockedByTheDatabaseInDegradedAndStatus", testBlockedRecordInDegraded},
		{"4e_PluginInspectNamesTheMissingPredecessor", testPluginInspect},
		{"4f_PluginDeadLettersListShowsThePoisonRecord", testPluginDeadLetters},
		{"4d_FiveInboxesStartASteadyWindow", testSteadyInboxesStart},
		{"5_ForceDeletedConsumerMidDelivery", testForceDelete},
		{"6_Scale1To3To1UnderLoad", testScale},
		{"7_SequentialInboxActionExecuted", testAction},
		{"8_UpgradeFromLegacyEngineUnderLoad", testUpgradeFromLegacy},
		{"8b_FiveInboxesCreatedNoJobInTheSteadyWindow", testSteadyInboxesCreatedNoJob},
		{"9_DeleteInboxAndUninstall", testUninstall},
	}
	for _, c := range cases {
		start := time.Now()
		ok := t.Run(c.name, func(t *testing.T) { c.run(t, s) })
		t.Logf("case %s: %.1fs", c.name, time.Since(start).Seconds())
		if !ok {
			dumpState(t)
			t.FailNow()
		}
	}
}

// testInstall applies dist/install.yaml as a user does and waits for the operator pod, which
// runs under the bundle's own ServiceAccount and RBAC, to become Ready.
func testInstall(t *testing.T, _ *suite) {
	kubectl(t, "apply", "--server-side", "-f", filepath.Join(env.root, "dist/install.yaml"))
	kubectl(t, "-n", operatorNamespace, "rollout", "status", "deployment/"+operatorName, "--timeout=5m")
	sa := kubectl(t, "-n", operatorNamespace, "get", "pods", "-l", "control-plane=controller-manager",
		"-o", "jsonpath={.items[0].spec.serviceAccountName}")
	if sa != operatorName {
		t.Fatalf("operator pod runs as ServiceAccount %q; want the bundle's %q", sa, operatorName)
	}
}

// testParts starts the broker, the sink and the PostgreSQL forwarder on the node, gives each a
// Service, creates the inbox's database and its URL Secret.
func testParts(t *testing.T, s *suite) {
	topics := map[string]int32{topic: partitions, deadLetterTopic: 1, legacyTopic: partitions, upgradeTopic: partitions}
	for _, name := range steadyTopics() {
		topics[name] = partitions
	}
	s.broker = startBroker(t, s.cleanup, topics)
	s.sink = startSink(t, s.cleanup)
	server, err := testenv.ServerURL(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	pgAddr := forward(t, s.cleanup, u.Host)
	dbURL, drop, err := testenv.NewDatabase(context.Background(), "e2e")
	if err != nil {
		t.Fatal(err)
	}
	s.cleanup(drop)
	s.dbURL = dbURL

	kubectl(t, "create", "namespace", namespace)
	s.cleanup(func() {
		_, _ = kubectlErr(context.Background(), nil, "delete", "namespace", namespace, "--ignore-not-found", "--timeout=2m")
	})
	s.kafkaSvc = hostService(t, namespace, "kafka", s.broker)
	s.sinkSvc = hostService(t, namespace, "order-service", s.sink.addr)
	s.pgSvc = hostService(t, namespace, "postgres", pgAddr)
	pu, _ := url.Parse(dbURL)
	pu.Host = s.pgSvc
	s.podDBURL = pu.String()
	kubectl(t, "-n", namespace, "create", "secret", "generic", "order-inbox-database", "--from-literal=url="+s.podDBURL)

	s.producer = producer(t, s.cleanup, s.broker)
	s.admin = kadm.NewClient(s.producer)
}

// testInboxReady applies the sample SequentialInbox, pointed at the broker, database and sink
// of the suite: the migration Job runs as a pod, the consumers become Ready, and so does the inbox.
func testInboxReady(t *testing.T, s *suite) {
	applyInbox(t, s, func(in *v1alpha1.SequentialInbox) {})
	kubectl(t, "-n", namespace, "wait", "--for=condition=Ready", "sqi/"+inboxName, "--timeout=5m")
	jobs := kubectl(t, "-n", namespace, "get", "pods", "-o",
		`jsonpath={range .items[?(@.metadata.labels.job-name)]}{.metadata.name} {.status.phase}{"\n"}{end}`)
	if !strings.Contains(jobs, "Succeeded") {
		t.Fatalf("no migration Job pod succeeded; Job pods:\n%s", jobs)
	}
	ready := kubectl(t, "-n", namespace, "get", "deployment", "-l", "app.kubernetes.io/instance="+inboxName,
		"-o", "jsonpath={.items[0].status.readyReplicas}")
	if ready != "1" {
		t.Fatalf("consumer Deployment has %q ready replicas; want 1", ready)
	}
	table := kubectl(t, "-n", namespace, "get", "sqi")
	if !strings.Contains(table, inboxName) || !strings.Contains(table, "True") {
		t.Fatalf("kubectl get sqi does not show a ready %s:\n%s", inboxName, table)
	}
	t.Logf("kubectl get sqi:\n%s", table)
}

// applyInbox applies sampleInbox after edit.
func applyInbox(t *testing.T, s *suite, edit func(*v1alpha1.SequentialInbox)) {
	t.Helper()
	in := sampleInbox(t, s)
	edit(in)
	applyObject(t, in)
}

// applyObject applies an object with kubectl.
func applyObject(t *testing.T, obj any) {
	t.Helper()
	out, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubectlErr(t.Context(), out, "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// sampleInbox is config/samples' SequentialInbox with the suite's endpoints, a shorter
// max.poll.interval.ms (so that pods stop within seconds) and a sink timeout to match.
func sampleInbox(t *testing.T, s *suite) *v1alpha1.SequentialInbox {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(env.root, "config/samples/inbox_v1alpha1_sequentialinbox.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var in v1alpha1.SequentialInbox
	if err := yaml.UnmarshalStrict(raw, &in); err != nil {
		t.Fatalf("the sample: %v", err)
	}
	in.Namespace = namespace
	in.Spec.Kafka.BootstrapServers = []string{s.kafkaSvc}
	in.Spec.Kafka.MaxPollIntervalMs = 60000
	in.Spec.Sink.URL = "http://" + s.sinkSvc + "/events"
	in.Spec.Sink.Timeout.Duration = 5 * time.Second
	in.Spec.Sink.Retries = ptr.To(int32(1))
	in.APIVersion, in.Kind = v1alpha1.GroupVersion.String(), "SequentialInbox"
	return &in
}

// order is one order's logical messages, in business order.
var orderEvents = []struct{ typ, subtype string }{
	{"OrderCreated", ""}, {"OrderValidated", "STOCK_AVAILABLE"}, {"OrderPaid", ""}, {"OrderShipped", ""}, {"OrderDelivered", ""},
}

// orderRecords returns the records of orders [first, first+n), each logical message copies
// times, on random partitions, shuffled: out of order within and across partitions.
func orderRecords(first, n, copies int) []*kgo.Record {
	var recs []*kgo.Record
	for o := first; o < first+n; o++ {
		for _, e := range orderEvents {
			for range copies {
				id := fmt.Sprintf("order-%d-%s", o, e.typ)
				r := &kgo.Record{Topic: topic, Partition: rand.Int32N(partitions),
					Value: fmt.Appendf(nil, `{"orderId":"%d"}`, o),
					Headers: []kgo.RecordHeader{
						{Key: "ce_specversion", Value: []byte("1.0")},
						{Key: "ce_id", Value: []byte(id)},
						{Key: "ce_type", Value: []byte(e.typ)},
						{Key: "ce_source", Value: []byte("/e2e/orders")},
						{Key: "content-type", Value: []byte("application/json")},
					}}
				if e.subtype != "" {
					r.Headers = append(r.Headers, kgo.RecordHeader{Key: "ce_validationresult", Value: []byte(e.subtype)})
				}
				recs = append(recs, r)
			}
		}
	}
	rand.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	return recs
}

// testStream sends an out-of-order, duplicated stream and checks that the sink receives every
// logical message exactly once, each order in an order its release conditions allow.
func testStream(t *testing.T, s *suite) {
	const orders, copies = 20, 3
	first := s.newOrders(orders)
	produce(t, s.producer, orderRecords(first, orders, copies))
	s.awaitProcessed(t, 5*time.Minute)
	checkExactlyOnceInOrder(t, s.sink.accepted(), first, orders)
}

// newOrders reserves n order numbers.
func (s *suite) newOrders(n int) int {
	first := s.nextOrder + 1
	s.nextOrder += n
	return first
}

// awaitProcessed waits until the consumer group committed every record of the topic.
func (s *suite) awaitProcessed(t *testing.T, timeout time.Duration) {
	t.Helper()
	var left int64
	testenv.WaitUntil(t, "the consumer group committed every record", timeout, func() bool {
		var err error
		left, err = s.unprocessed(t.Context())
		return err == nil && left == 0
	})
}

// unprocessed counts the records of the inbox's topic beyond its group's committed offsets.
func (s *suite) unprocessed(ctx context.Context) (int64, error) {
	return s.unprocessedOf(ctx, topic, inboxName)
}

// unprocessedOf counts the records of a topic beyond a group's committed offsets.
func (s *suite) unprocessedOf(ctx context.Context, topic, group string) (int64, error) {
	ends, err := s.admin.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	committed, err := s.admin.FetchOffsets(ctx, group)
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return 0, err
	}
	var left int64
	ends.Each(func(end kadm.ListedOffset) {
		at := int64(0)
		if c, ok := committed.Lookup(end.Topic, end.Partition); ok && c.Err == nil {
			at = c.At
		}
		left += max(end.Offset-at, 0)
	})
	return left, nil
}

// checkExactlyOnceInOrder asserts that the sink accepted each logical message of the orders
// exactly once, and per order after its predecessors.
func checkExactlyOnceInOrder(t *testing.T, log []delivery, first, n int) {
	t.Helper()
	checkExactlyOnceInOrderPrefixed(t, log, "", first, n)
}

// checkExactlyOnceInOrderPrefixed is checkExactlyOnceInOrder for IDs with a prefix.
func checkExactlyOnceInOrderPrefixed(t *testing.T, log []delivery, prefix string, first, n int) {
	t.Helper()
	seen := map[string]int{}
	position := map[string]int{}
	for i, d := range log {
		seen[d.ID]++
		position[d.ID] = i
	}
	for o := first; o < first+n; o++ {
		id := func(typ string) string { return fmt.Sprintf("%sorder-%d-%s", prefix, o, typ) }
		for _, e := range orderEvents {
			if c := seen[id(e.typ)]; c != 1 {
				t.Errorf("%s accepted %d times; want exactly once", id(e.typ), c)
			}
		}
		before := [][2]string{
			{"OrderCreated", "OrderValidated"}, {"OrderCreated", "OrderPaid"},
			{"OrderPaid", "OrderShipped"}, {"OrderValidated", "OrderShipped"}, {"OrderShipped", "OrderDelivered"},
		}
		for _, b := range before {
			if position[id(b[0])] > position[id(b[1])] {
				t.Errorf("order %d: %s reached the sink after %s", o, b[0], b[1])
			}
		}
	}
}

// dumpState logs what a person needs to see why a case failed.
func dumpState(t *testing.T) {
	for _, args := range [][]string{
		{"get", "sqi,deploy,pods,jobs", "-A", "-o", "wide"},
		{"-n", namespace, "get", "sqi", "-o", "yaml"},
		{"-n", operatorNamespace, "logs", "deployment/" + operatorName, "--tail=60"},
		{"-n", namespace, "logs", "-l", "app.kubernetes.io/instance=" + inboxName, "--tail=40", "--prefix"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		out, err := kubectlErr(context.Background(), nil, args...)
		t.Logf("kubectl %s:\n%s%v", strings.Join(args, " "), out, errOrNil(err))
	}
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// consumerPods lists the names of the inbox's consumer pods that are not being deleted.
func consumerPods(t *testing.T) []string {
	t.Helper()
	out := kubectl(t, "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/instance="+inboxName+",app.kubernetes.io/component=consumer",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}`)
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 1 {
			names = append(names, f[0])
		}
	}
	return names
}

// awaitReadyReplicas waits until the inbox reports n ready consumers.
func awaitReadyReplicas(t *testing.T, n int) {
	t.Helper()
	testenv.WaitUntil(t, fmt.Sprintf("%d consumer replicas are ready", n), 3*time.Minute, func() bool {
		out, err := kubectlErr(t.Context(), nil, "-n", namespace, "get", "deployment", "-l", "app.kubernetes.io/instance="+inboxName,
			"-o", "jsonpath={.items[0].status.readyReplicas}/{.items[0].status.replicas}")
		return err == nil && out == fmt.Sprintf("%d/%d", n, n)
	})
}

// testForceDelete force-deletes the consumer while the sink holds one of its deliveries: the
// message reaches the sink once afterwards, and so does everything else of its order.
func testForceDelete(t *testing.T, s *suite) {
	first := s.newOrders(1)
	held := fmt.Sprintf("order-%d-OrderCreated", first)
	arrived := s.sink.holdNext(held)
	recs := orderRecords(first, 1, 2)
	produce(t, s.producer, recs)
	select {
	case <-arrived:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the sink never received %s", held)
	}
	pods := consumerPods(t)
	if len(pods) != 1 {
		t.Fatalf("consumer pods %v; want one", pods)
	}
	kubectl(t, "-n", namespace, "delete", "pod", pods[0], "--grace-period=0", "--force")
	t.Logf("force-deleted %s while the sink held %s", pods[0], held)
	s.awaitProcessed(t, 5*time.Minute)
	log := s.sink.all()
	var heldSeen, acceptedAfter bool
	for _, d := range log {
		if d.ID == held && !d.Accepted {
			heldSeen = true
		}
		if d.ID == held && d.Accepted && heldSeen {
			acceptedAfter = true
		}
	}
	if !heldSeen || !acceptedAfter {
		t.Fatalf("%s: held delivery ended %v, accepted afterwards %v; want both", held, heldSeen, acceptedAfter)
	}
	checkExactlyOnceInOrder(t, s.sink.accepted(), first, 1)
}

// testScale scales the inbox from 1 to 3 consumers and back while orders keep arriving: every
// logical message reaches the sink exactly once, in order.
func testScale(t *testing.T, s *suite) {
	const batches, perBatch = 12, 5
	first := s.newOrders(batches * perBatch)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := range batches {
			if t.Context().Err() != nil {
				return
			}
			recs := orderRecords(first+b*perBatch, perBatch, 2)
			if err := s.producer.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
				t.Errorf("produce batch %d: %v", b, err)
				return
			}
			time.Sleep(2 * time.Second) // the load's pace, not synchronisation
		}
	}()
	kubectl(t, "-n", namespace, "scale", "sqi/"+inboxName, "--replicas=3")
	awaitReadyReplicas(t, 3)
	kubectl(t, "-n", namespace, "scale", "sqi/"+inboxName, "--replicas=1")
	awaitReadyReplicas(t, 1)
	<-done
	s.awaitProcessed(t, 5*time.Minute)
	checkExactlyOnceInOrder(t, s.sink.accepted(), first, batches*perBatch)
}

// testAction buffers an OrderPaid whose OrderCreated never comes, then applies a
// SequentialInboxAction Consume for it: the operator records it with a Job, a consumer pod
// delivers the message.
func testAction(t *testing.T, s *suite) {
	order := s.newOrders(1)
	id := fmt.Sprintf("order-%d-OrderPaid", order)
	var paid []*kgo.Record
	for _, r := range orderRecords(order, 1, 1) {
		if string(r.Headers[2].Value) == "OrderPaid" {
			paid = append(paid, r)
		}
	}
	produce(t, s.producer, paid)
	s.awaitProcessed(t, 2*time.Minute)
	if n := countAccepted(s.sink.accepted(), id); n != 0 {
		t.Fatalf("%s reached the sink before its predecessor; want it buffered", id)
	}
	action := fmt.Sprintf(`apiVersion: inbox.seqinbox.dev/v1alpha1
kind: SequentialInboxAction
metadata: {name: consume-%[1]d-paid, namespace: %[2]s}
spec:
  inboxName: %[3]s
  action: Consume
  message: {type: OrderPaid, idempotenceId: %[4]s}
`, order, namespace, inboxName, id)
	if _, err := kubectlErr(t.Context(), []byte(action), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "-n", namespace, "wait", "--for=condition=Recorded", fmt.Sprintf("sqia/consume-%d-paid", order), "--timeout=3m")
	testenv.WaitUntil(t, id+" delivered by the action", 2*time.Minute, func() bool {
		return countAccepted(s.sink.accepted(), id) > 0
	})
	if n := countAccepted(s.sink.accepted(), id); n != 1 {
		t.Fatalf("%s accepted %d times; want once", id, n)
	}
	t.Logf("kubectl get sqia:\n%s", kubectl(t, "-n", namespace, "get", "sqia"))
}

func countAccepted(log []delivery, id string) int {
	n := 0
	for _, d := range log {
		if d.ID == id {
			n++
		}
	}
	return n
}

// testUninstall deletes the inbox, whose finalizer stops the consumers first, then uninstalls the
// bundle: nothing of seqinbox is left in the cluster.
func testUninstall(t *testing.T, s *suite) {
	kubectl(t, "-n", namespace, "delete", "sqi", inboxName, "--timeout=3m")
	if pods := consumerPods(t); len(pods) != 0 {
		t.Fatalf("consumer pods %v remain after the inbox was deleted", pods)
	}
	// What the inbox owns goes with it (the garbage collector deletes it in the background);
	// the Jobs of its SequentialInboxActions belong to those requests, which stay until deleted.
	var out string
	testenv.WaitUntil(t, "the inbox's workload is gone", 2*time.Minute, func() bool {
		var err error
		out, err = kubectlErr(t.Context(), nil, "-n", namespace, "get", "deploy,rs,pods,jobs,configmaps,pdb,services", "-o", "name",
			"-l", "app.kubernetes.io/instance="+inboxName+",app.kubernetes.io/component!=action")
		return err == nil && out == ""
	})
	kubectl(t, "delete", "namespace", namespace, "--timeout=3m")
	kubectl(t, "delete", "-f", filepath.Join(env.root, "dist/install.yaml"), "--timeout=3m")
	left := []string{}
	for _, args := range [][]string{
		{"get", "crd", "-o", "name"},
		{"get", "clusterrole,clusterrolebinding", "-o", "name"},
		{"get", "namespace", "-o", "name"},
		{"get", "all", "-A", "-l", "app.kubernetes.io/part-of=seqinbox", "-o", "name"},
	} {
		for _, name := range strings.Fields(kubectl(t, args...)) {
			if strings.Contains(name, "seqinbox") {
				left = append(left, name)
			}
		}
	}
	if len(left) > 0 {
		t.Fatalf("left behind after uninstalling: %v", left)
	}
}
