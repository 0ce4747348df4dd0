package consumer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seqinbox/seqinbox/internal/inbox"
)

// metrics are the runtime's own collectors; the engine, the sink and the dead-letter publisher
// bring theirs.
type metrics struct {
	records  *prometheus.CounterVec
	retries  *prometheus.CounterVec
	lag      *prometheus.GaugeVec
	inFlight prometheus.Gauge
	ready    prometheus.Gauge
}

// Causes of seqinbox_record_retries_total: CamelCase, as every label value of seqinbox that names
// an outcome, result, reason or cause.
const (
	causeInfrastructure = "Infrastructure"
	causeDeadLetter     = "DeadLetter"
)

// newMetrics builds the runtime's collectors; the counters of a fixed set of label values start
// with every value at 0, so that rate() and increase() see their first increment.
func newMetrics() *metrics {
	m := &metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_records_total",
			Help: "Kafka records whose processing finished, by outcome (Delivered, Buffered, Duplicate, Bypassed, Failed, DeadLettered).",
		}, []string{"outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_record_retries_total",
			Help: "Records processed again after an infrastructure error or a failed dead-letter produce, by cause (Infrastructure, DeadLetter).",
		}, []string{"cause"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "seqinbox_consumer_lag",
			Help: "Records of an assigned partition not yet processed: high watermark minus the next offset to process.",
		}, []string{"topic", "partition"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seqinbox_records_in_flight",
			Help: "Records being processed by the claim engine right now (at most poolSize/2).",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "seqinbox_consumer_ready",
			Help: "1 while the schema check and the version fence pass and the consumer fetches, else 0.",
		}),
	}
	for _, o := range []inbox.Outcome{inbox.Delivered, inbox.Buffered, inbox.Duplicate, inbox.Bypassed, inbox.Failed} {
		m.records.WithLabelValues(o.String())
	}
	m.records.WithLabelValues(OutcomeDeadLettered)
	m.retries.WithLabelValues(causeInfrastructure)
	m.retries.WithLabelValues(causeDeadLetter)
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.records, m.retries, m.lag, m.inFlight, m.ready}
}

func (m *metrics) setLag(topic string, partition int32, lag int64) {
	m.lag.WithLabelValues(topic, strconv.Itoa(int(partition))).Set(float64(max(lag, 0)))
}

func (m *metrics) dropLag(topic string, partition int32) {
	m.lag.DeleteLabelValues(topic, strconv.Itoa(int(partition)))
}
