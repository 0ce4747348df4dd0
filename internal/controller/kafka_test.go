package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

// joinGroup starts a real franz-go group member and waits until the group lists it.
func joinGroup(t *testing.T, seeds []string, group, clientID string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts = append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics("orders"), kgo.ClientID(clientID)}, opts...)
	member, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(member.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			member.PollFetches(ctx)
		}
	}()
	waitForMembers(t, seeds, group, func(members []GroupMember) bool {
		return len(members) == 1 && members[0].ClientID == clientID
	})
	return member
}

// waitForMembers polls the group (with a deadline) until done accepts its members.
func waitForMembers(t *testing.T, seeds []string, group string, done func([]GroupMember) bool) []GroupMember {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		members, err := KafkaGroups{}.GroupMembers(t.Context(), KafkaConnection{Bootstrap: seeds}, group)
		if err == nil && done(members) {
			return members
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s: members %v, err %v; condition not reached", group, members, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestKafkaGroupsListsAMemberUntilItLeaves(t *testing.T) {
	seeds := testenv.Kafka(t, 1, "orders")
	members, err := KafkaGroups{}.GroupMembers(t.Context(), KafkaConnection{Bootstrap: seeds}, "orders")
	if err != nil || len(members) != 0 {
		t.Fatalf("a group nobody joined has members %v (err %v), want none", members, err)
	}
	member := joinGroup(t, seeds, "orders", "old-consumer")
	members = waitForMembers(t, seeds, "orders", func(m []GroupMember) bool { return len(m) == 1 && m[0].Protocol != "" })
	if got := members[0].String(); !strings.Contains(got, "client old-consumer") || !strings.Contains(got, "host 127.0.0.1:") ||
		!strings.Contains(got, "protocol cooperative-sticky") {
		t.Errorf("member %q does not name its client, host and group protocol", got)
	}
	member.Close() // leaves the group
	waitForMembers(t, seeds, "orders", func(m []GroupMember) bool { return len(m) == 0 })
}

func TestKafkaGroupsListsAMemberOfANextGenerationGroup(t *testing.T) {
	seeds := testenv.Kafka(t, 1, "orders")
	member := joinGroup(t, seeds, "orders", "kip848-consumer",
		kgo.ServerSideBalancer(), kgo.Balancers(kgo.RangeBalancer()))
	members := waitForMembers(t, seeds, "orders", func(m []GroupMember) bool { return len(m) == 1 })
	if members[0].ClientID != "kip848-consumer" || !strings.HasPrefix(members[0].Protocol, "consumer/") {
		t.Errorf("member %s is not the KIP-848 consumer", members[0])
	}
	member.Close()
	waitForMembers(t, seeds, "orders", func(m []GroupMember) bool { return len(m) == 0 })
}

func TestKafkaGroupsReportsAnUnreachableCluster(t *testing.T) {
	_, err := KafkaGroups{Timeout: 2 * time.Second}.GroupMembers(t.Context(), KafkaConnection{Bootstrap: []string{"127.0.0.1:1"}}, "orders")
	if err == nil {
		t.Fatal("no error from a cluster that does not exist; the gate would think the group is empty")
	}
}
