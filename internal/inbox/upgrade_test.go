package inbox

import (
	"context"
	"testing"
)

// The state writes of the previous release (commit e9cf1d8^), which kept the raw record of every
// message, verbatim: consumers of that release run beside this one during a rollout (same claim
// protocol), on the schema this release migrated.
const (
	previousInsertStateSQL = `WITH m AS (
  INSERT INTO sequenced_message
    (sequence_instance_id, message_type, idempotence_id, message_id, topic, partition, "offset", state, trace_context)
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
  WHERE NOT EXISTS (SELECT 1 FROM sequenced_message WHERE idempotence_id = $3 AND message_type = $2)
  RETURNING id, sequence_instance_id
)
INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
SELECT sequence_instance_id, id, $10, $11, $12 FROM m
RETURNING set_config('synchronous_commit', CASE WHEN $8 = 'PROCESSED' THEN 'off' ELSE current_setting('synchronous_commit') END, true)`

	previousUpdateFailedStateSQL = `WITH m AS (
  UPDATE sequenced_message
  SET state = $2, state_changed_at = now(), sequence_instance_id = $3, message_id = $4, topic = $5,
      partition = $6, "offset" = $7, trace_context = $8
  WHERE id = $1 AND state = 'FAILED'
  RETURNING id, sequence_instance_id
)
INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
SELECT sequence_instance_id, id, $9, $10, $11 FROM m
ON CONFLICT (sequenced_message_id) DO UPDATE
SET sequence_instance_id = EXCLUDED.sequence_instance_id, key = EXCLUDED.key, value = EXCLUDED.value, headers = EXCLUDED.headers`
)

// previousRelease stores a message as a consumer of the previous release did after its listener
// call: its state with its raw record, and the claim its T1 committed.
func (h *harness) previousRelease(rec Record, state string) int64 {
	h.t.Helper()
	ctx := context.Background()
	seq, _ := h.engine.set.Sequence("chain")
	instanceID, err := h.engine.getOrCreateInstance(ctx, h.pool, seq, rec.ContextID)
	if err != nil {
		h.t.Fatal(err)
	}
	headers, err := encodeHeaders(rec.Headers)
	if err != nil {
		h.t.Fatal(err)
	}
	o := rec.Origin
	if _, err := h.pool.Exec(ctx, previousInsertStateSQL, instanceID, rec.Type, rec.IdempotenceID, o.MessageID, o.Topic,
		o.Partition, o.Offset, state, nil, rec.Key, rec.Value, headers); err != nil {
		h.t.Fatalf("previous release stores %s %s: %v", rec.IdempotenceID, state, err)
	}
	if state == stateProcessed {
		if _, err := h.pool.Exec(ctx, `INSERT INTO sequential_inbox_idempotence (message_type, idempotence_id, sequence_instance_id, created_at)
VALUES ($1, $2, $3, now())`, rec.Type, rec.IdempotenceID, instanceID); err != nil {
			h.t.Fatal(err)
		}
	}
	return instanceID
}

// deliveredValue is the value of the last delivery of a message.
func (h *harness) deliveredValue(qualified, idem string) string {
	h.listener.mu.Lock()
	defer h.listener.mu.Unlock()
	value := ""
	for _, m := range h.listener.delivered {
		if m.QualifiedType == qualified && m.Record.IdempotenceID == h.prefix+idem {
			value = string(m.Record.Value)
		}
	}
	return value
}

// TestRecordsThatThePreviousReleaseKeptStayUsableAndItsWritesStillWork: a database upgraded from
// the previous release holds raw records of delivered messages, and that release's consumers
// keep writing them until the rollout ends. This release recognises those messages as delivered,
// delivers such a record again on Consume (it exists) and then keeps none, as for its own
// deliveries; and the previous release's state writes, including its ON CONFLICT on the record's
// message, still work on the migrated schema.
func TestRecordsThatThePreviousReleaseKeptStayUsableAndItsWritesStillWork(t *testing.T) {
	h := newHarness(t, chainSet())
	old := h.rec("A", "a1", "c1")
	old.Value = []byte(`{"stored":"by the previous release"}`)
	h.previousRelease(old, stateProcessed)
	if n := h.records("A", "a1"); n != 1 {
		t.Fatalf("previous release kept %d records for a delivered message, want 1", n)
	}

	if res := h.process(h.rec("A", "a1", "c1")); res.Outcome != Duplicate {
		t.Fatalf("redelivery of a message the previous release delivered: %v, want Duplicate", res.Outcome)
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener called %d times for a delivered message", n)
	}

	h.request("A", "a1", ActionConsume)
	h.runActions(1)
	if n := h.deliveries("A", "a1"); n != 1 {
		t.Fatalf("Consume delivered the kept record %d times, want once", n)
	}
	if got := h.deliveredValue("A", "a1"); got != string(old.Value) {
		t.Fatalf("Consume delivered %q, want the record the previous release kept, %q", got, old.Value)
	}
	if n := h.records("A", "a1"); n != 0 {
		t.Fatalf("after Consume %d records, want none (the sequence does not keep delivered records)", n)
	}

	// The previous release's writes on this schema: a FAILED message with its record, then its
	// redelivery, which replaces the record through ON CONFLICT (sequenced_message_id).
	failed := h.rec("A", "a2", "c2")
	instanceID := h.previousRelease(failed, stateFailed)
	var id int64
	if err := h.pool.QueryRow(context.Background(), `SELECT id FROM sequenced_message WHERE message_type = 'A' AND idempotence_id = $1`,
		failed.IdempotenceID).Scan(&id); err != nil {
		t.Fatal(err)
	}
	resent := h.rec("A", "a2", "c2")
	resent.Value = []byte(`{"resent":true}`)
	headers, err := encodeHeaders(resent.Headers)
	if err != nil {
		t.Fatal(err)
	}
	o := resent.Origin
	tag, err := h.pool.Exec(context.Background(), previousUpdateFailedStateSQL, id, stateProcessed, instanceID,
		o.MessageID, o.Topic, o.Partition, o.Offset, nil, resent.Key, resent.Value, headers)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("previous release's redelivery of a FAILED message: %v, %v rows", err, tag.RowsAffected())
	}
	if n := h.count(`SELECT count(*) FROM buffered_message WHERE sequenced_message_id = $1 AND value = $2`, id, resent.Value); n != 1 {
		t.Fatalf("records of the redelivered message with its new value: %d, want 1", n)
	}
	if s := h.states("A", "a2"); len(s) != 1 || s[0] != stateProcessed {
		t.Fatalf("rows %v, want [PROCESSED]", s)
	}
}
