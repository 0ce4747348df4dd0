package consumer

import (
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/internal/fence"
)

// maxBlockedError bounds the error a blocked record is reported with (registry row, condition).
const maxBlockedError = 512

// blockage is what holds the partitions of a consumer back: the records being retried after an
// infrastructure error, each from its first failed attempt until it ends (processed,
// dead-lettered or abandoned). It serves the gauges seqinbox_partition_blocked_offset and
// seqinbox_partition_blocked_seconds of the oldest such record of each partition, computed at
// scrape time, and tells the version fence the consumer's longest-blocked record, which the
// heartbeat writes to the consumer registry for the operator's Degraded condition.
type blockage struct {
	clock                   clock.PassiveClock
	offsetDesc, secondsDesc *prometheus.Desc

	mu      sync.Mutex
	records map[topicPartition]map[int64]*fence.Blocked
}

func newBlockage(clk clock.PassiveClock) *blockage {
	labels := []string{"topic", "partition"}
	return &blockage{
		clock: clk,
		offsetDesc: prometheus.NewDesc("seqinbox_partition_blocked_offset",
			"Offset of the record of the partition retried longest after infrastructure errors; no series while none is retried.", labels, nil),
		secondsDesc: prometheus.NewDesc("seqinbox_partition_blocked_seconds",
			"Seconds since that record's first failed attempt; no series while none is retried.", labels, nil),
		records: map[topicPartition]map[int64]*fence.Blocked{},
	}
}

// retrying records that r failed with err and is retried; its age counts from the first failure.
func (b *blockage) retrying(r *kgo.Record, err error) {
	tp := topicPartition{r.Topic, r.Partition}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.records[tp] == nil {
		b.records[tp] = map[int64]*fence.Blocked{}
	}
	rec := b.records[tp][r.Offset]
	if rec == nil {
		rec = &fence.Blocked{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Since: b.clock.Now()}
		b.records[tp][r.Offset] = rec
	}
	rec.Error = shortError(err.Error())
}

// ended records that r is no longer retried.
func (b *blockage) ended(r *kgo.Record) {
	tp := topicPartition{r.Topic, r.Partition}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.records[tp], r.Offset)
	if len(b.records[tp]) == 0 {
		delete(b.records, tp)
	}
}

// oldest returns the record of each blocked partition retried longest (the lowest offset of
// equally old ones). The caller holds b.mu.
func (b *blockage) oldest() []fence.Blocked {
	out := make([]fence.Blocked, 0, len(b.records))
	for _, recs := range b.records {
		var first *fence.Blocked
		for _, rec := range recs {
			if first == nil || rec.Since.Before(first.Since) || rec.Since.Equal(first.Since) && rec.Offset < first.Offset {
				first = rec
			}
		}
		out = append(out, *first)
	}
	return out
}

// longest is the consumer's record retried longest, nil when none is retried.
func (b *blockage) longest() *fence.Blocked {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first *fence.Blocked
	for _, rec := range b.oldest() {
		if first == nil || rec.Since.Before(first.Since) {
			first = &rec
		}
	}
	return first
}

// Describe implements prometheus.Collector.
func (b *blockage) Describe(ch chan<- *prometheus.Desc) {
	ch <- b.offsetDesc
	ch <- b.secondsDesc
}

// Collect implements prometheus.Collector.
func (b *blockage) Collect(ch chan<- prometheus.Metric) {
	b.mu.Lock()
	recs := b.oldest()
	b.mu.Unlock()
	now := b.clock.Now()
	for _, rec := range recs {
		partition := strconv.Itoa(int(rec.Partition))
		ch <- prometheus.MustNewConstMetric(b.offsetDesc, prometheus.GaugeValue, float64(rec.Offset), rec.Topic, partition)
		ch <- prometheus.MustNewConstMetric(b.secondsDesc, prometheus.GaugeValue, now.Sub(rec.Since).Seconds(), rec.Topic, partition)
	}
}

// shortError cuts an error message to maxBlockedError bytes on a rune boundary.
func shortError(s string) string {
	if len(s) <= maxBlockedError {
		return s
	}
	n := maxBlockedError - len("…")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
