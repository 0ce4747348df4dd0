package inbox

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// gathered returns the value of one sample of a gathered family ("" matches unlabelled samples;
// otherwise the first label's value), and whether it exists.
func gathered(t *testing.T, families []*dto.MetricFamily, name, label string) (float64, bool) {
	t.Helper()
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if label != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[len(m.GetLabel())-1].GetValue() != label) {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// withMetrics gives the engine collectors the test gathers.
func withMetrics(m *Metrics) harnessOption {
	return func(s *harnessSettings) { s.metrics = m }
}

func TestMetricsReportDatabaseStateAndEngineEvents(t *testing.T) {
	m := NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collectors()...)
	h := newIsolatedHarness(t, chainSet(), withMetrics(m), func(c *harnessSettings) { c.ExpiringSoonWindow = 2 * time.Hour })
	e := h.engine
	if leader, err := e.LeadHousekeeping(context.Background()); err != nil || !leader {
		t.Fatalf("LeadHousekeeping = %v, %v; want the only engine to lead", leader, err)
	}

	h.process(h.rec("B", "b1", "x"))
	h.process(h.rec("B", "b2", "y"))
	h.process(h.rec("C", "c1", "y"))
	h.process(h.rec("A", "a1", "x"))
	h.process(h.rec("A", "a1", "x"))

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, label string
		want        float64
	}{
		{"seqinbox_messages_waiting", "B", 1},
		{"seqinbox_messages_waiting", "C", 1},
		{"seqinbox_instances_expiring_soon", "", 2},
		{"seqinbox_instances_expired", "", 0},
		{"seqinbox_claims_total", "Won", 4},
		{"seqinbox_claims_total", "Lost", 1},
		{"seqinbox_messages_buffered_total", "B", 2},
		{"seqinbox_messages_consumed_total", "A", 1},
		{"seqinbox_messages_consumed_total", "B", 1},
		{"seqinbox_message_waiting_seconds", "B", 1},
		{"seqinbox_listener_duration_seconds", "A", 1},
	} {
		if got, ok := gathered(t, families, c.name, c.label); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.name, c.label, got, ok, c.want)
		}
	}
	if _, ok := gathered(t, families, "seqinbox_messages_waiting", "A"); ok {
		t.Error("waiting gauge reports A, which is not waiting")
	}

	// Past retain_until (1h), before remove_after (retain_until + 1h): marked, not deleted.
	h.clock.Step(90 * time.Minute)
	if _, err := e.Housekeep(context.Background(), HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: 10, MaxDuration: time.Minute}, &recordingDeadLetterer{}); err != nil {
		t.Fatal(err)
	}
	families, err = reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := gathered(t, families, "seqinbox_instances_expired", ""); got != 2 {
		t.Errorf("expired instances = %v, want 2", got)
	}
	if got, _ := gathered(t, families, "seqinbox_housekeeping_expired_instances_total", ""); got != 2 {
		t.Errorf("housekeeping marked = %v, want 2", got)
	}
	if got, _ := gathered(t, families, "seqinbox_housekeeping_duration_seconds", ""); got != 1 {
		t.Errorf("housekeeping runs observed = %v, want 1", got)
	}
}

// databaseWideGauges are the gauges read from the database at scrape time.
var databaseWideGauges = []string{"seqinbox_messages_waiting", "seqinbox_instances_expiring_soon", "seqinbox_instances_expired"}

// servedDatabaseWide returns the database-wide gauges reg serves a sample of.
func servedDatabaseWide(t *testing.T, reg prometheus.Gatherer) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var served []string
	for _, name := range databaseWideGauges {
		for _, f := range families {
			if f.GetName() == name && len(f.GetMetric()) > 0 {
				served = append(served, name)
			}
		}
	}
	return served
}

// TestDatabaseWideGaugesComeOnlyFromTheHousekeepingLeader runs two engines (two consumer pods) on
// one database: only the one holding the housekeeping lease serves the database-wide gauges, so a
// sum over pods counts every WAITING message once; when the leader's lease runs out behind its
// back (it stopped renewing) it stops serving them at once, and the other takes over at its next
// housekeeping try.
func TestDatabaseWideGaugesComeOnlyFromTheHousekeepingLeader(t *testing.T) {
	db := testenv.FreshDatabase(t, "inbox_isolated")
	regA, regB := prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()
	mA, mB := NewMetrics(), NewMetrics()
	regA.MustRegister(mA.Collectors()...)
	regB.MustRegister(mB.Collectors()...)
	a := newHarnessOn(t, db, chainSet(), withMetrics(mA))
	b := newHarnessOn(t, db, chainSet(), withMetrics(mB))
	a.process(a.rec("B", "b1", "x"))
	b.process(b.rec("C", "c1", "y"))
	ctx := context.Background()
	hc := HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: 10, MaxDuration: time.Minute}

	if a, b := servedDatabaseWide(t, regA), servedDatabaseWide(t, regB); len(a) != 0 || len(b) != 0 {
		t.Fatalf("database-wide gauges before any engine leads: A %v, B %v; want none", a, b)
	}
	if leader, err := a.engine.LeadHousekeeping(ctx); err != nil || !leader {
		t.Fatalf("A LeadHousekeeping = %v, %v; want A to lead", leader, err)
	}
	if rep := b.housekeep(hc, &recordingDeadLetterer{}); rep.Leader {
		t.Fatalf("B housekeeping while A leads = %+v, want nothing done", rep)
	}
	if got := servedDatabaseWide(t, regA); !slices.Equal(got, databaseWideGauges) {
		t.Fatalf("leader A serves %v, want %v", got, databaseWideGauges)
	}
	if got := servedDatabaseWide(t, regB); len(got) != 0 {
		t.Fatalf("B, not leading, serves %v; a sum over pods would count them twice", got)
	}
	var sum float64
	for _, reg := range []prometheus.Gatherer{regA, regB} {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, typ := range []string{"B", "C"} {
			n, _ := gathered(t, families, "seqinbox_messages_waiting", typ)
			sum += n
		}
	}
	if sum != 2 {
		t.Fatalf("sum over both pods of seqinbox_messages_waiting = %v, want the 2 WAITING messages", sum)
	}

	// A's lease runs out behind its back (it hung, or lost the database for a minute): A stops
	// serving before it notices.
	if _, err := b.pool.Exec(ctx, `UPDATE housekeeping_lease SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if got := servedDatabaseWide(t, regA); len(got) != 0 {
		t.Fatalf("A serves %v after its lease ran out, want none", got)
	}
	if rep := b.housekeep(hc, &recordingDeadLetterer{}); !rep.Leader {
		t.Fatalf("B housekeeping after A's lease ran out = %+v, want B to lead", rep)
	}
	if got := servedDatabaseWide(t, regB); !slices.Equal(got, databaseWideGauges) {
		t.Fatalf("new leader B serves %v, want %v", got, databaseWideGauges)
	}
	if rep, err := a.engine.Housekeep(ctx, hc, &recordingDeadLetterer{}); err != nil || rep.Leader {
		t.Fatalf("A's housekeeping after B took the lead = %+v, %v; want nothing done", rep, err)
	}
	if leader, err := a.engine.LeadHousekeeping(ctx); err != nil || leader {
		t.Fatalf("A LeadHousekeeping while B leads = %v, %v; want A not to lead", leader, err)
	}
	if got := servedDatabaseWide(t, regA); len(got) != 0 {
		t.Fatalf("A serves %v while B leads, want none", got)
	}

	b.engine.ResignHousekeeping()
	if got := servedDatabaseWide(t, regB); len(got) != 0 {
		t.Fatalf("B serves %v after it resigned, want none", got)
	}
	if leader, err := a.engine.LeadHousekeeping(ctx); err != nil || !leader {
		t.Fatalf("A LeadHousekeeping after B resigned = %v, %v; want A to lead", leader, err)
	}
}

// TestOneOfTwoRacingEnginesLeadsHousekeeping lets two engines try to take the lead at the same
// moment, many times: exactly one leads each time.
func TestOneOfTwoRacingEnginesLeadsHousekeeping(t *testing.T) {
	db := testenv.FreshDatabase(t, "inbox_isolated")
	engines := []*Engine{newHarnessOn(t, db, chainSet()).engine, newHarnessOn(t, db, chainSet()).engine}
	for i := range 50 {
		start := make(chan struct{})
		leads := make([]bool, len(engines))
		var wg sync.WaitGroup
		for j, e := range engines {
			wg.Go(func() {
				<-start
				leader, err := e.LeadHousekeeping(context.Background())
				if err != nil {
					t.Error(err)
				}
				leads[j] = leader
			})
		}
		close(start)
		wg.Wait()
		if leads[0] == leads[1] {
			t.Fatalf("iteration %d: leads = %v, want exactly one leader", i, leads)
		}
		for _, e := range engines {
			e.ResignHousekeeping()
		}
	}
}

// TestOneLeaderUnderTwoEnginesRenewingAndRunning lets two engines on one database take or renew
// the lead and run housekeeping in a loop, as two consumers do, for SEQINBOX_LEADER_SOAK (default
// 5s; `make test` runs it through PgBouncer in transaction mode too, where a session-level lock
// made both lead): exactly one engine ever leads or runs housekeeping.
func TestOneLeaderUnderTwoEnginesRenewingAndRunning(t *testing.T) {
	soak := 5 * time.Second
	if v := os.Getenv("SEQINBOX_LEADER_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SEQINBOX_LEADER_SOAK: %v", err)
		}
		soak = d
	}
	db := testenv.FreshDatabase(t, "inbox_isolated")
	engines := []*Engine{newHarnessOn(t, db, chainSet()).engine, newHarnessOn(t, db, chainSet()).engine}
	hc := HousekeepingConfig{ExpiryDelay: time.Hour, BatchSize: 10, MaxDuration: time.Minute}
	var (
		leads, runs [2]atomic.Int64
		wg          sync.WaitGroup
		end         = time.Now().Add(soak)
	)
	for i, e := range engines {
		wg.Go(func() {
			for time.Now().Before(end) {
				leader, err := e.LeadHousekeeping(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				if leader {
					leads[i].Add(1)
				}
				rep, err := e.Housekeep(context.Background(), hc, &recordingDeadLetterer{})
				if err != nil {
					t.Error(err)
					return
				}
				if rep.Leader {
					runs[i].Add(1)
				}
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	t.Logf("over %s: leads %d/%d, runs %d/%d", soak, leads[0].Load(), leads[1].Load(), runs[0].Load(), runs[1].Load())
	if (leads[0].Load() == 0) == (leads[1].Load() == 0) || (runs[0].Load() == 0) == (runs[1].Load() == 0) {
		t.Fatalf("leads %d/%d, runs %d/%d; want exactly one engine to lead and run throughout",
			leads[0].Load(), leads[1].Load(), runs[0].Load(), runs[1].Load())
	}
}

// TestOldestWaitingMessageAgeGauge buffers a B that waits since two hours and a C that waits
// since now: the gauge gives each type the age of its oldest WAITING message, with its sequence,
// and drops a type once none of its messages waits.
func TestOldestWaitingMessageAgeGauge(t *testing.T) {
	m := NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collectors()...)
	h := newIsolatedHarness(t, chainSet(), withMetrics(m))
	if leader, err := h.engine.LeadHousekeeping(context.Background()); err != nil || !leader {
		t.Fatalf("LeadHousekeeping = %v, %v; want the only engine to lead", leader, err)
	}
	h.process(h.rec("B", "b1", "x"))
	if _, err := h.pool.Exec(context.Background(), `UPDATE sequenced_message SET created_at = created_at - interval '2 hours' WHERE message_type = 'B'`); err != nil {
		t.Fatal(err)
	}
	h.process(h.rec("B", "b2", "y"))
	h.process(h.rec("C", "c1", "x"))

	age := func(typ string) (float64, bool) {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "seqinbox_oldest_waiting_message_age_seconds" {
				continue
			}
			for _, s := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["type"] == typ {
					if labels["sequence"] != "chain" {
						t.Errorf("oldest waiting %s has sequence %q, want chain", typ, labels["sequence"])
					}
					return s.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	// Bounds far apart, so that a slow run cannot fail them: B's oldest is two hours old, C's new.
	if got, ok := age("B"); !ok || got < 2*3600 || got >= 3*3600 {
		t.Errorf("oldest waiting B = %v (present %v), want two hours and a little", got, ok)
	}
	if got, ok := age("C"); !ok || got < 0 || got >= 3600 {
		t.Errorf("oldest waiting C = %v (present %v), want less than an hour", got, ok)
	}
	if _, ok := age("A"); ok {
		t.Error("the gauge reports A, which never waited")
	}

	h.process(h.rec("A", "a1", "x")) // releases B b1 and C c1 of instance x
	if got, ok := age("B"); !ok || got >= 3600 {
		t.Errorf("oldest waiting B after b1's release = %v (present %v), want b2's age, under an hour", got, ok)
	}
	if _, ok := age("C"); ok {
		t.Error("the gauge still reports C after its only WAITING message was released")
	}
}
