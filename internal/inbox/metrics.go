package inbox

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Metrics are the engine's Prometheus collectors (docs/design.md#metrics). The engine registers
// nothing; the consumer registers Collectors() with its registry.
type Metrics struct {
	consumed         *prometheus.CounterVec
	buffered         *prometheus.CounterVec
	waitingDelay     *prometheus.HistogramVec
	claims           *prometheus.CounterVec
	releases         *prometheus.CounterVec
	listenerDuration *prometheus.HistogramVec
	listenerFailures *prometheus.CounterVec
	actions          *prometheus.CounterVec
	hkDeleted        *prometheus.CounterVec
	hkMarked         prometheus.Counter
	hkDeadLettered   prometheus.Counter
	hkDuration       prometheus.Histogram
	state            *stateCollector
}

// Label values of the engine's metrics: CamelCase, as every label value of seqinbox that names an
// outcome, result, reason, cause or action.
const (
	claimWon, claimLost           = "Won", "Lost"
	releaseRun, releaseSkipped    = "Run", "Skipped"
	deletedClosed, deletedExpired = "Closed", "Expired"
)

// actionLabel is an action as the API spells it (CONSUME_ALL is ConsumeAll), for metric labels,
// logs and errors; the engine stores it in capitals.
func actionLabel(action string) string {
	var b strings.Builder
	for word := range strings.SplitSeq(action, "_") {
		if word != "" {
			b.WriteString(word[:1] + strings.ToLower(word[1:]))
		}
	}
	return b.String()
}

// NewMetrics builds unregistered collectors. The counters of a fixed set of label values start
// with every value at 0, so that rate() and increase() see their first increment.
func NewMetrics() *Metrics {
	seqType := []string{"sequence", "type"}
	m := &Metrics{
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_messages_consumed_total",
			Help: "Messages the listener accepted, by sequence and qualified type.",
		}, seqType),
		buffered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_messages_buffered_total",
			Help: "Messages stored WAITING because their release condition did not hold yet.",
		}, seqType),
		waitingDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "seqinbox_message_waiting_seconds",
			Help:    "How long a buffered message waited until its release.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 12),
		}, seqType),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_claims_total",
			Help: "Claim inserts by result: Won (this delivery processes the message) or Lost (a duplicate).",
		}, []string{"result"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_release_transactions_total",
			Help: "Release transactions after a record: Run, or Skipped because nothing was releasable.",
		}, []string{"result"}),
		listenerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "seqinbox_listener_duration_seconds",
			Help:    "Duration of listener calls (including the sink's retries).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, seqType),
		listenerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_listener_failures_total",
			Help: "Listener calls that failed.",
		}, seqType),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_actions_total",
			Help: "Operator actions executed, by action (Consume, Expire, ConsumeAll, Close).",
		}, []string{"action"}),
		hkDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_housekeeping_deleted_instances_total",
			Help: "Sequence instances deleted by housekeeping, by reason (Closed, Expired).",
		}, []string{"reason"}),
		hkMarked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seqinbox_housekeeping_expired_instances_total",
			Help: "Sequence instances housekeeping found past their retention and marked for removal.",
		}),
		hkDeadLettered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seqinbox_housekeeping_dead_lettered_total",
			Help: "WAITING messages dead-lettered because housekeeping deleted their instance.",
		}),
		hkDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "seqinbox_housekeeping_duration_seconds",
			Help:    "Duration of housekeeping runs that held the housekeeping lock.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}),
		state: newStateCollector(),
	}
	for _, v := range []struct {
		vec    *prometheus.CounterVec
		values []string
	}{
		{m.claims, []string{claimWon, claimLost}},
		{m.releases, []string{releaseRun, releaseSkipped}},
		{m.hkDeleted, []string{deletedClosed, deletedExpired}},
		{m.actions, []string{actionLabel(string(ActionConsume)), actionLabel(string(ActionExpire)),
			actionLabel(string(ActionConsumeAll)), actionLabel(string(ActionClose))}},
	} {
		for _, value := range v.values {
			v.vec.WithLabelValues(value)
		}
	}
	return m
}

// Collectors returns every collector, for the consumer to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.consumed, m.buffered, m.waitingDelay, m.claims, m.releases, m.listenerDuration,
		m.listenerFailures, m.actions, m.hkDeleted, m.hkMarked, m.hkDeadLettered, m.hkDuration, m.state,
	}
}

// stateCollectSQL reads the database-wide gauges at scrape time: WAITING messages by type
// (served by the (state, message_type) index; one per logical message) with the age of the
// oldest (on the database's clock, as the waiting-time histogram), open instances expiring
// within the window, and instances past their retention that wait for removal. Only the
// housekeeping leader serves them, so that a sum over pods counts each once: the rows come only
// while $3 holds an unexpired housekeeping lease, which also stops a consumer whose lease ran out
// or was taken over behind its back.
const stateCollectSQL = `WITH lead AS (
  SELECT 1 FROM housekeeping_lease WHERE holder = $3 AND expires_at > now()
)
SELECT kind, message_type, n, oldest FROM (
SELECT 'waiting' AS kind, message_type, count(*) AS n,
    extract(epoch FROM clock_timestamp() - min(created_at))::float8 AS oldest
  FROM sequenced_message m
  WHERE state = 'WAITING' AND ` + waitingStandsForItsMessage + ` GROUP BY message_type
UNION ALL
SELECT 'expiring_soon', '', count(*), 0 FROM sequence_instance
  WHERE state = 'OPEN' AND remove_after IS NULL AND retain_until >= $1 AND retain_until < $2
UNION ALL
SELECT 'expired', '', count(*), 0 FROM sequence_instance WHERE state = 'OPEN' AND remove_after IS NOT NULL
) s WHERE EXISTS (SELECT 1 FROM lead)`

// stateScrapeTimeout bounds the database query of one scrape.
const stateScrapeTimeout = 5 * time.Second

// stateCollector reports database state as gauges at scrape time. It reports nothing until an
// engine is bound to it, and nothing while that engine does not lead housekeeping.
type stateCollector struct {
	waiting, oldestWaiting, expiringSoon, expired *prometheus.Desc

	mu     sync.Mutex
	pool   *pgxpool.Pool
	clock  clock.PassiveClock
	window time.Duration
	// holder names the engine in the housekeeping lease; leading is its Engine.leading.
	holder  string
	leading func() bool
	// sequenceOf names the sequence of a qualified type ("" for a type no longer declared).
	sequenceOf func(qualified string) string
}

func newStateCollector() *stateCollector {
	return &stateCollector{
		waiting: prometheus.NewDesc("seqinbox_messages_waiting",
			"Messages WAITING for their predecessors, by qualified type (database-wide).", []string{"type"}, nil),
		oldestWaiting: prometheus.NewDesc("seqinbox_oldest_waiting_message_age_seconds",
			"Age of the oldest message WAITING for its predecessors, by sequence and qualified type (database-wide).",
			[]string{"sequence", "type"}, nil),
		expiringSoon: prometheus.NewDesc("seqinbox_instances_expiring_soon",
			"Open sequence instances whose retention ends within the configured window (database-wide).", nil, nil),
		expired: prometheus.NewDesc("seqinbox_instances_expired",
			"Sequence instances past their retention, waiting for removal (database-wide).", nil, nil),
	}
}

func (c *stateCollector) bind(pool *pgxpool.Pool, clk clock.PassiveClock, window time.Duration, holder string, leading func() bool, sequenceOf func(string) string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pool, c.clock, c.window, c.holder, c.leading, c.sequenceOf = pool, clk, window, holder, leading, sequenceOf
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.waiting
	ch <- c.oldestWaiting
	ch <- c.expiringSoon
	ch <- c.expired
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	pool, clk, window, holder, leading, sequenceOf := c.pool, c.clock, c.window, c.holder, c.leading, c.sequenceOf
	c.mu.Unlock()
	if pool == nil || !leading() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stateScrapeTimeout)
	defer cancel()
	now := clk.Now()
	rows, err := pool.Query(ctx, stateCollectSQL, now, now.Add(window), holder)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.waiting, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var (
			kind, typ string
			n         int64
			oldest    float64
		)
		if err := rows.Scan(&kind, &typ, &n, &oldest); err != nil {
			ch <- prometheus.NewInvalidMetric(c.waiting, err)
			return
		}
		switch kind {
		case "waiting":
			ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(n), typ)
			ch <- prometheus.MustNewConstMetric(c.oldestWaiting, prometheus.GaugeValue, max(oldest, 0), sequenceOf(typ), typ)
		case "expiring_soon":
			ch <- prometheus.MustNewConstMetric(c.expiringSoon, prometheus.GaugeValue, float64(n))
		case "expired":
			ch <- prometheus.MustNewConstMetric(c.expired, prometheus.GaugeValue, float64(n))
		}
	}
	if err := rows.Err(); err != nil {
		ch <- prometheus.NewInvalidMetric(c.waiting, err)
	}
}
