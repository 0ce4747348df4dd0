package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TopicPartitions returns the partition count of every topic that exists; a topic that does not
// exist (yet) is left out. Any other error of a topic fails the read.
func (k KafkaGroups) TopicPartitions(ctx context.Context, conn KafkaConnection, topics []string) (map[string]int32, error) {
	return withAdmin(ctx, k, conn, func(ctx context.Context, adm *kadm.Client) (map[string]int32, error) {
		return topicPartitions(ctx, adm, topics)
	})
}

// topicPartitions reads the partition counts through adm.
func topicPartitions(ctx context.Context, adm *kadm.Client, topics []string) (map[string]int32, error) {
	details, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("topic metadata of %v: %w", topics, err)
	}
	counts := map[string]int32{}
	for _, topic := range topics {
		d, ok := details[topic]
		switch {
		case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
			continue
		case d.Err != nil:
			return nil, fmt.Errorf("topic metadata of %s: %w", topic, d.Err)
		}
		counts[topic] = int32(len(d.Partitions))
	}
	return counts, nil
}
