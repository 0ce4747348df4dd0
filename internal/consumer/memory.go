package consumer

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/inbox"
)

// The records a consumer holds between fetching and finishing them are bounded in bytes
// (docs/design.md#bounded-memory): a partition whose worker holds records stops fetching while the
// consumer holds more than its bound, and fetches again once the consumer is down to half the
// bound, or once the partition holds nothing (so that a partition stuck behind a slow record never
// keeps the others from fetching). A record larger than the bound is still fetched and processed:
// fetching pauses only after a fetch has been handed over, never before the first record of a
// partition.
const (
	// defaultMaxBufferedBytes bounds the records of a consumer whose container has no memory limit.
	defaultMaxBufferedBytes = 128 << 20
	// memoryLimitShare: without spec.kafka.maxBufferedBytes, a consumer holds records of at most
	// 1/memoryLimitShare of its container's memory limit. The Go heap grows to about twice its
	// live data between collections, and the process needs memory of its own (connection pools,
	// Kafka clients, the fetch being read).
	memoryLimitShare = 4
	// minMaxBufferedBytes is the smallest bound, as the CRD checks spec.kafka.maxBufferedBytes.
	minMaxBufferedBytes = 1 << 20
	// fetchShare: one fetch request asks the broker for at most 1/fetchShare of the bound, so that
	// the records of a fetch that arrives after the bound was reached overshoot it by little.
	fetchShare = 4
	// maxFetchBytes and maxPartitionFetchBytes are franz-go's defaults for one fetch and one
	// partition of it (the Java client's fetch.max.bytes and max.partition.fetch.bytes); a bound
	// never raises them. A broker returns a batch larger than either whole, so a large record is
	// still read. The client's read limit for a response (BrokerMaxReadBytes) keeps its 100 MiB
	// default, the broker's own socket.request.max.bytes: lowering it would make a large record
	// unreadable and stall its partition.
	maxFetchBytes          = 50 << 20
	maxPartitionFetchBytes = 1 << 20
	// recordOverhead is what a record costs besides its key, value and headers: the kgo.Record,
	// the decoded inbox.Record and their slices.
	recordOverhead = 512
)

// maxBufferedBytes is the bound on the bytes of the records a consumer holds:
// spec.kafka.maxBufferedBytes, else a share of the container's memory limit, else the default.
func (c *Config) maxBufferedBytes() int64 {
	if q := c.Inbox.Spec.Kafka.MaxBufferedBytes; q != nil {
		return q.Value()
	}
	if c.MemoryLimit > 0 {
		return max(minMaxBufferedBytes, c.MemoryLimit/memoryLimitShare)
	}
	return defaultMaxBufferedBytes
}

// fetchOptions bound what one fetch brings for a bound on the bytes the consumer holds.
func fetchOptions(bound int64) []kgo.Opt {
	total := int32(min(maxFetchBytes, bound/fetchShare))
	return []kgo.Opt{kgo.FetchMaxBytes(total), kgo.FetchMaxPartitionBytes(min(total, maxPartitionFetchBytes))}
}

// backlog counts the bytes of the records a consumer holds, from their hand-over to a partition's
// worker until they finish or are dropped with their worker, and says when fetching must pause
// and may resume.
type backlog struct {
	// limit pauses fetching above it, low lets every paused partition fetch again at or below it.
	limit, low int64
	bytes      atomic.Int64
}

func newBacklog(limit int64) *backlog {
	return &backlog{limit: limit, low: limit / 2}
}

func (b *backlog) add(n int64) { b.bytes.Add(n) }

// release subtracts n; true when this brought the total down to the low-water mark (the paused
// partitions may fetch again).
func (b *backlog) release(n int64) bool {
	now := b.bytes.Add(-n)
	return now <= b.low && now+n > b.low
}

// over reports whether the consumer holds more than its bound.
func (b *backlog) over() bool { return b.bytes.Load() > b.limit }

// drained reports whether the consumer is down to its low-water mark.
func (b *backlog) drained() bool { return b.bytes.Load() <= b.low }

func (b *backlog) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "seqinbox_consumer_buffered_bytes",
			Help: "Bytes of the records the consumer holds between fetching and finishing them (queued, waiting for an earlier record of their key or instance, in process).",
		}, func() float64 { return float64(b.bytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "seqinbox_consumer_buffered_bytes_limit",
			Help: "The bound on seqinbox_consumer_buffered_bytes above which partitions stop fetching (spec.kafka.maxBufferedBytes, or a quarter of the container's memory limit).",
		}, func() float64 { return float64(b.limit) }),
	}
}

// recordSize is what a fetched record counts against the bound.
func recordSize(r *kgo.Record) int64 {
	n := recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// decodedSize is what decoding added to a record: the data of a structured-mode event is a copy,
// a binary-mode value is the record's own.
func decodedSize(r *kgo.Record, rec inbox.Record) int64 {
	if len(rec.Value) == 0 || len(r.Value) > 0 && &rec.Value[0] == &r.Value[0] {
		return 0
	}
	return int64(len(rec.Value))
}
