package deadletter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// ListOptions say which dead letters to list.
type ListOptions struct {
	// Topic is the dead-letter topic.
	Topic string
	// Reason lists only letters of this reason; empty: every letter.
	Reason string
	// Since lists only letters that failed at or after it; zero: from the start of the topic.
	Since time.Time
	// Decoder reads the type and idempotence ID of a letter as the consumer read them; nil
	// leaves them out.
	Decoder *decode.Decoder
}

// Entry is one dead letter as `seqinbox deadletters list` shows it: when and why it failed and
// where it came from, never its payload.
type Entry struct {
	// FailedAt is when the consumer gave the record up (header seqinbox-dlq-failed-at, else the
	// dead letter's timestamp).
	FailedAt time.Time `json:"failedAt"`
	// Reason is the class of the failure (Reasons), Message the error's sentence.
	Reason string `json:"reason"`
	// Message is the error's sentence.
	Message string `json:"message,omitempty"`
	// Topic, Partition and Offset are where the original record was read.
	Topic string `json:"topic"`
	// Partition is the original record's partition.
	Partition int32 `json:"partition"`
	// Offset is the original record's offset.
	Offset int64 `json:"offset"`
	// Type is the qualified message type (type.subtype), IdempotenceID the message's ID in it, as
	// far as the record could be decoded; empty when it could not (an undecodable record).
	Type string `json:"type,omitempty"`
	// IdempotenceID identifies the logical message together with the type.
	IdempotenceID string `json:"idempotenceID,omitempty"`
	// Sequence and ContextID name the sequence instance, when the engine knew it.
	Sequence string `json:"sequence,omitempty"`
	// ContextID is the instance's context ID.
	ContextID string `json:"contextID,omitempty"`
	// Omitted is what of the original the letter left out for its size (HeaderOmitted).
	Omitted string `json:"omitted,omitempty"`
	// DeadLetterPartition and DeadLetterOffset are where the letter is in the dead-letter topic.
	DeadLetterPartition int32 `json:"deadLetterPartition"`
	// DeadLetterOffset is the letter's offset in the dead-letter topic.
	DeadLetterOffset int64 `json:"deadLetterOffset"`
}

// List reads the dead letters that were in opts.Topic when it started, in the order of their
// failure, without a consumer group: it joins none and commits nothing, so listing changes
// nothing that a retry or the consumers remember. With opts.Since it starts each partition at the
// first letter from then on (ListOffsets by timestamp). conn holds the connection options (seed
// brokers, TLS, SASL).
func List(ctx context.Context, conn []kgo.Opt, opts ListOptions) ([]Entry, error) {
	if opts.Topic == "" {
		return nil, errors.New("list dead letters: the topic is required")
	}
	cl, err := kgo.NewClient(append(conn, kgo.FetchMaxWait(time.Second))...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: kafka client: %w", err)
	}
	defer cl.Close()
	from, ends, err := listRange(ctx, kadm.NewClient(cl), opts)
	if err != nil {
		return nil, err
	}
	entries := []Entry{}
	if len(from) == 0 {
		return entries, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{opts.Topic: from})
	for len(ends) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("list dead letters: %w", err)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return nil, fmt.Errorf("list dead letters: fetch %s[%d]: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			end, open := ends[r.Partition]
			if !open || r.Offset >= end {
				return
			}
			if r.Offset+1 >= end {
				delete(ends, r.Partition)
			}
			e := entryOf(r, opts.Decoder)
			if opts.Reason != "" && e.Reason != opts.Reason || e.FailedAt.Before(opts.Since) {
				return
			}
			entries = append(entries, e)
		})
	}
	sortByFailure(entries)
	return entries, nil
}

// listRange returns, per partition of the topic with letters to read, the offset to start at
// (the log start, or the first letter from opts.Since on) and the end offset when the list began.
func listRange(ctx context.Context, adm *kadm.Client, opts ListOptions) (map[int32]kgo.Offset, map[int32]int64, error) {
	endOffsets, err := adm.ListEndOffsets(ctx, opts.Topic)
	if err == nil {
		err = endOffsets.Error()
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return nil, nil, fmt.Errorf("list dead letters: the dead-letter topic %s does not exist (spec.deadLetterTopic, by default <consumerGroup>.dlq): %w", opts.Topic, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list dead letters: end offsets of %s: %w", opts.Topic, err)
	}
	var starts kadm.ListedOffsets
	if opts.Since.IsZero() {
		starts, err = adm.ListStartOffsets(ctx, opts.Topic)
	} else {
		starts, err = adm.ListOffsetsAfterMilli(ctx, opts.Since.UnixMilli(), opts.Topic)
	}
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list dead letters: start offsets of %s: %w", opts.Topic, err)
	}
	from := map[int32]kgo.Offset{}
	ends := map[int32]int64{}
	endOffsets.Each(func(e kadm.ListedOffset) {
		s, ok := starts.Lookup(e.Topic, e.Partition)
		if !ok || s.Offset < 0 || s.Offset >= e.Offset {
			return // nothing from then on
		}
		from[e.Partition] = kgo.NewOffset().At(s.Offset)
		ends[e.Partition] = e.Offset
	})
	return from, ends, nil
}

// entryOf reads a dead-letter record; dec, when set, decodes the original as the consumer did
// for its type and idempotence ID.
func entryOf(r *kgo.Record, dec *decode.Decoder) Entry {
	l := Read(r)
	e := Entry{
		FailedAt: r.Timestamp.UTC(), Reason: l.Reason, Message: l.Message,
		Topic: l.Origin.Topic, Partition: l.Origin.Partition, Offset: l.Origin.Offset,
		Sequence: l.Sequence, ContextID: l.ContextID, Omitted: l.Omitted,
		DeadLetterPartition: r.Partition, DeadLetterOffset: r.Offset,
	}
	for _, h := range r.Headers {
		if h.Key != HeaderFailedAt {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, string(h.Value)); err == nil {
			e.FailedAt = t.UTC()
		}
	}
	if dec != nil {
		original := Republish(l)
		original.Offset = l.Origin.Offset
		// What could be read even of a record that failed to decode (decode.Decoder.Decode).
		rec, _ := dec.Decode(original, e.FailedAt)
		e.Type, e.IdempotenceID = sequence.Qualify(rec.Type, rec.Subtype), rec.IdempotenceID
	}
	return e
}

// sortByFailure orders entries by failure time, then by their place in the dead-letter topic.
func sortByFailure(entries []Entry) {
	slices.SortStableFunc(entries, func(a, b Entry) int {
		if c := a.FailedAt.Compare(b.FailedAt); c != 0 {
			return c
		}
		if c := cmp.Compare(a.DeadLetterPartition, b.DeadLetterPartition); c != 0 {
			return c
		}
		return cmp.Compare(a.DeadLetterOffset, b.DeadLetterOffset)
	})
}
