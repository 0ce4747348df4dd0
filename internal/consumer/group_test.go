package consumer

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

// groupMembers returns the members of a consumer group as the broker sees them.
func groupMembers(t testing.TB, seeds []string, group string) []kadm.DescribedGroupMember {
	t.Helper()
	return describeGroup(t, seeds, group).Members
}

// describeGroup returns a consumer group as the broker sees it.
func describeGroup(t testing.TB, seeds []string, group string) kadm.DescribedGroup {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	described, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	return described[group]
}

func TestRebalanceWhileRecordsAreInFlightFinishesAndCommitsThemFirst(t *testing.T) {
	database(t)
	seeds := cluster(t, 3)
	hang := func(p int) string { return fmt.Sprintf("reb-hang-%d", p) }
	s := newSink(t, func(id string, attempt int) int {
		if strings.HasPrefix(id, "reb-hang-") {
			return 0 // held until the test releases it
		}
		return 200
	})
	inbox := testInbox(t, seeds, "g-reb", s.srv.URL, sinkOpts{timeout: 8 * time.Second})
	var recs []*kgo.Record
	for p := range 3 {
		recs = append(recs, event(int32(p), "OrderCreated", hang(p), fmt.Sprintf("reb-h%d", p)))
		for i := range 10 {
			order := fmt.Sprintf("reb-p%d-o%d", p, i)
			r := event(int32(p), "OrderCreated", order, order)
			// The held record's Kafka key: these wait for it, so that some are left to move.
			r.Key = []byte(fmt.Sprintf("reb-h%d", p))
			recs = append(recs, r)
		}
	}
	testenv.Produce(t, seeds, recs...)
	a := startConsumer(t, inbox, "reb-a")
	waitUntil(t, "a record of every partition is in flight", func() bool {
		return s.hanging(hang(0)) && s.hanging(hang(1)) && s.hanging(hang(2))
	})

	b := startConsumer(t, inbox, "reb-b")
	// Cooperative rebalancing: the first round takes a partition from the first member, whose
	// revocation then waits for that partition's in-flight record; only after it the partition
	// reaches the second member.
	waitUntil(t, "a partition is being revoked from the first member", func() bool {
		g := describeGroup(t, seeds, "g-reb")
		return g.State == "Stable" && len(g.Members) == 2 && assignedPartitions(g.Members) == 2
	})
	if n := b.events.count(""); n != 0 {
		t.Fatalf("the second member processed %d records while the partition was still revoking", n)
	}
	s.release.Open()
	waitUntil(t, "every record reached the sink", func() bool { return len(s.accepted()) == len(recs) })
	waitUntil(t, "both members processed records", func() bool { return a.events.count("")+b.events.count("") == len(recs) })

	for id, n := range s.accepted() {
		if n != 1 {
			t.Errorf("%s accepted %d times, want once", id, n)
		}
	}
	if n := len(s.deliveries()); n != len(recs) {
		t.Errorf("the sink received %d requests for %d records", n, len(recs))
	}
	if b.events.count("") == 0 {
		t.Fatalf("the second member processed nothing: no partition moved, the test proves nothing")
	}
	for _, e := range b.events.all() {
		if strings.HasPrefix(e.IdempotenceID, "reb-hang-") || e.Outcome == "Duplicate" {
			t.Errorf("the second member processed %s (%s): the first did not finish and commit its in-flight record before giving the partition up", e.IdempotenceID, e.Outcome)
		}
	}
	waitUntil(t, "every offset is committed", func() bool {
		for _, lag := range committedLag(t, seeds, "g-reb") {
			if lag != 0 {
				return false
			}
		}
		return true
	})
}

// assignedPartitions counts the partitions assigned to the members.
func assignedPartitions(members []kadm.DescribedGroupMember) int {
	n := 0
	for _, m := range members {
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, topic := range a.Topics {
				n += len(topic.Partitions)
			}
		}
	}
	return n
}

// otherProtocol keeps a consumer of another claim protocol registered and heartbeating in group
// until the returned function stops it (which deregisters it).
func otherProtocol(t *testing.T, pool *pgxpool.Pool, group string) (stop func()) {
	t.Helper()
	f, err := fence.New(pool, fence.Identity{InstanceID: "legacy-1", ConsumerGroup: group, EngineVersion: "v0.0.1", ClaimProtocol: "legacy-v0"},
		fence.Config{HeartbeatInterval: 100 * time.Millisecond, LivenessWindow: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx, func(bool, string) {})
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

func TestConsumerDoesNotFetchNextToALiveConsumerOfAnotherClaimProtocol(t *testing.T) {
	pool := database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	stopOther := otherProtocol(t, pool, "g-fence")
	testenv.Produce(t, seeds, event(0, "OrderCreated", "fence-1", "fence-o1"))

	r := startConsumer(t, testInbox(t, seeds, "g-fence", s.srv.URL, sinkOpts{}), "fence-new")
	waitUntil(t, "the consumer says why it waits", func() bool {
		_, reason := r.c.Ready()
		return strings.Contains(reason, "another claim protocol") && strings.Contains(reason, "legacy-1")
	})
	status, body := get(t, r.c.Handler(), "/readyz")
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "legacy-v0") {
		t.Fatalf("/readyz = %d %q, want 503 naming the other protocol", status, body)
	}
	if members := groupMembers(t, seeds, "g-fence"); len(members) != 0 {
		t.Fatalf("the blocked consumer joined the group (%d members); it must not fetch", len(members))
	}
	if n := len(s.deliveries()) + r.events.count(""); n != 0 {
		t.Fatalf("the blocked consumer processed records")
	}

	stopOther()
	r.waitReady(t)
	waitUntil(t, "the record was processed once the other consumer left", func() bool { return s.accepted()["fence-1"] == 1 })
}

func TestConsumerWaitsForTheSchemaItNeeds(t *testing.T) {
	database(t)
	ctx := context.Background()
	fresh := testenv.FreshDatabase(t, "consumer_schema")
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	testenv.Produce(t, seeds, event(0, "OrderCreated", "schema-1", "schema-o1"))

	r := startConsumer(t, testInbox(t, seeds, "g-schema", s.srv.URL, sinkOpts{}), "schema-1", func(c *Config) { c.DatabaseURL = fresh })
	waitUntil(t, "the consumer says the schema is too old", func() bool {
		_, reason := r.c.Ready()
		return strings.Contains(reason, "older than") && strings.Contains(reason, "seqinbox migrate")
	})
	if members := groupMembers(t, seeds, "g-schema"); len(members) != 0 {
		t.Fatalf("the consumer joined the group on an old schema (%d members)", len(members))
	}

	pool := testenv.Pool(t, fresh)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	r.waitReady(t)
	waitUntil(t, "the record was processed after the migration", func() bool { return s.accepted()["schema-1"] == 1 })
}

func TestHealthReadinessAndMetrics(t *testing.T) {
	database(t)
	seeds := cluster(t, 1)
	s := newSink(t, nil)
	r := startConsumer(t, testInbox(t, seeds, "g-metrics", s.srv.URL, sinkOpts{}), "metrics-1")
	r.waitReady(t)
	testenv.Produce(t, seeds, event(0, "OrderCreated", "m-1", "m-o1"), event(0, "InvoiceSent", "m-2", "m-o1"))
	waitUntil(t, "both records were processed", func() bool { return r.events.count("") == 2 })
	waitUntil(t, "the lag is down to zero", func() bool { return gauge(t, r.c, "seqinbox_consumer_lag", "partition", "0") == 0 })

	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200} {
		if status, body := get(t, r.c.Handler(), path); status != want {
			t.Errorf("%s = %d %q, want %d", path, status, body, want)
		}
	}
	tests := []struct {
		family, label, value string
		want                 float64
	}{
		{"seqinbox_records_total", "outcome", "Delivered", 1},
		{"seqinbox_records_total", "outcome", "DeadLettered", 1},
		{"seqinbox_dead_letters_total", "reason", "UndeclaredType", 1},
		{"seqinbox_claims_total", "result", "Won", 1},
		{"seqinbox_sink_request_duration_seconds", "code", "2xx", 1},
		{"seqinbox_consumer_ready", "", "", 1},
	}
	for _, tt := range tests {
		if got := gauge(t, r.c, tt.family, tt.label, tt.value); got != tt.want {
			t.Errorf("%s{%s=%q} = %v, want %v", tt.family, tt.label, tt.value, got, tt.want)
		}
	}
	if status, body := get(t, r.c.Handler(), "/metrics"); status != 200 || !strings.Contains(body, "seqinbox_consumer_lag") {
		t.Errorf("/metrics = %d without the lag gauge", status)
	}

	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if status, _ := get(t, r.c.Handler(), "/readyz"); status != http.StatusServiceUnavailable {
		t.Errorf("/readyz after the stop = %d, want 503", status)
	}
}

func get(t testing.TB, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body)
}

// gauge returns the value of the series of a family with the given label (any series when label
// is empty); a histogram reads as its sample count, a missing series as -1.
func gauge(t testing.TB, c *Consumer, family, label, value string) float64 {
	t.Helper()
	families, err := c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			if label != "" && !hasLabel(m, label, value) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
