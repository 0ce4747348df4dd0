package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/deadletter"
)

// Topic is a topic the embedded broker creates at start.
type Topic struct {
	Name       string
	Partitions int32
}

// StartBroker starts an embedded single-broker Kafka cluster (kfake: the real wire protocol, in
// this process) with the given topics, on the given port (0: any free port). The caller closes it.
func StartBroker(port int, topics ...Topic) (*kfake.Cluster, error) {
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port)}
	for _, t := range topics {
		opts = append(opts, kfake.SeedTopics(t.Partitions, t.Name))
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start the embedded Kafka broker: %w", err)
	}
	return cluster, nil
}

// Produce writes the scenario's records, each to the partition the scenario chose, in order.
func Produce(ctx context.Context, seeds []string, sc *Scenario) error {
	client, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer client.Close()
	if err := client.ProduceSync(ctx, sc.Records()...).FirstErr(); err != nil {
		return fmt.Errorf("produce the scenario to %s: %w", sc.Topic, err)
	}
	return nil
}

// Unprocessed returns, per consumer group, how many records of topic lie beyond the group's
// committed offsets: zero means the group processed (and committed) everything.
func Unprocessed(ctx context.Context, seeds []string, topic string, groups []string) (map[string]int64, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	defer client.Close()
	adm := kadm.NewClient(client)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	out := map[string]int64{}
	for _, group := range groups {
		committed, err := adm.FetchOffsets(ctx, group)
		if errors.Is(err, kerr.GroupIDNotFound) {
			// A group that never committed has everything left.
			committed, err = kadm.OffsetResponses{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("committed offsets of group %s: %w", group, err)
		}
		var left int64
		ends.Each(func(end kadm.ListedOffset) {
			at := int64(0)
			if c, ok := committed.Lookup(end.Topic, end.Partition); ok && c.Err == nil && c.At > 0 {
				at = c.At
			}
			left += max(end.Offset-at, 0)
		})
		out[group] = left
	}
	return out, nil
}

// DeadLetter is one record of the dead-letter topic, as the report shows it.
type DeadLetter struct {
	// ID and Type are the dead-lettered record's ce_id and ce_type headers.
	ID, Type string
	// Reason and Message are the seqinbox-dlq-reason and seqinbox-dlq-message headers.
	Reason, Message string
	// Origin is where the consumer read the record: topic[partition]@offset.
	Origin string
	// Headers are all seqinbox-dlq-* headers, by name.
	Headers map[string]string
}

// ReadDeadLetters reads the whole dead-letter topic, from its start to its current end.
func ReadDeadLetters(ctx context.Context, seeds []string, topic string) ([]DeadLetter, error) {
	admClient, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	ends, err := kadm.NewClient(admClient).ListEndOffsets(ctx, topic)
	admClient.Close()
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil, nil
	}

	client, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, fmt.Errorf("dead-letter reader: %w", err)
	}
	defer client.Close()
	var out []DeadLetter
	for len(want) > 0 {
		fetches := client.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read %s: %w", topic, err)
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) { fetchErr = fmt.Errorf("read %s/%d: %w", t, p, err) })
		if fetchErr != nil {
			return nil, fetchErr
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; !ok || r.Offset >= end {
				return
			}
			out = append(out, deadLetterOf(r))
			if r.Offset+1 >= want[r.Partition] {
				delete(want, r.Partition)
			}
		})
	}
	return out, nil
}

func deadLetterOf(r *kgo.Record) DeadLetter {
	dl := DeadLetter{Headers: map[string]string{}}
	for _, h := range r.Headers {
		switch {
		case h.Key == "ce_id":
			dl.ID = string(h.Value)
		case h.Key == "ce_type":
			dl.Type = string(h.Value)
		case strings.HasPrefix(h.Key, deadletter.HeaderPrefix):
			dl.Headers[h.Key] = string(h.Value)
		}
	}
	dl.Reason = dl.Headers[deadletter.HeaderReason]
	dl.Message = dl.Headers[deadletter.HeaderMessage]
	if topic := dl.Headers[deadletter.HeaderOriginalTopic]; topic != "" {
		dl.Origin = fmt.Sprintf("%s[%s]@%s", topic, dl.Headers[deadletter.HeaderOriginalPartition], dl.Headers[deadletter.HeaderOriginalOffset])
	}
	return dl
}
