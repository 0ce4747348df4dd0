package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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

func TestMetricsReportDatabaseStateAndEngineEvents(t *testing.T) {
	m := NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collectors()...)
	h := newIsolatedHarness(t, chainSet(), func(c *harnessSettings) { c.ExpiringSoonWindow = 2 * time.Hour })
	e, err := New(h.pool, chainSet(), h.listener, Config{
		ListenerDeadline: time.Minute, IdleLockTimeout: time.Minute, Clock: h.clock, ExpiringSoonWindow: 2 * time.Hour,
		Maintenance: h.engine.maint,
	}, m)
	if err != nil {
		t.Fatal(err)
	}
	h.engine = e

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
		{"seqinbox_claims_total", "won", 4},
		{"seqinbox_claims_total", "lost", 1},
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
	h.clock.Advance(90 * time.Minute)
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
