package migrations_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/seqinbox/seqinbox/migrations"
)

func TestReportEncodesTheContractShapeWithEmptyListsAsArrays(t *testing.T) {
	r := migrations.Report{SchemaVersion: 3, Applied: []int{2, 3}, ClaimProtocol: "insert-first-v1", EngineVersion: "v0.1.0"}

	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"schemaVersion":3,"applied":[2,3],"pending":[],"claimProtocol":"insert-first-v1","engineVersion":"v0.1.0","liveConsumers":[]}`
	if string(b) != want {
		t.Fatalf("report JSON\n got %s\nwant %s", b, want)
	}
}

func TestReportRoundTripsThroughJSON(t *testing.T) {
	at := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	r := migrations.Report{SchemaVersion: 3, Applied: []int{}, Pending: []int{}, ClaimProtocol: "p", EngineVersion: "v",
		LiveConsumers: []migrations.LiveConsumer{{InstanceID: "pod-1", ConsumerGroup: "g", EngineVersion: "v0", ClaimProtocol: "p0", HeartbeatAt: at}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"heartbeatAt":"2026-05-01T10:00:00Z"`) || !strings.Contains(string(b), `"instanceId":"pod-1"`) {
		t.Fatalf("consumer not encoded as the contract says: %s", b)
	}
	var back migrations.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.LiveConsumers[0] != r.LiveConsumers[0] || back.SchemaVersion != 3 || back.LiveConsumersTruncated {
		t.Fatalf("decoded %+v, want %+v", back, r)
	}
}

func TestEncodeWithinTruncatesConsumersToFitTheTerminationMessage(t *testing.T) {
	r := migrations.Report{SchemaVersion: 3, ClaimProtocol: "insert-first-v1", EngineVersion: "v0.1.0"}
	for i := range 200 {
		r.LiveConsumers = append(r.LiveConsumers, migrations.LiveConsumer{
			InstanceID: fmt.Sprintf("orders-consumer-7d9f8c6b5-%05d", i), ConsumerGroup: "orders",
			EngineVersion: "v0.1.0", ClaimProtocol: "insert-first-v1", HeartbeatAt: time.Unix(1_800_000_000, 0).UTC(),
		})
	}

	b, err := r.EncodeWithin(migrations.TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > migrations.TerminationMessageLimit {
		t.Fatalf("encoded %d bytes, over the limit of %d", len(b), migrations.TerminationMessageLimit)
	}
	var back migrations.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.LiveConsumersTruncated || len(back.LiveConsumers) == 0 || len(back.LiveConsumers) >= 200 {
		t.Fatalf("decoded %d consumers, truncated=%v; want a non-empty prefix and the truncation flag", len(back.LiveConsumers), back.LiveConsumersTruncated)
	}
	if back.LiveConsumers[0].InstanceID != r.LiveConsumers[0].InstanceID {
		t.Fatalf("first consumer = %s, want the list's head kept", back.LiveConsumers[0].InstanceID)
	}
}

func TestEncodeWithinLeavesASmallReportWhole(t *testing.T) {
	r := migrations.Report{SchemaVersion: 3, LiveConsumers: []migrations.LiveConsumer{{InstanceID: "a"}, {InstanceID: "b"}}}

	b, err := r.EncodeWithin(migrations.TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "liveConsumersTruncated") || strings.Count(string(b), "instanceId") != 2 {
		t.Fatalf("small report changed: %s", b)
	}
}

func TestEncodeWithinShortensAnOverlongError(t *testing.T) {
	r := migrations.Report{Error: strings.Repeat("é", 5000)}

	b, err := r.EncodeWithin(migrations.TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	var back migrations.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("shortened report is not valid JSON: %v", err)
	}
	if len(b) > migrations.TerminationMessageLimit || !strings.HasSuffix(back.Error, "é…") {
		t.Fatalf("encoded %d bytes with error ending %q; want within the limit, cut on a rune boundary", len(b), back.Error[len(back.Error)-8:])
	}
}

func TestEncodeWithinKeepsTheConsumersWithABlockedRecord(t *testing.T) {
	r := migrations.Report{SchemaVersion: 6, ClaimProtocol: "insert-first-v1", EngineVersion: "v0.1.0"}
	since := time.Unix(1_800_000_000, 0).UTC()
	for i := range 60 {
		c := migrations.LiveConsumer{InstanceID: fmt.Sprintf("orders-consumer-7d9f8c6b5-%05d", i), ConsumerGroup: "orders",
			EngineVersion: "v0.1.0", ClaimProtocol: "insert-first-v1", HeartbeatAt: since}
		if i%20 == 19 {
			c.Blocked = &migrations.BlockedRecord{Topic: "orders", Partition: int32(i), Offset: 42, Since: since,
				Error: migrations.ShortError(strings.Repeat("ERROR: out of resources (SQLSTATE 53000) ", 20))}
		}
		r.LiveConsumers = append(r.LiveConsumers, c)
	}

	b, err := r.EncodeWithin(migrations.TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	var back migrations.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	var partitions []int32
	for _, c := range back.LiveConsumers {
		if c.Blocked != nil {
			partitions = append(partitions, c.Blocked.Partition)
			if len(c.Blocked.Error) > migrations.MaxBlockedError {
				t.Fatalf("blocked error of %d bytes, over %d", len(c.Blocked.Error), migrations.MaxBlockedError)
			}
		}
	}
	if !back.LiveConsumersTruncated || len(back.LiveConsumers) == 60 || fmt.Sprint(partitions) != "[19 39 59]" {
		t.Fatalf("truncated %v to %d consumers with blocked partitions %v; want every blocked one kept",
			back.LiveConsumersTruncated, len(back.LiveConsumers), partitions)
	}
}
