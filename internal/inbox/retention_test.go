package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// records counts the raw records stored for a logical message.
func (h *harness) records(qualified, idem string) int {
	h.t.Helper()
	return h.count(`SELECT count(*) FROM buffered_message b JOIN sequenced_message m ON m.id = b.sequenced_message_id
WHERE m.message_type = $1 AND m.idempotence_id = $2`, qualified, h.prefix+idem)
}

// TestRawRecordIsKeptOnlyWhileTheEngineMayDeliverIt walks a message into every state, by a single
// record, a batch, a release and the actions, and checks whether its raw record exists: always
// while WAITING or FAILED (a release, a resend or an action may still deliver it), after delivery
// only when the sequence keeps the records of delivered messages.
func TestRawRecordIsKeptOnlyWhileTheEngineMayDeliverIt(t *testing.T) {
	sink := errors.New("rejected by the sink")
	for _, keep := range []bool{false, true} {
		name, set, delivered := "default", chainSet(), 0
		if keep {
			name, set, delivered = "keepDeliveredRecords", keepingChainSet(), 1
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, set)
			failFor := map[string]bool{}
			h.listener.setBehaviour(func(_ context.Context, m Message) error {
				if failFor[strings.TrimPrefix(m.Record.IdempotenceID, h.prefix)] {
					return sink
				}
				return nil
			})
			check := func(state, qualified, idem string, want int) {
				t.Helper()
				if n := h.records(qualified, idem); n != want {
					t.Errorf("%s (%s/%s): %d raw records, want %d", state, qualified, idem, n, want)
				}
			}

			// WAITING, then released by its predecessor.
			h.process(h.rec("B", "b1", "c1"))
			check("WAITING", "B", "b1", 1)
			h.process(h.rec("A", "a1", "c1"))
			check("PROCESSED by a single record", "A", "a1", delivered)
			check("released", "B", "b1", delivered)

			// FAILED, by a single record and by a batch, then delivered by a resend.
			failFor["a2"], failFor["a3"] = true, true
			h.process(h.rec("A", "a2", "c2"))
			h.processBatch(h.rec("A", "a3", "c3"), h.rec("A", "a4", "c4"))
			check("FAILED by a single record", "A", "a2", 1)
			check("FAILED in a batch", "A", "a3", 1)
			check("PROCESSED in a batch", "A", "a4", delivered)
			delete(failFor, "a2")
			delete(failFor, "a3")
			h.process(h.rec("A", "a2", "c2"))
			h.processBatch(h.rec("A", "a3", "c3"))
			check("FAILED, then PROCESSED by a resend", "A", "a2", delivered)
			check("FAILED, then PROCESSED by a resend in a batch", "A", "a3", delivered)

			// A buffered message whose release fails, then expired by an operator.
			failFor["b5"] = true
			h.process(h.rec("B", "b5", "c5"))
			h.process(h.rec("A", "a5", "c5"))
			check("FAILED on release", "B", "b5", 1)
			h.request("B", "b5", ActionExpire)
			h.runActions(1)
			check("expired", "B", "b5", delivered)

			// A WAITING message delivered by CONSUME.
			h.process(h.rec("C", "c6", "c6"))
			h.request("C", "c6", ActionConsume)
			h.runActions(1)
			check("consumed", "C", "c6", delivered)
		})
	}
}

// TestConsumeOfAProcessedMessageWithoutItsRecordNamesTheSetting: without
// spec.sequences[].keepDeliveredRecords, a CONSUME of a delivered message fails, calls nothing,
// leaves the message PROCESSED, and its outcome says which setting keeps the records.
func TestConsumeOfAProcessedMessageWithoutItsRecordNamesTheSetting(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("A", "a1", "x"))
	if err := RequestMessageAction(context.Background(), h.pool, h.prefix+"req", "A", h.prefix+"a1", ActionConsume); err != nil {
		t.Fatal(err)
	}
	h.runActions(1)
	if n := h.deliveries("A", "a1"); n != 1 {
		t.Fatalf("A delivered %d times, want once (no record to deliver again)", n)
	}
	r := h.result("req")
	if r.Outcome != OutcomeFailed || !strings.Contains(r.Detail, "keepDeliveredRecords") || !strings.Contains(r.Detail, `"chain"`) {
		t.Fatalf("outcome %s %q, want Failed naming keepDeliveredRecords and the sequence", r.Outcome, r.Detail)
	}
	if s := h.states("A", "a1"); len(s) != 1 || s[0] != stateProcessed {
		t.Fatalf("rows %v, want [PROCESSED]", s)
	}
}
