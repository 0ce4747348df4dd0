package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestKafkaProducesAndConsumesOverTheWireProtocol(t *testing.T) {
	seeds := Kafka(t, 3, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	const n = 30
	for i := range n {
		rec := &kgo.Record{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", i%5), Value: fmt.Appendf(nil, "event-%d", i)}
		if err := producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}

	consumer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("testenv"),
		kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	seen := map[string]int{}
	partitions := map[int32]bool{}
	for len(seen) < n {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records before the deadline", len(seen), n)
		}
		fetches.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fetches.EachRecord(func(r *kgo.Record) {
			seen[string(r.Value)]++
			partitions[r.Partition] = true
		})
	}
	for v, c := range seen {
		if c != 1 {
			t.Errorf("record %s consumed %d times", v, c)
		}
	}
	if len(partitions) < 2 {
		t.Errorf("records of 5 keys landed on %d partition(s); the cluster should spread them", len(partitions))
	}
}
