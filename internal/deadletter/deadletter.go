// Package deadletter moves records the consumer cannot process to the dead-letter topic, with
// headers that say why (docs/design.md#failures-and-dead-letters), and moves them back to their
// original topic on request (the `seqinbox deadletters retry` command), where the engine processes
// them as new deliveries.
package deadletter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
)

// Headers added to a dead letter; the original record's headers come first, unchanged.
const (
	// HeaderPrefix starts every header this package adds; Retry strips them again.
	HeaderPrefix            = "seqinbox-dlq-"
	HeaderReason            = HeaderPrefix + "reason"
	HeaderMessage           = HeaderPrefix + "message"
	HeaderOriginalTopic     = HeaderPrefix + "original-topic"
	HeaderOriginalPartition = HeaderPrefix + "original-partition"
	HeaderOriginalOffset    = HeaderPrefix + "original-offset"
	HeaderSequence          = HeaderPrefix + "sequence"
	HeaderContextID         = HeaderPrefix + "context-id"
	HeaderFailedAt          = HeaderPrefix + "failed-at"
	// HeaderOmitted lists what of the original record a letter too large for the dead-letter
	// topic left out: "value", or "value,key,headers". The original stays at original-topic,
	// -partition and -offset for as long as that topic retains it.
	HeaderOmitted = HeaderPrefix + "omitted"
	// HeaderOriginalValueBytes is the size of the omitted value.
	HeaderOriginalValueBytes = HeaderPrefix + "original-value-bytes"
)

// Reasons besides the decode error classes (decode.Class*), which are reasons as they are.
const (
	// ReasonListenerFailed: the sink failed the record after its retries (the message is FAILED).
	ReasonListenerFailed = "ListenerFailed"
	// ReasonReleaseFailed: a buffered message failed when its release came.
	ReasonReleaseFailed = "ReleaseFailed"
	// ReasonSequenceDeleted: housekeeping deleted the instance while the message was WAITING.
	ReasonSequenceDeleted = "SequenceDeleted"
	// ReasonOperatorAction: an operator action gave the message up (its delivery failed, or
	// CLOSE closed the instance without delivering it).
	ReasonOperatorAction = "OperatorAction"
	// ReasonListenerDeadlineExceeded: the record's processing deadline (from
	// spec.kafka.maxPollIntervalMs) ended while the sink was still being called.
	ReasonListenerDeadlineExceeded = "ListenerDeadlineExceeded"
	// ReasonRecordRejected: PostgreSQL refused a value of the record (a data exception or a
	// value beyond what the schema can index or store).
	ReasonRecordRejected = "RecordRejected"
)

// Reasons are every reason a dead letter can carry in HeaderReason: these and the decode error
// classes, sorted.
func Reasons() []string {
	reasons := append([]string{ReasonListenerFailed, ReasonReleaseFailed, ReasonSequenceDeleted, ReasonOperatorAction,
		ReasonListenerDeadlineExceeded, ReasonRecordRejected}, decode.Classes()...)
	slices.Sort(reasons)
	return reasons
}

// Letter is one record on its way to the dead-letter topic.
type Letter struct {
	// Key, Value and Headers are the record as it was read (or buffered), byte for byte.
	Key, Value []byte
	Headers    []inbox.Header
	// Origin is where the record was read from.
	Origin inbox.Origin
	// Reason is a CamelCase class (a decode.Class* or a Reason* constant), Message a sentence.
	Reason, Message string
	// Sequence and ContextID are set when known.
	Sequence, ContextID string
	// Omitted is what a stored letter left out (HeaderOmitted); empty when it is whole.
	Omitted string
}

// FromRecord builds the letter of a decoded (or buffered) record.
func FromRecord(rec inbox.Record, reason string, err error) Letter {
	return Letter{Key: rec.Key, Value: rec.Value, Headers: rec.Headers, Origin: rec.Origin, Reason: reason, Message: errText(err)}
}

// FromKafka builds the letter of a record exactly as it was fetched.
func FromKafka(r *kgo.Record, reason string, err error) Letter {
	hs := make([]inbox.Header, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = inbox.Header{Key: h.Key, Value: h.Value}
	}
	return Letter{
		Key: r.Key, Value: r.Value, Headers: hs, Reason: reason, Message: errText(err),
		Origin: inbox.Origin{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset},
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Publisher produces letters to the dead-letter topic. It is the engine's inbox.DeadLetterer too.
type Publisher struct {
	client  *kgo.Client
	topic   string
	clock   clock.PassiveClock
	metrics *Metrics
	// maxBytes is the topic's max.message.bytes once read (0 before), readAt when (Unix
	// nanoseconds); see limit.
	maxBytes, readAt atomic.Int64
}

// NewPublisher publishes to topic through client (which may be the consumer's own client).
// clock nil is the wall clock; m nil counts nothing anybody reads.
func NewPublisher(client *kgo.Client, topic string, clk clock.PassiveClock, m *Metrics) *Publisher {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if m == nil {
		m = NewMetrics()
	}
	return &Publisher{client: client, topic: topic, clock: clk, metrics: m}
}

// Topic is where letters go.
func (p *Publisher) Topic() string { return p.topic }

// Publish produces one letter and waits until the broker acknowledged it. A letter larger than
// the topic takes is stored without its value (or without value, key and headers), with headers
// saying so (HeaderOmitted). An error means the letter is not stored: the caller must not commit
// the original record's offset.
func (p *Publisher) Publish(ctx context.Context, l Letter) error {
	rec := fit(p.Record(l), p.limit(ctx))
	err := p.client.ProduceSync(ctx, rec).FirstErr()
	if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
		// The limit changed, or it could not be read: leave out all that may be left out.
		p.maxBytes.Store(0)
		rec = omit(p.Record(l), true)
		err = p.client.ProduceSync(ctx, rec).FirstErr()
	}
	if err != nil {
		return fmt.Errorf("dead-letter %s/%d@%d (%s) to %s: %w", l.Origin.Topic, l.Origin.Partition, l.Origin.Offset, l.Reason, p.topic, err)
	}
	p.metrics.letters.WithLabelValues(l.Reason).Inc()
	if hasHeader(rec, HeaderOmitted) {
		p.metrics.omitted.Inc()
	}
	return nil
}

// Record renders a letter as the dead-letter record: the original key, value and headers (minus
// the dead-letter headers of an earlier failure) plus this failure's headers.
func (p *Publisher) Record(l Letter) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(l.Headers)+8)
	for _, h := range l.Headers {
		if !strings.HasPrefix(h.Key, HeaderPrefix) {
			headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
	}
	add := func(k, v string) { headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderReason, l.Reason)
	add(HeaderMessage, l.Message)
	add(HeaderOriginalTopic, l.Origin.Topic)
	add(HeaderOriginalPartition, strconv.Itoa(int(l.Origin.Partition)))
	add(HeaderOriginalOffset, strconv.FormatInt(l.Origin.Offset, 10))
	if l.Sequence != "" {
		add(HeaderSequence, l.Sequence)
	}
	if l.ContextID != "" {
		add(HeaderContextID, l.ContextID)
	}
	now := p.clock.Now()
	add(HeaderFailedAt, now.UTC().Format(time.RFC3339Nano))
	// The letter's timestamp is its failure time, so that ListOffsets by time finds it (List's Since).
	return &kgo.Record{Topic: p.topic, Key: l.Key, Value: l.Value, Headers: headers, Timestamp: now}
}

// DeadLetter implements inbox.DeadLetterer for the messages the engine gives up on outside a
// record's processing (housekeeping, operator actions).
func (p *Publisher) DeadLetter(ctx context.Context, m inbox.Message, reason string) error {
	return p.Publish(ctx, engineLetter(m, reason))
}

// engineLetter turns the engine's reason sentence into a reason class; the sentence becomes the
// message.
func engineLetter(m inbox.Message, reason string) Letter {
	class := ReasonOperatorAction
	if reason == inbox.DeadLetterReasonSequenceDeleted {
		class = ReasonSequenceDeleted
	}
	return Letter{
		Key: m.Record.Key, Value: m.Record.Value, Headers: m.Record.Headers, Origin: m.Record.Origin,
		Reason: class, Message: reason, Sequence: m.Sequence, ContextID: m.ContextID,
	}
}

// Metrics count dead letters.
type Metrics struct {
	letters *prometheus.CounterVec
	omitted prometheus.Counter
}

// NewMetrics builds unregistered collectors; the consumer registers Collectors().
func NewMetrics() *Metrics {
	return &Metrics{
		letters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "seqinbox_dead_letters_total",
			Help: "Records produced to the dead-letter topic, by reason.",
		}, []string{"reason"}),
		omitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "seqinbox_dead_letters_payload_omitted_total",
			Help: "Dead letters too large for the dead-letter topic, stored without their payload (header seqinbox-dlq-omitted).",
		}),
	}
}

// Collectors returns every collector, for the consumer to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.letters, m.omitted}
}
