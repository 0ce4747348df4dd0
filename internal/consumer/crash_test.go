package consumer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/twmb/franz-go/pkg/kgo"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
)

// A child consumer is this test binary started again with the manifest and database URL in its
// environment: a real process the test can kill with SIGKILL, as a crashed pod dies, without
// leaving the consumer group or closing anything.
const (
	childManifestEnv = "SEQINBOX_TEST_CHILD_MANIFEST"
	childDatabaseEnv = "SEQINBOX_TEST_CHILD_DATABASE_URL"
	childInstanceEnv = "SEQINBOX_TEST_CHILD_INSTANCE"
)

// runChildConsumer runs one consumer until SIGTERM (or until it is killed).
func runChildConsumer() int {
	in, err := manifest.Parse([]byte(os.Getenv(childManifestEnv)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child consumer:", err)
		return 2
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{})
	c, err := New(Config{
		Inbox: in, DatabaseURL: os.Getenv(childDatabaseEnv), InstanceID: os.Getenv(childInstanceEnv),
		Fence:          fence.Config{HeartbeatInterval: 100 * time.Millisecond, LivenessWindow: 3 * time.Second},
		CommitInterval: 100 * time.Millisecond, Log: log,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child consumer:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child consumer:", err)
		return 1
	}
	return 0
}

// startChild starts a child consumer process; it is killed when the test ends.
func startChild(t *testing.T, in any, instance string) *exec.Cmd {
	t.Helper()
	doc, err := yaml.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childManifestEnv+"="+string(doc), childDatabaseEnv+"="+dbURL, childInstanceEnv+"="+instance)
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("child consumer %s log:\n%s", instance, logs.String())
		}
	})
	return cmd
}

// TestCrashedConsumersPartitionsGoToTheOtherMember kills a consumer process with SIGKILL in the
// middle of a delivery, without leaving the group: the surviving member must get its partitions
// once the session timeout passed, deliver the interrupted record and every record behind it
// exactly once. The time from the kill to the survivor's delivery of the interrupted record is
// logged (the default session timeout is 10 s; before spec.kafka.sessionTimeoutMs it was
// franz-go's 45 s).
func TestCrashedConsumersPartitionsGoToTheOtherMember(t *testing.T) {
	database(t)
	const partitions = 4
	seeds := cluster(t, partitions)
	// The first request for crash-hang hangs until the killed consumer's connection goes away;
	// the arrival of the second one is when the survivor took the partition over.
	var (
		hangRequests atomic.Int32
		takenOverAt  atomic.Int64
	)
	s := newSink(t, func(id string, _ int) int {
		if id != "crash-hang" {
			return 200
		}
		if hangRequests.Add(1) == 1 {
			return 0
		}
		takenOverAt.CompareAndSwap(0, time.Now().UnixNano())
		return 200
	})
	in := testInbox(t, seeds, "g-crash", s.srv.URL, sinkOpts{timeout: 8 * time.Second})
	child := startChild(t, in, "crash-child")
	waitUntil(t, "the child joined the group", func() bool { return stableMembers(t, seeds, "g-crash") == 1 })
	survivor := startConsumer(t, in, "crash-survivor")
	survivor.waitReady(t)
	waitUntil(t, "both members share the group", func() bool { return stableMembers(t, seeds, "g-crash") == 2 })

	// Warm up until the two members share the partitions: the survivor has a lag series for
	// every partition it owns and got a record on; the others are the child's.
	var childPartitions []int32
	for round := 0; len(childPartitions) == 0 || len(childPartitions) == partitions; round++ {
		waitUntil(t, "the group is stable", func() bool { return stableMembers(t, seeds, "g-crash") == 2 })
		if round == 30 {
			t.Fatalf("the members never shared the partitions")
		}
		var recs []*kgo.Record
		for p := range int32(partitions) {
			recs = append(recs, event(p, "OrderCreated", fmt.Sprintf("warm-%d-%d", round, p), fmt.Sprintf("warm-o%d-%d", round, p)))
		}
		testenv.Produce(t, seeds, recs...)
		waitUntil(t, "the warm-up round reached the sink", func() bool { return len(s.accepted()) == (round+1)*partitions })
		childPartitions = childPartitions[:0]
		for p := range int32(partitions) {
			if gauge(t, survivor.c, "seqinbox_consumer_lag", "partition", strconv.Itoa(int(p))) < 0 {
				childPartitions = append(childPartitions, p)
			}
		}
	}
	warmed := len(s.accepted())
	before := len(survivor.events.all())

	hang := childPartitions[0]
	testenv.Produce(t, seeds, event(hang, "OrderCreated", "crash-hang", "crash-o-hang"))
	waitUntil(t, "the child's delivery hangs in the sink", func() bool { return s.hanging("crash-hang") })
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	var behind []*kgo.Record
	for _, p := range childPartitions {
		r := event(p, "OrderCreated", fmt.Sprintf("crash-after-%d", p), fmt.Sprintf("crash-o%d", p))
		if p == hang {
			// The interrupted record's Kafka key: it must wait for that record (records of other
			// keys and contexts of a partition run concurrently).
			r.Key = []byte("crash-o-hang")
		}
		behind = append(behind, r)
	}
	testenv.Produce(t, seeds, behind...)

	waitUntil(t, "the survivor processed the dead member's records", func() bool {
		n := 0
		for _, e := range survivor.events.all()[before:] {
			if strings.HasPrefix(e.IdempotenceID, "crash-") {
				n++
			}
		}
		return n == len(behind)+1
	})
	t.Logf("recovery: %s from SIGKILL to the survivor delivering the interrupted record (session timeout %d ms, heartbeat %d ms)",
		time.Unix(0, takenOverAt.Load()).Sub(killedAt).Round(100*time.Millisecond), in.Spec.Kafka.SessionTimeoutMs, in.Spec.Kafka.HeartbeatIntervalMs)

	accepted := s.accepted()
	if len(accepted) != warmed+len(behind)+1 {
		t.Errorf("%d messages accepted, want %d", len(accepted), warmed+len(behind)+1)
	}
	for id, n := range accepted {
		if n != 1 {
			t.Errorf("%s accepted %d times, want once", id, n)
		}
	}
	// The interrupted record comes first on its partition, then the record of its key behind it.
	var order []string
	for _, e := range survivor.events.all()[before:] {
		if e.Origin.Partition == hang && strings.HasPrefix(e.IdempotenceID, "crash-") {
			order = append(order, e.IdempotenceID)
		}
	}
	if want := []string{"crash-hang", fmt.Sprintf("crash-after-%d", hang)}; strings.Join(order, ",") != strings.Join(want, ",") {
		t.Errorf("the survivor processed partition %d as %v, want %v", hang, order, want)
	}
}

// stableMembers is the number of members of a stable group, -1 while it rebalances.
func stableMembers(t testing.TB, seeds []string, group string) int {
	t.Helper()
	if g := describeGroup(t, seeds, group); g.Err == nil && g.State == "Stable" {
		return len(g.Members)
	}
	return -1
}

func TestGroupTimesAreCheckedAgainstEachOtherAndThePollInterval(t *testing.T) {
	tests := []struct {
		session, heartbeat int32
		wantField          string // empty: valid
	}{
		{10000, 1000, ""},
		{10000, 3333, ""},
		{0, 0, ""},
		{10000, 3334, "heartbeatIntervalMs"},
		{400000, 1000, "sessionTimeoutMs"},
		{-1, 1000, "sessionTimeoutMs"},
	}
	for _, tt := range tests {
		err := checkGroupTimes(&v1alpha1.KafkaSpec{MaxPollIntervalMs: 300000, SessionTimeoutMs: tt.session, HeartbeatIntervalMs: tt.heartbeat})
		if tt.wantField == "" && err != nil || tt.wantField != "" && (err == nil || !strings.Contains(err.Error(), "spec.kafka."+tt.wantField)) {
			t.Errorf("session %d, heartbeat %d: %v; want an error naming %q (empty: none)", tt.session, tt.heartbeat, err, tt.wantField)
		}
	}
}
