package consumer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

// foreignConsumer is a plain franz-go group consumer of the orders topic, as another application
// would run it (default balancers unless the test gives others). It polls only when asked to.
type foreignConsumer struct {
	cl  *kgo.Client
	mu  sync.Mutex
	ids []string
}

func startForeign(t *testing.T, seeds []string, group, clientID string, opts ...kgo.Opt) *foreignConsumer {
	t.Helper()
	opts = append([]kgo.Opt{
		kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics("orders"), kgo.ClientID(clientID),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
	}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &foreignConsumer{cl: cl}
}

// consume polls until it read n records, then commits them; it keeps its group membership.
func (f *foreignConsumer) consume(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for f.read() < n {
		fetches := f.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the foreign consumer read %d of %d records", f.read(), n)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			f.mu.Lock()
			f.ids = append(f.ids, headerOf(r, "ce_id"))
			f.mu.Unlock()
		})
	}
	if err := f.cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("the foreign consumer commits: %v", err)
	}
}

func (f *foreignConsumer) read() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ids)
}

// refusedJoin polls until the broker refuses the join, and fails the test when a record or an
// assignment comes instead.
func (f *foreignConsumer) refusedJoin(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for {
		fetches := f.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("the foreign consumer was neither refused nor given records")
		}
		if n := fetches.NumRecords(); n > 0 {
			t.Fatalf("the foreign consumer read %d records next to ours", n)
		}
		for _, fe := range fetches.Errors() {
			if errors.Is(fe.Err, kerr.InconsistentGroupProtocol) {
				return fe.Err
			}
		}
	}
}

// orders returns n OrderCreated records per partition of orders, with ids prefix-p<partition>-<i>.
func orders(prefix string, partitions int32, n int) ([]*kgo.Record, []string) {
	var recs []*kgo.Record
	var ids []string
	for p := range partitions {
		for i := range n {
			id := fmt.Sprintf("%s-p%d-%d", prefix, p, i)
			recs = append(recs, event(p, "OrderCreated", id, id))
			ids = append(ids, id)
		}
	}
	return recs, ids
}

// processedIDs lists the idempotence ids of the records a consumer processed.
func processedIDs(r *running) []string {
	var ids []string
	for _, e := range r.events.all() {
		ids = append(ids, e.IdempotenceID)
	}
	slices.Sort(ids)
	return ids
}

// firstRecordAt records when a consumer processed its first record.
type firstRecordAt struct {
	once sync.Once
	at   chan time.Time
}

func (f *firstRecordAt) tweak(c *Config) {
	f.at = make(chan time.Time, 1)
	next := c.OnRecord
	c.OnRecord = func(e Event) {
		f.once.Do(func() { f.at <- time.Now() })
		next(e)
	}
}

func TestForeignConsumerHoldsTheGroupOursWaitsNamesItAndTakesOverWhenItLeaves(t *testing.T) {
	database(t)
	seeds := cluster(t, 3)
	s := newSink(t, nil)
	before, beforeIDs := orders("fg-before", 3, 4)
	testenv.Produce(t, seeds, before...)
	legacy := startForeign(t, seeds, "g-foreign", "legacy-order-app")
	legacy.consume(t, len(before))

	first := &firstRecordAt{}
	ours := startConsumer(t, testInbox(t, seeds, "g-foreign", s.srv.URL, sinkOpts{}), "fg-ours", first.tweak)
	waitUntil(t, "our consumer reports the foreign member that holds the group", func() bool {
		_, reason := ours.c.Ready()
		return strings.Contains(reason, "client legacy-order-app") && strings.Contains(reason, "protocol cooperative-sticky")
	})
	after, afterIDs := orders("fg-after", 3, 4)
	testenv.Produce(t, seeds, after...)
	refusals := gauge(t, ours.c, "seqinbox_consumer_group_join_refusals_total", "", "")
	waitUntil(t, "our consumer was refused twice more while records wait", func() bool {
		return gauge(t, ours.c, "seqinbox_consumer_group_join_refusals_total", "", "") >= refusals+2
	})

	ready, reason := ours.c.Ready()
	t.Logf("readiness while the foreign member holds the group: %v %q", ready, reason)
	if ready {
		t.Fatal("our consumer is ready while the broker refuses it")
	}
	if status, body := get(t, ours.c.Handler(), "/readyz"); status != http.StatusServiceUnavailable || !strings.Contains(body, "legacy-order-app") {
		t.Errorf("/readyz = %d %q, want 503 naming the foreign member", status, body)
	}
	if got := gauge(t, ours.c, "seqinbox_consumer_group_foreign_member", "client_id", "legacy-order-app"); got != 1 {
		t.Errorf("seqinbox_consumer_group_foreign_member{client_id=legacy-order-app} = %v, want 1", got)
	}
	if got := gauge(t, ours.c, "seqinbox_consumer_ready", "", ""); got != 0 {
		t.Errorf("seqinbox_consumer_ready = %v while refused, want 0", got)
	}
	if n := ours.events.count("") + len(s.deliveries()); n != 0 {
		t.Fatalf("our consumer processed %d records while the foreign member held the group", n)
	}
	for _, m := range groupMembers(t, seeds, "g-foreign") {
		if m.ClientID != "legacy-order-app" {
			t.Fatalf("group member %s (client %s) is not the foreign consumer: ours joined next to it", m.MemberID, m.ClientID)
		}
	}

	left := time.Now()
	legacy.cl.Close() // leaves the group
	waitUntil(t, "our consumer processed the records the foreign one left", func() bool { return ours.events.count("") == len(after) })
	t.Logf("from the foreign member leaving to our first record: %s", (<-first.at).Sub(left).Round(time.Millisecond))
	ours.waitReady(t)
	if got := gauge(t, ours.c, "seqinbox_consumer_group_foreign_member", "client_id", "legacy-order-app"); got != -1 {
		t.Errorf("seqinbox_consumer_group_foreign_member still reports the foreign member after the join (%v)", got)
	}

	slices.Sort(afterIDs)
	if got := processedIDs(ours); !slices.Equal(got, afterIDs) {
		t.Errorf("our consumer processed %v, want exactly the records the foreign one did not commit %v", got, afterIDs)
	}
	slices.Sort(beforeIDs)
	slices.Sort(legacy.ids)
	if !slices.Equal(legacy.ids, beforeIDs) {
		t.Errorf("the foreign consumer read %v, want %v", legacy.ids, beforeIDs)
	}
	for _, id := range afterIDs {
		if n := s.accepted()[id]; n != 1 {
			t.Errorf("%s reached the sink %d times, want once", id, n)
		}
	}
	if n := len(s.deliveries()); n != len(after) {
		t.Errorf("the sink received %d requests, want %d: a record the foreign consumer committed was processed again", n, len(after))
	}
}

func TestOursHoldsTheGroupAndAForeignClientIsRefused(t *testing.T) {
	database(t)
	seeds := cluster(t, 3)
	s := newSink(t, nil)
	ours := startConsumer(t, testInbox(t, seeds, "g-ours", s.srv.URL, sinkOpts{}), "og-ours")
	ours.waitReady(t)
	held := describeGroup(t, seeds, "g-ours")

	// The assignors of a Java consumer's default configuration.
	other := startForeign(t, seeds, "g-ours", "other-app", kgo.Balancers(kgo.RangeBalancer(), kgo.CooperativeStickyBalancer()))
	err := other.refusedJoin(t)
	t.Logf("the foreign client's poll: %v", err)

	recs, ids := orders("og", 3, 3)
	testenv.Produce(t, seeds, recs...)
	waitUntil(t, "our consumer processed every record", func() bool { return ours.events.count("") == len(recs) })
	other.refusedJoin(t) // still refused, still without a record
	g := describeGroup(t, seeds, "g-ours")
	if len(g.Members) != 1 || g.Members[0].ClientID != "seqinbox-og-ours" || g.Protocol != "seqinbox-"+inbox.ClaimProtocol {
		t.Fatalf("group %s protocol %s members %+v, want only our consumer under seqinbox-%s", g.Group, g.Protocol, g.Members, inbox.ClaimProtocol)
	}
	if g.Members[0].MemberID != held.Members[0].MemberID || assignedPartitions(g.Members) != 3 {
		t.Errorf("our consumer lost its membership or partitions to the refused client")
	}
	slices.Sort(ids)
	if got := processedIDs(ours); !slices.Equal(got, ids) {
		t.Errorf("our consumer processed %v, want %v", got, ids)
	}
}

// migratedDatabase is a fresh database with the inbox schema: the registry of another
// installation, which does not see the consumers of the package's database.
func migratedDatabase(t *testing.T, prefix string) string {
	t.Helper()
	url := testenv.FreshDatabase(t, prefix)
	pool := testenv.Pool(t, url)
	if _, err := migrations.Apply(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return url
}

func TestConsumersOfDifferentClaimProtocolsNeverShareAGeneration(t *testing.T) {
	database(t)
	// The second consumer uses another database: its registry cannot see the first, so only
	// the broker stands between them (a gate and a registry bypassed).
	elsewhere := migratedDatabase(t, "consumer_protocol")
	seeds := cluster(t, 3)
	s := newSink(t, nil)
	in := testInbox(t, seeds, "g-protocols", s.srv.URL, sinkOpts{})
	current := startConsumer(t, in, "gp-v1")
	current.waitReady(t)

	next := startConsumer(t, in, "gp-v2", func(c *Config) {
		c.DatabaseURL = elsewhere
		c.build = build{engineVersion: "v9.0.0", claimProtocol: "claim-after-v2"}
	})
	waitUntil(t, "the consumer of the other claim protocol names the member that holds the group", func() bool {
		_, reason := next.c.Ready()
		return strings.Contains(reason, "client seqinbox-gp-v1") && strings.Contains(reason, "protocol seqinbox-"+inbox.ClaimProtocol) &&
			strings.Contains(reason, "announces only group protocol seqinbox-claim-after-v2")
	})
	recs, ids := orders("gp", 3, 3)
	testenv.Produce(t, seeds, recs...)
	waitUntil(t, "the current consumer processed every record", func() bool { return current.events.count("") == len(recs) })
	if n := next.events.count(""); n != 0 {
		t.Fatalf("the consumer of the other claim protocol processed %d records next to the current one", n)
	}
	if g := describeGroup(t, seeds, "g-protocols"); len(g.Members) != 1 || g.Members[0].ClientID != "seqinbox-gp-v1" {
		t.Fatalf("group members %+v: the consumers of two claim protocols share a generation", g.Members)
	}

	if err := current.stop(t); err != nil {
		t.Fatal(err)
	}
	next.waitReady(t)
	g := describeGroup(t, seeds, "g-protocols")
	if len(g.Members) != 1 || g.Members[0].ClientID != "seqinbox-gp-v2" || g.Protocol != "seqinbox-claim-after-v2" {
		t.Fatalf("after the current consumer left: group protocol %s members %+v, want only the next one", g.Protocol, g.Members)
	}
	slices.Sort(ids)
	if got := processedIDs(current); !slices.Equal(got, ids) {
		t.Errorf("the current consumer processed %v, want %v", got, ids)
	}
}

func TestANewEngineVersionOfTheSameClaimProtocolSharesTheGroup(t *testing.T) {
	database(t)
	seeds := cluster(t, 4)
	s := newSink(t, nil)
	in := testInbox(t, seeds, "g-upgrade", s.srv.URL, sinkOpts{})
	old := startConsumer(t, in, "gu-old", func(c *Config) {
		c.build = build{engineVersion: "v1.0.0", claimProtocol: inbox.ClaimProtocol}
	})
	old.waitReady(t)
	upgraded := startConsumer(t, in, "gu-new", func(c *Config) {
		c.build = build{engineVersion: "v1.1.0", claimProtocol: inbox.ClaimProtocol}
	})
	waitUntil(t, "both versions are members and share the partitions", func() bool {
		g := describeGroup(t, seeds, "g-upgrade")
		if g.State != "Stable" || len(g.Members) != 2 {
			return false
		}
		for _, m := range g.Members {
			if assignedPartitions([]kadm.DescribedGroupMember{m}) == 0 {
				return false
			}
		}
		return assignedPartitions(g.Members) == 4
	})
	upgraded.waitReady(t)
	old.waitReady(t)

	recs, ids := orders("gu", 4, 5)
	testenv.Produce(t, seeds, recs...)
	waitUntil(t, "every record was processed", func() bool { return old.events.count("")+upgraded.events.count("") == len(recs) })
	if old.events.count("") == 0 || upgraded.events.count("") == 0 {
		t.Fatalf("old processed %d, upgraded %d: the versions did not share the partitions", old.events.count(""), upgraded.events.count(""))
	}
	got := append(processedIDs(old), processedIDs(upgraded)...)
	slices.Sort(got)
	slices.Sort(ids)
	if !slices.Equal(got, ids) {
		t.Errorf("processed %v, want every record once: %v", got, ids)
	}
	for id, n := range s.accepted() {
		if n != 1 {
			t.Errorf("%s reached the sink %d times", id, n)
		}
	}
}
