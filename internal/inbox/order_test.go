package inbox

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

func TestBufferedMessageIsReleasedByItsPredecessorByteForByte(t *testing.T) {
	h := newHarness(t, chainSet())
	b := h.rec("B", "b1", "c1")
	b.Key = []byte{0x00, 0xff, 0x10}
	b.Headers = append(b.Headers, Header{Key: "binary", Value: []byte{0, 1, 2, 254}}, Header{Key: "empty"},
		Header{Key: "ce_type", Value: []byte("repeated key")})
	if res := h.process(b); res.Outcome != Buffered {
		t.Fatalf("B = %v, want Buffered", res.Outcome)
	}
	if n := h.listener.callCount(); n != 0 {
		t.Fatalf("listener calls = %d, want 0 while B waits", n)
	}
	res := h.process(h.rec("A", "a1", "c1"))
	if res.Outcome != Delivered || !slices.Equal(types(res.Released), []string{"B"}) {
		t.Fatalf("A = %v released %v, want Delivered releasing [B]", res.Outcome, types(res.Released))
	}
	got := res.Released[0].Record
	if !reflect.DeepEqual(got.Key, b.Key) || !reflect.DeepEqual(got.Value, b.Value) ||
		!reflect.DeepEqual(got.Headers, b.Headers) || got.Origin != b.Origin ||
		got.Type != "B" || got.IdempotenceID != b.IdempotenceID || got.ContextID != b.ContextID {
		t.Fatalf("released record = %+v\nwant %+v", got, b)
	}
	if got := h.listener.deliveredTypes(h.ctxID("c1")); !slices.Equal(got, []string{"A", "B"}) {
		t.Fatalf("delivered %v, want [A B]", got)
	}
	if n := h.count(`SELECT count(*) FROM buffered_message b JOIN sequenced_message m ON m.id = b.sequenced_message_id
WHERE m.idempotence_id = $1`, b.IdempotenceID); n != 0 {
		t.Fatalf("stored records of B after release = %d, want 0: a released message keeps no record by default", n)
	}
	if s := h.instanceState("chain", "c1"); s != "OPEN" {
		t.Fatalf("instance = %s, want OPEN (C missing)", s)
	}
}

func TestTwoSuccessorsAreReleasedInArrivalOrderAndCloseTheInstance(t *testing.T) {
	h := newHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("fork",
		mt("A", "", nil), mt("B", "", sequence.Predecessor("A")), mt("C", "", sequence.Predecessor("A")),
	)}))
	h.process(h.rec("C", "c1", "x"))
	h.process(h.rec("B", "b1", "x"))
	res := h.process(h.rec("A", "a1", "x"))
	if !slices.Equal(types(res.Released), []string{"C", "B"}) {
		t.Fatalf("released %v, want [C B] (by arrival)", types(res.Released))
	}
	if got := h.listener.deliveredTypes(h.ctxID("x")); !slices.Equal(got, []string{"A", "C", "B"}) {
		t.Fatalf("delivered %v, want [A C B]", got)
	}
	if s := h.instanceState("fork", "x"); s != "CLOSED" {
		t.Fatalf("instance = %s, want CLOSED", s)
	}
}

func TestOrConditionReleasesOnEitherPredecessorAndNestedAndWaitsForAll(t *testing.T) {
	h := newHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("alt",
		mt("A", "", nil), mt("B", "", nil), mt("C", "", nil),
		mt("D", "", sequence.Or{sequence.Predecessor("B"), sequence.Predecessor("C")}),
		mt("E", "", sequence.And{sequence.Predecessor("A"), sequence.Or{sequence.Predecessor("B"), sequence.Predecessor("C")}}),
	)}))
	h.process(h.rec("D", "d1", "viaB"))
	if res := h.process(h.rec("B", "b1", "viaB")); !slices.Equal(types(res.Released), []string{"D"}) {
		t.Fatalf("B released %v, want [D]", types(res.Released))
	}
	h.process(h.rec("D", "d2", "viaC"))
	if res := h.process(h.rec("C", "c2", "viaC")); !slices.Equal(types(res.Released), []string{"D"}) {
		t.Fatalf("C released %v, want [D]", types(res.Released))
	}

	h.process(h.rec("E", "e3", "nested"))
	if res := h.process(h.rec("C", "c3", "nested")); len(res.Released) != 0 {
		t.Fatalf("C released %v, want nothing: E also needs A", types(res.Released))
	}
	if res := h.process(h.rec("A", "a3", "nested")); !slices.Equal(types(res.Released), []string{"E"}) {
		t.Fatalf("A released %v, want [E]", types(res.Released))
	}
	if got := h.listener.deliveredTypes(h.ctxID("nested")); !slices.Equal(got, []string{"C", "A", "E"}) {
		t.Fatalf("delivered %v, want [C A E]", got)
	}
}

func TestSubtypesOfOneTypeBelongToTwoSequences(t *testing.T) {
	h := newHarness(t, sequence.NewSet([]*sequence.Sequence{
		seqOf("stock", mt("OrderCreated", "", nil), mt("OrderValidated", "STOCK", sequence.Predecessor("OrderCreated"))),
		seqOf("payment", mt("PaymentRequested", "", nil), mt("OrderValidated", "PAYMENT", sequence.Predecessor("PaymentRequested"))),
	}))
	// The same idempotence ID under two qualified types: two logical messages, two claims.
	if res := h.process(h.rec("OrderValidated.STOCK", "v1", "o1")); res.Outcome != Buffered {
		t.Fatalf("STOCK = %v, want Buffered", res.Outcome)
	}
	if res := h.process(h.rec("OrderValidated.PAYMENT", "v1", "o1")); res.Outcome != Buffered {
		t.Fatalf("PAYMENT = %v, want Buffered (a separate logical message)", res.Outcome)
	}
	if res := h.process(h.rec("PaymentRequested", "p1", "o1")); !slices.Equal(types(res.Released), []string{"OrderValidated.PAYMENT"}) {
		t.Fatalf("PaymentRequested released %v, want only the PAYMENT subtype", types(res.Released))
	}
	if s := h.instanceState("stock", "o1"); s != "OPEN" {
		t.Fatalf("stock instance = %s, want OPEN", s)
	}
	if res := h.process(h.rec("OrderCreated", "c1", "o1")); !slices.Equal(types(res.Released), []string{"OrderValidated.STOCK"}) {
		t.Fatalf("OrderCreated released %v, want the STOCK subtype", types(res.Released))
	}
	released := h.listener.delivered[len(h.listener.delivered)-1].Record
	if released.Type != "OrderValidated" || released.Subtype != "STOCK" {
		t.Fatalf("released record type %q subtype %q, want OrderValidated/STOCK", released.Type, released.Subtype)
	}
	for _, s := range []string{"stock", "payment"} {
		if st := h.instanceState(s, "o1"); st != "CLOSED" {
			t.Fatalf("%s instance = %s, want CLOSED", s, st)
		}
	}
}

func TestRecordingModeDeliversAtOnceThenSequencingBuffers(t *testing.T) {
	clock := newFakeClock()
	start := clock.Now().Add(time.Hour)
	h := newHarness(t, chainSet(), func(c *harnessSettings) { c.Clock, c.SequencingStartTime = clock, start })

	for _, typ := range []string{"C", "B", "A"} {
		if res := h.process(h.rec(typ, typ+"1", "rec")); res.Outcome != Delivered {
			t.Fatalf("%s in recording mode = %v, want Delivered", typ, res.Outcome)
		}
	}
	if got := h.listener.deliveredTypes(h.ctxID("rec")); !slices.Equal(got, []string{"C", "B", "A"}) {
		t.Fatalf("recording mode delivered %v, want arrival order [C B A]", got)
	}
	if n := h.count(`SELECT count(*) FROM buffered_message b JOIN sequence_instance i ON i.id = b.sequence_instance_id WHERE i.context_id = $1`, h.ctxID("rec")); n != 0 {
		t.Fatalf("stored records in recording mode = %d, want 0: a delivered message keeps no record by default", n)
	}
	if s := h.instanceState("chain", "rec"); s != "CLOSED" {
		t.Fatalf("instance = %s, want CLOSED once complete", s)
	}

	clock.Step(2 * time.Hour)
	if res := h.process(h.rec("C", "C2", "active")); res.Outcome != Buffered {
		t.Fatalf("C after sequencingStartTime = %v, want Buffered", res.Outcome)
	}
}

func TestSeveralMessagesOfOneTypeAreAllReleased(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("B", "b1", "x"))
	h.process(h.rec("B", "b2", "x"))
	res := h.process(h.rec("A", "a1", "x"))
	if len(res.Released) != 2 || res.Released[0].Record.IdempotenceID != h.prefix+"b1" || res.Released[1].Record.IdempotenceID != h.prefix+"b2" {
		t.Fatalf("released %v, want b1 then b2", res.Released)
	}
	if res := h.process(h.rec("C", "c1", "x")); res.Outcome != Delivered {
		t.Fatalf("C = %v, want Delivered", res.Outcome)
	}
	if s := h.instanceState("chain", "x"); s != "CLOSED" {
		t.Fatalf("instance = %s, want CLOSED", s)
	}
	// A late message of a type seen before: the instance is complete, it is delivered at once.
	if res := h.process(h.rec("B", "b3", "x")); res.Outcome != Delivered {
		t.Fatalf("late B = %v, want Delivered", res.Outcome)
	}
}

func TestFailedPredecessorHoldsSuccessorsUntilItsResendSucceeds(t *testing.T) {
	h := newHarness(t, chainSet())
	h.listener.setBehaviour(func(context.Context, Message) error { return errors.New("down") })
	a := h.rec("A", "a1", "x")
	if res := h.process(a); res.Outcome != Failed {
		t.Fatalf("A = %v, want Failed", res.Outcome)
	}
	h.listener.setBehaviour(nil)
	if res := h.process(h.rec("B", "b1", "x")); res.Outcome != Buffered {
		t.Fatalf("B = %v, want Buffered: a FAILED predecessor is not processed", res.Outcome)
	}
	res := h.process(a)
	if res.Outcome != Delivered || !slices.Equal(types(res.Released), []string{"B"}) {
		t.Fatalf("resent A = %v released %v, want Delivered releasing [B]", res.Outcome, types(res.Released))
	}
}

// lockInstanceInTx opens a transaction that runs lockSQL ($1: the instance id) on the instance.
func (h *harness) lockInstanceInTx(seq, contextID, lockSQL string) pgx.Tx {
	h.t.Helper()
	ctx := context.Background()
	var id int64
	if err := h.pool.QueryRow(ctx, `SELECT id FROM sequence_instance WHERE name = $1 AND context_id = $2`,
		seq, h.ctxID(contextID)).Scan(&id); err != nil {
		h.t.Fatal(err)
	}
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	rows, err := tx.Query(ctx, lockSQL, id)
	if err != nil {
		h.t.Fatal(err)
	}
	if rows.Close(); rows.Err() != nil {
		h.t.Fatal(rows.Err())
	}
	return tx
}

func TestMessagesAreBufferedAndDeliveredWhileAnotherTransactionHoldsTheReleaseLock(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("C", "c1", "x"))
	// The engine's own release lock statement, held by another transaction.
	tx := h.lockInstanceInTx("chain", "x", lockInstanceSQL)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := h.engine.Process(ctx, h.rec("C", "c2", "x"))
	if err != nil || res.Outcome != Buffered {
		t.Fatalf("C2 under a held release lock = %v, %v; want Buffered without waiting", res.Outcome, err)
	}
	res, err = h.engine.Process(ctx, h.rec("A", "a1", "x"))
	if err != nil || res.Outcome != Delivered {
		t.Fatalf("A under a held release lock = %v, %v; want Delivered without waiting", res.Outcome, err)
	}
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if res := h.process(h.rec("B", "b1", "x")); !slices.Equal(types(res.Released), []string{"C", "C"}) {
		t.Fatalf("B released %v, want both buffered C", types(res.Released))
	}
}

// The control for the test above: under FOR UPDATE, which the release must not use, the claim
// insert's foreign key check waits, so buffering would stall behind every release.
func TestForUpdateOnTheInstanceWouldStallBuffering(t *testing.T) {
	h := newHarness(t, chainSet())
	h.process(h.rec("C", "c1", "x"))
	tx := h.lockInstanceInTx("chain", "x", `SELECT id FROM sequence_instance WHERE id = $1 FOR UPDATE`)

	done := h.processAsync(h.rec("C", "c2", "x"))
	waitFor(t, "the claim insert to wait behind FOR UPDATE", func() bool { return len(h.blockedClaimInserts()) == 1 })
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := await(t, done, "C2"); r.err != nil || r.res.Outcome != Buffered {
		t.Fatalf("C2 = %v, %v; want Buffered after the lock went", r.res.Outcome, r.err)
	}
}

func TestReleaseTransactionIsSkippedWhenNothingIsReleasable(t *testing.T) {
	h := newHarness(t, chainSet())
	run, skipped := h.engine.metrics.releases.WithLabelValues(releaseRun), h.engine.metrics.releases.WithLabelValues(releaseSkipped)
	h.process(h.rec("A", "a1", "x"))
	h.process(h.rec("B", "b1", "x"))
	if r, s := counterValue(t, run), counterValue(t, skipped); r != 0 || s != 2 {
		t.Fatalf("after A and B: T2 run %v, skipped %v; want 0 and 2", r, s)
	}
	h.process(h.rec("C", "c1", "x"))
	if r := counterValue(t, run); r != 1 {
		t.Fatalf("after C: T2 run %v, want 1 (C completes the instance)", r)
	}
	if s := h.instanceState("chain", "x"); s != "CLOSED" {
		t.Fatalf("instance = %s, want CLOSED", s)
	}
}

// A message can be buffered (its T1 read the processed types before its predecessor's commit)
// while a T2 closes the now complete instance. Its condition holds, so it must still be
// released; the state is built directly, as the race leaves it.
func TestWaitingMessageOfAClosedInstanceIsStillReleased(t *testing.T) {
	h := newHarness(t, chainSet())
	for _, typ := range []string{"A", "B", "C"} {
		h.process(h.rec(typ, typ+"1", "x"))
	}
	if s := h.instanceState("chain", "x"); s != "CLOSED" {
		t.Fatalf("instance = %s, want CLOSED", s)
	}
	late := h.rec("C", "c2", "x")
	headers, err := encodeHeaders(late.Headers)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(context.Background(), `WITH m AS (
  INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, state)
  SELECT id, 'C', $2, 'WAITING' FROM sequence_instance WHERE name = 'chain' AND context_id = $1
  RETURNING id, sequence_instance_id)
INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
SELECT sequence_instance_id, id, $3, $4, $5 FROM m`, late.ContextID, late.IdempotenceID, late.Key, late.Value, headers); err != nil {
		t.Fatal(err)
	}
	res := h.process(h.rec("A", "A1", "x"))
	if res.Outcome != Duplicate || len(res.Released) != 1 || res.Released[0].Record.IdempotenceID != late.IdempotenceID {
		t.Fatalf("duplicate A = %v released %v, want Duplicate releasing the late C", res.Outcome, types(res.Released))
	}
	if s := h.states("C", "c2"); !slices.Equal(s, []string{stateProcessed}) {
		t.Fatalf("late C = %v, want PROCESSED", s)
	}
}
