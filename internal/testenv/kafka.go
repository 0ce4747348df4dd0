package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaTimeout bounds one produce, read or offset query of the helpers below: generous, so that
// a loaded machine slows a test down but does not fail it.
const kafkaTimeout = 4 * time.Minute

// defaultBatchBytes is the franz-go client's default bound of a record batch, within the
// brokers' default max.message.bytes.
const defaultBatchBytes = 1_000_012

// Kafka starts an in-process Kafka cluster (kfake: the real wire protocol) with the given topics
// (each with the given number of partitions) and returns its seed brokers. It stops with the test.
func Kafka(t testing.TB, partitions int32, topics ...string) []string {
	t.Helper()
	_, seeds := KafkaCluster(t, partitions, topics...)
	return seeds
}

// KafkaCluster is Kafka, also returning the cluster, for a test that injects faults into it.
func KafkaCluster(t testing.TB, partitions int32, topics ...string) (*kfake.Cluster, []string) {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(int(partitions))}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(partitions, topics...))
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("start kfake cluster: %v", err)
	}
	t.Cleanup(cluster.Close)
	return cluster, cluster.ListenAddrs()
}

// Produce writes records to the partitions they name and waits until the brokers have them. A
// record that does not fit the client's default batch (with room for its headers) gets batches
// of its size plus 1 MiB, so that it reaches a topic whose max.message.bytes allows it.
func Produce(t testing.TB, seeds []string, records ...*kgo.Record) {
	t.Helper()
	largest := 0
	for _, r := range records {
		largest = max(largest, len(r.Key)+len(r.Value))
	}
	opts := []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner())}
	if largest > defaultBatchBytes-64<<10 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(int32(largest+1<<20)))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), kafkaTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, records...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// ReadTopic reads every record of a topic up to its current end.
func ReadTopic(t testing.TB, seeds []string, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kafkaTimeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: %v", topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset < end {
				out = append(out, r)
				if r.Offset+1 >= end {
					delete(want, r.Partition)
				}
			}
		})
	}
	return out
}

// CommittedLag returns, per partition of topic, its end offset minus the offset the group
// committed (the end offset where the group committed nothing).
func CommittedLag(seeds []string, group, topic string) (map[int32]int64, error) {
	lag := map[int32]int64{}
	err := withAdmin(seeds, func(ctx context.Context, adm *kadm.Client) error {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return err
		}
		committed, err := committedOffsets(ctx, adm, group, topic)
		if err != nil {
			return err
		}
		ends.Each(func(o kadm.ListedOffset) { lag[o.Partition] = o.Offset - committed[o.Partition] })
		return nil
	})
	return lag, err
}

// CommittedOffsets returns the offset the group committed per partition of topic; a partition
// without a commit is missing.
func CommittedOffsets(seeds []string, group, topic string) (map[int32]int64, error) {
	var committed map[int32]int64
	err := withAdmin(seeds, func(ctx context.Context, adm *kadm.Client) (err error) {
		committed, err = committedOffsets(ctx, adm, group, topic)
		return err
	})
	return committed, err
}

func committedOffsets(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]int64, error) {
	fetched, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, err
	}
	committed := map[int32]int64{}
	for partition, o := range fetched[topic] {
		committed[partition] = o.At
	}
	return committed, nil
}

// withAdmin runs f with an admin client of the cluster, within kafkaTimeout.
func withAdmin(seeds []string, f func(context.Context, *kadm.Client) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), kafkaTimeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	return f(ctx, kadm.NewClient(cl))
}
