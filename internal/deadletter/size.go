package deadletter

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Sizes of dead letters. Kafka refuses a record batch larger than the topic's
// max.message.bytes; franz-go refuses one larger than its ProducerBatchMaxBytes (1,000,012 bytes
// by default) before sending it.
const (
	// defaultMaxBytes is assumed when the topic's max.message.bytes cannot be read: Kafka's
	// default.
	defaultMaxBytes = 1048588
	// producerMaxBytes is the dead-letter producer's own cap, above any limit a topic usually
	// has, so that the broker's limit is the one that counts.
	producerMaxBytes = 64 << 20
	// batchOverhead covers the record batch and record framing around key, value and headers.
	batchOverhead = 512
	// limitTTL is how long a read max.message.bytes is trusted before it is read again.
	limitTTL = 5 * time.Minute
)

// ProducerLimit is the option of the client a Publisher produces with: the client does not
// refuse a letter the topic would take.
func ProducerLimit() kgo.Opt { return kgo.ProducerBatchMaxBytes(producerMaxBytes) }

// limit is the largest letter the topic takes, read from its max.message.bytes and cached.
func (p *Publisher) limit(ctx context.Context) int {
	if n := p.maxBytes.Load(); n > 0 && p.clock.Now().Sub(p.limitReadAt()) < limitTTL {
		return int(n)
	}
	n := defaultMaxBytes
	configs, err := kadm.NewClient(p.client).DescribeTopicConfigs(ctx, p.topic)
	if err == nil {
		if rc, err := configs.On(p.topic, nil); err == nil && rc.Err == nil {
			for _, c := range rc.Configs {
				if c.Key == "max.message.bytes" && c.Value != nil {
					if v, err := strconv.Atoi(*c.Value); err == nil && v > 0 {
						n = v
					}
				}
			}
		}
	}
	p.readAt.Store(p.clock.Now().UnixNano())
	p.maxBytes.Store(int64(min(n, producerMaxBytes)))
	return int(p.maxBytes.Load())
}

func (p *Publisher) limitReadAt() time.Time { return time.Unix(0, p.readAt.Load()) }

// size estimates the bytes a record takes in its batch.
func size(r *kgo.Record) int {
	n := batchOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// fit returns the record as it is when it fits in limit, else without its value, else without
// value, key and original headers.
func fit(r *kgo.Record, limit int) *kgo.Record {
	if size(r) <= limit {
		return r
	}
	if r2 := omit(r, false); size(r2) <= limit {
		return r2
	}
	return omit(r, true)
}

// omit leaves out the value (and with all, the key and every header but the dead-letter ones)
// and says so in headers.
func omit(r *kgo.Record, all bool) *kgo.Record {
	out := &kgo.Record{Topic: r.Topic, Key: r.Key}
	what := "value"
	if all {
		out.Key, what = nil, "value,key,headers"
	}
	for _, h := range r.Headers {
		if all && !isLetterHeader(h.Key) {
			continue
		}
		out.Headers = append(out.Headers, h)
	}
	out.Headers = append(out.Headers,
		kgo.RecordHeader{Key: HeaderOmitted, Value: []byte(what)},
		kgo.RecordHeader{Key: HeaderOriginalValueBytes, Value: []byte(strconv.Itoa(len(r.Value)))})
	return out
}

func isLetterHeader(key string) bool {
	return len(key) >= len(HeaderPrefix) && key[:len(HeaderPrefix)] == HeaderPrefix
}

func hasHeader(r *kgo.Record, key string) bool {
	for _, h := range r.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
