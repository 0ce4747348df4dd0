package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/inbox"
)

// RetryGroup is the consumer group whose committed offsets on the dead-letter topic remember
// which letters a retry already re-published: one group per reason filter, so that retrying
// one reason neither repeats nor hides the letters of another.
func RetryGroup(consumerGroup, reason string) string {
	if reason == "" {
		return consumerGroup + ".dlq-retry"
	}
	return consumerGroup + ".dlq-retry." + reason
}

// RetryOptions say which letters to re-publish.
type RetryOptions struct {
	// Topic is the dead-letter topic.
	Topic string
	// Group keeps the retry's position (RetryGroup).
	Group string
	// Reason re-publishes only letters of this reason; the others are passed over (and not
	// looked at again by this group). Empty: every letter.
	Reason string
	// Limit stops after this many re-published letters; zero means all.
	Limit int
}

// RetryReport says what one retry did.
type RetryReport struct {
	// Republished letters, by reason.
	Republished map[string]int
	// Skipped letters whose reason did not match.
	Skipped int
	// Unroutable letters name no original topic (not written by this package); passed over.
	Unroutable int
	// Incomplete letters were stored without their payload (too large for the dead-letter
	// topic); passed over, since re-publishing them would lose it. Their original is at the
	// topic, partition and offset they name.
	Incomplete int
}

// Total is the number of re-published letters.
func (r RetryReport) Total() int {
	n := 0
	for _, c := range r.Republished {
		n += c
	}
	return n
}

// Retry re-publishes the dead letters that arrived before it started, each to its original topic
// and partition with its original key, value and headers (without the dead-letter headers), and
// commits its position in opts.Group after every produced batch, so that a letter is re-published
// once even when the retry is run again or interrupted. conn holds the connection options (seed
// brokers, TLS, SASL). Run one retry per group at a time.
func Retry(ctx context.Context, conn []kgo.Opt, opts RetryOptions) (RetryReport, error) {
	rep := RetryReport{Republished: map[string]int{}}
	if opts.Topic == "" || opts.Group == "" {
		return rep, errors.New("retry dead letters: topic and group are required")
	}
	cl, err := kgo.NewClient(append(conn,
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.FetchMaxWait(time.Second),
	)...)
	if err != nil {
		return rep, fmt.Errorf("retry dead letters: kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	from, ends, err := retryRange(ctx, adm, opts)
	if err != nil {
		return rep, err
	}
	if len(from) == 0 {
		return rep, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{opts.Topic: from})
	for len(ends) > 0 && (opts.Limit == 0 || rep.Total() < opts.Limit) {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("retry dead letters: %w", err)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return rep, fmt.Errorf("retry dead letters: fetch %s[%d]: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		var (
			batch    []*kgo.Record
			reasons  []string
			advanced = kadm.Offsets{}
		)
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			for _, r := range fp.Records {
				end, open := ends[r.Partition]
				if !open || r.Offset >= end || opts.Limit > 0 && rep.Total()+len(batch) >= opts.Limit {
					return
				}
				l := Read(r)
				switch {
				case l.Origin.Topic == "":
					rep.Unroutable++
				case l.Omitted != "":
					rep.Incomplete++
				case opts.Reason == "" || l.Reason == opts.Reason:
					batch = append(batch, Republish(l))
					reasons = append(reasons, l.Reason)
				default:
					rep.Skipped++
				}
				advanced.Add(kadm.NewOffsetFromRecord(r))
				if r.Offset+1 >= end {
					delete(ends, r.Partition)
				}
			}
		})
		if err := cl.ProduceSync(ctx, batch...).FirstErr(); err != nil {
			return rep, fmt.Errorf("retry dead letters: re-publish: %w", err)
		}
		for _, reason := range reasons {
			rep.Republished[reason]++
		}
		if len(advanced) > 0 {
			if err := adm.CommitAllOffsets(ctx, opts.Group, advanced); err != nil {
				return rep, fmt.Errorf("retry dead letters: commit position of group %s: %w", opts.Group, err)
			}
		}
	}
	return rep, nil
}

// retryRange returns, per partition of the dead-letter topic with letters left, the offset to
// start at (the group's position or the log start) and the end offset when the retry started.
func retryRange(ctx context.Context, adm *kadm.Client, opts RetryOptions) (map[int32]kgo.Offset, map[int32]int64, error) {
	starts, err := adm.ListStartOffsets(ctx, opts.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("retry dead letters: start offsets of %s: %w", opts.Topic, err)
	}
	endOffsets, err := adm.ListEndOffsets(ctx, opts.Topic)
	if err == nil {
		err = endOffsets.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("retry dead letters: end offsets of %s: %w", opts.Topic, err)
	}
	committed, err := adm.FetchOffsets(ctx, opts.Group)
	if err == nil {
		err = committed.Error()
	}
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group that never committed (some brokers say so instead of answering empty).
		committed, err = nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("retry dead letters: position of group %s: %w", opts.Group, err)
	}
	from := map[int32]kgo.Offset{}
	ends := map[int32]int64{}
	endOffsets.Each(func(e kadm.ListedOffset) {
		start := int64(0)
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok {
			start = s.Offset
		}
		if c, ok := committed.Lookup(e.Topic, e.Partition); ok && c.At > start {
			start = c.At
		}
		if start < e.Offset {
			from[e.Partition] = kgo.NewOffset().At(start)
			ends[e.Partition] = e.Offset
		}
	})
	return from, ends, nil
}

// Read parses a dead-letter record back into its letter: the original record and why it failed.
// Failed-at is not part of the letter; read it from the HeaderFailedAt header when needed.
func Read(r *kgo.Record) Letter {
	l := Letter{Key: r.Key, Value: r.Value}
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case HeaderReason:
			l.Reason = v
		case HeaderMessage:
			l.Message = v
		case HeaderOriginalTopic:
			l.Origin.Topic = v
		case HeaderOriginalPartition:
			p, _ := strconv.ParseInt(v, 10, 32)
			l.Origin.Partition = int32(p)
		case HeaderOriginalOffset:
			l.Origin.Offset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderSequence:
			l.Sequence = v
		case HeaderContextID:
			l.ContextID = v
		case HeaderOmitted:
			l.Omitted = v
		default:
			if !strings.HasPrefix(h.Key, HeaderPrefix) {
				l.Headers = append(l.Headers, inbox.Header{Key: h.Key, Value: h.Value})
			}
		}
	}
	return l
}

// Republish is the record that puts a letter back on its original topic and partition.
func Republish(l Letter) *kgo.Record {
	headers := make([]kgo.RecordHeader, len(l.Headers))
	for i, h := range l.Headers {
		headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return &kgo.Record{Topic: l.Origin.Topic, Partition: l.Origin.Partition, Key: l.Key, Value: l.Value, Headers: headers}
}
