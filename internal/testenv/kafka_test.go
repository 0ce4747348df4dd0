package testenv

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
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

func TestProduceReadTopicAndCommittedLag(t *testing.T) {
	seeds := Kafka(t, 2, "orders")
	records := []*kgo.Record{
		{Topic: "orders", Partition: 0, Value: []byte("a")},
		{Topic: "orders", Partition: 1, Value: []byte("b")},
		{Topic: "orders", Partition: 1, Value: []byte("c")},
	}
	Produce(t, seeds, records...)
	read := map[int32][]string{}
	for _, r := range ReadTopic(t, seeds, "orders") {
		read[r.Partition] = append(read[r.Partition], string(r.Value))
	}
	if fmt.Sprint(read) != "map[0:[a] 1:[b c]]" {
		t.Errorf("read %v, want a on partition 0 and b, c on partition 1 in order", read)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var offsets kadm.Offsets
	offsets.AddOffset("orders", 1, 1, -1)
	if err := kadm.NewClient(cl).CommitAllOffsets(t.Context(), "g", offsets); err != nil {
		t.Fatal(err)
	}
	lag, err := CommittedLag(seeds, "g", "orders")
	if err != nil || lag[0] != 1 || lag[1] != 1 {
		t.Errorf("lag = %v, %v; want 1 on partition 0 (nothing committed) and 1 on partition 1 (1 of 2 committed)", lag, err)
	}
}

// TestProduceSendsARecordLargerThanTheDefaultBatch: the client rejects a record larger than its
// batch bound before any broker sees it.
func TestProduceSendsARecordLargerThanTheDefaultBatch(t *testing.T) {
	seeds := Kafka(t, 1, "large")
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	limit := strconv.Itoa(4 << 20)
	resp, err := kadm.NewClient(cl).AlterTopicConfigs(t.Context(),
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &limit}}, "large")
	if err == nil {
		var r kadm.AlterConfigsResponse
		if r, err = resp.On("large", nil); err == nil {
			err = r.Err
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	Produce(t, seeds, &kgo.Record{Topic: "large", Value: bytes.Repeat([]byte{'x'}, 2<<20)})
	if read := ReadTopic(t, seeds, "large"); len(read) != 1 || len(read[0].Value) != 2<<20 {
		t.Errorf("read %d records, want the one of 2 MiB", len(read))
	}
}
