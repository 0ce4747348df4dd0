package consumer

import (
	"testing"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// lagSeries returns the partitions that have a seqinbox_consumer_lag series, by their label.
func lagSeries(t *testing.T, r *running) map[string]float64 {
	t.Helper()
	families, err := r.c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "seqinbox_consumer_lag" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[label(m, "partition")] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestLagIsExportedForEveryAssignedPartition: a partition that never had a record still has a
// lag series once assigned, so that dashboards and alerts see every partition.
func TestLagIsExportedForEveryAssignedPartition(t *testing.T) {
	database(t)
	seeds := cluster(t, 3)
	s := newSink(t, nil)
	r := startConsumer(t, testInbox(t, seeds, "g-lag", s.srv.URL, sinkOpts{}), "lag-1")
	r.waitReady(t)
	testenv.Produce(t, seeds, event(0, "OrderCreated", "lag-1", "lag-o1"))
	waitUntil(t, "the record was processed", func() bool { return r.events.count("") == 1 })
	waitUntil(t, "every assigned partition has a lag series", func() bool { return len(lagSeries(t, r)) == 3 })
	for partition, lag := range lagSeries(t, r) {
		if lag != 0 {
			t.Errorf("partition %s lag = %v after everything was processed, want 0", partition, lag)
		}
	}
}
