package inbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// orderSet is the sample's order sequence: OrderShipped waits for OrderPaid and the validation.
func orderSet() *sequence.Set {
	return sequence.NewSet([]*sequence.Sequence{
		seqOf("order",
			mt("OrderCreated", "", nil),
			mt("OrderValidated", "STOCK_AVAILABLE", sequence.Predecessor("OrderCreated")),
			mt("OrderPaid", "", sequence.Predecessor("OrderCreated")),
			mt("OrderShipped", "", sequence.And{sequence.Predecessor("OrderPaid"), sequence.Predecessor("OrderValidated.STOCK_AVAILABLE")}),
		),
		seqOf("refund", mt("RefundRequested", "", nil), mt("RefundPaid", "", sequence.Predecessor("RefundRequested"))),
	})
}

// rowsOf is every row of the engine's tables that belong to the test, as text, to prove that
// inspect changes none.
func (h *harness) rowsOf() []string {
	h.t.Helper()
	var all []string
	for _, sql := range []string{
		`SELECT i::text FROM sequence_instance i WHERE context_id LIKE $1 || '%' ORDER BY id`,
		`SELECT m::text FROM sequenced_message m WHERE idempotence_id LIKE $1 || '%' ORDER BY id`,
		`SELECT c::text FROM sequential_inbox_idempotence c WHERE idempotence_id LIKE $1 || '%' ORDER BY 1`,
		`SELECT b::text FROM buffered_message b JOIN sequenced_message m ON m.id = b.sequenced_message_id
		 WHERE m.idempotence_id LIKE $1 || '%' ORDER BY b.id`,
	} {
		rows, err := h.pool.Query(context.Background(), sql, h.prefix)
		if err != nil {
			h.t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			h.t.Fatal(err)
		}
		all = append(all, got...)
	}
	return all
}

// stateChangedAt reads when a message reached its state, as the database stored it.
func (h *harness) stateChangedAt(qualified, idem string) time.Time {
	h.t.Helper()
	var at time.Time
	if err := h.pool.QueryRow(context.Background(), `SELECT state_changed_at FROM sequenced_message
		WHERE message_type = $1 AND idempotence_id = $2`, qualified, h.prefix+idem).Scan(&at); err != nil {
		h.t.Fatal(err)
	}
	return at
}

func TestInspectNamesTheMissingPredecessorAndTheProcessedOneWithItsTimeAndChangesNothing(t *testing.T) {
	set := orderSet()
	h := newHarness(t, set)
	h.process(h.rec("OrderCreated", "created", "42"))
	h.process(h.rec("OrderValidated.STOCK_AVAILABLE", "validated", "42"))
	if res := h.process(h.rec("OrderShipped", "shipped", "42")); res.Outcome != Buffered {
		t.Fatalf("OrderShipped: %s; want Buffered", res.Outcome)
	}
	// A historical duplicate row of OrderCreated: the PROCESSED one stands for it.
	if _, err := h.pool.Exec(context.Background(), `INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, state)
		SELECT sequence_instance_id, message_type, idempotence_id, 'FAILED' FROM sequenced_message
		WHERE message_type = 'OrderCreated' AND idempotence_id = $1`, h.prefix+"created"); err != nil {
		t.Fatal(err)
	}
	before := h.rowsOf()

	in, err := Inspect(context.Background(), h.pool, set, InspectQuery{ContextID: h.ctxID("42")})
	if err != nil {
		t.Fatal(err)
	}
	if i := in.Instance; i.Sequence != "order" || i.ContextID != h.ctxID("42") || i.State != "OPEN" || !i.Declared ||
		i.ClosedAt != nil || i.RemoveAfter != nil || !i.RetainUntil.Equal(h.clock.Now().Add(time.Hour)) ||
		!slices.Equal(i.Missing, []string{"OrderPaid", "OrderShipped"}) {
		t.Fatalf("instance: %+v", i)
	}
	var got []string
	for _, m := range in.Messages {
		got = append(got, m.Type+"/"+strings.TrimPrefix(m.IdempotenceID, h.prefix)+" "+m.State)
	}
	if want := []string{"OrderCreated/created PROCESSED", "OrderValidated.STOCK_AVAILABLE/validated PROCESSED", "OrderShipped/shipped WAITING"}; !slices.Equal(got, want) {
		t.Fatalf("messages %q; want %q in the order they arrived", got, want)
	}
	created, shipped := in.Messages[0], in.Messages[2]
	if created.Rows != 2 || !created.Claimed || created.Waits != nil || created.Topic != "orders" || created.Partition == nil || *created.Partition != 1 ||
		created.Offset == nil || *created.Offset != 42 {
		t.Fatalf("OrderCreated: %+v; want 2 rows, claimed, no explanation, read from orders[1]@42", created)
	}
	w := shipped.Waits
	if w == nil || w.Holds || !slices.Equal(w.MissingTypes, []string{"OrderPaid"}) || w.Condition != "OrderPaid and OrderValidated.STOCK_AVAILABLE" {
		t.Fatalf("OrderShipped waits: %+v; want it missing OrderPaid", w)
	}
	validatedAt := h.stateChangedAt("OrderValidated.STOCK_AVAILABLE", "validated").UTC().Format(time.RFC3339)
	if want := "OrderShipped waits for OrderPaid, which has not arrived; OrderValidated.STOCK_AVAILABLE arrived and was processed at " + validatedAt + "."; w.Text != want {
		t.Fatalf("OrderShipped waits:\n  %s\nwant\n  %s", w.Text, want)
	}
	if after := h.rowsOf(); !slices.Equal(before, after) {
		t.Fatalf("inspect changed rows:\nbefore %q\nafter  %q", before, after)
	}

	// One message, found by type and ID, with its instance.
	one, err := Inspect(context.Background(), h.pool, set, InspectQuery{MessageType: "OrderShipped", IdempotenceID: h.prefix + "shipped"})
	if err != nil {
		t.Fatal(err)
	}
	if one.Instance.ContextID != h.ctxID("42") || len(one.Messages) != 1 || one.Messages[0].Waits == nil || one.Messages[0].Waits.Text != w.Text {
		t.Fatalf("--message: %+v", one)
	}
	// When the predecessor arrives, the message is released: nothing waits any more.
	h.process(h.rec("OrderPaid", "paid", "42"))
	done, err := Inspect(context.Background(), h.pool, set, InspectQuery{ContextID: h.ctxID("42"), Sequence: "order"})
	if err != nil {
		t.Fatal(err)
	}
	if done.Instance.State != "CLOSED" || done.Instance.ClosedAt == nil || done.Instance.RemoveAfter == nil || len(done.Instance.Missing) != 0 {
		t.Fatalf("after OrderPaid the instance is %+v; want closed", done.Instance)
	}
	for _, m := range done.Messages {
		if m.State != "PROCESSED" || m.Waits != nil {
			t.Fatalf("after OrderPaid: %+v; want every message PROCESSED", m)
		}
	}
}

func TestInspectOfNothingSaysWhatIsMissing(t *testing.T) {
	set := orderSet()
	h := newHarness(t, set)
	h.process(h.rec("OrderPaid", "paid", "7"))
	h.process(h.rec("RefundRequested", "refund", "7"))
	ctx := context.Background()
	tests := []struct {
		name string
		q    InspectQuery
		want error
		text string
	}{
		{"unknown context", InspectQuery{ContextID: h.ctxID("8")}, ErrNoInstance, "inspect context " + h.ctxID("8") + ": no sequence instance"},
		{"no instance in the sequence", InspectQuery{ContextID: h.ctxID("42"), Sequence: "refund"}, ErrNoInstance, ""},
		{"instances in two sequences", InspectQuery{ContextID: h.ctxID("7")}, ErrAmbiguousContext, "(order, refund)"},
		{"unknown message", InspectQuery{MessageType: "OrderPaid", IdempotenceID: h.prefix + "nope"}, ErrNoMessage, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Inspect(ctx, h.pool, set, tt.q)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("err = %v; want %v with %q", err, tt.want, tt.text)
			}
		})
	}
	// The message of another instance than --context names is refused, naming its own.
	_, err := Inspect(ctx, h.pool, set, InspectQuery{ContextID: h.ctxID("8"), MessageType: "OrderPaid", IdempotenceID: h.prefix + "paid"})
	if err == nil || !strings.Contains(err.Error(), "belongs to instance order/"+h.ctxID("7")) {
		t.Fatalf("message of another context: %v", err)
	}
	// A message without raw record is inspected as any other: inspect never reads a payload.
	if _, err := h.pool.Exec(ctx, `DELETE FROM buffered_message b USING sequenced_message m
		WHERE m.id = b.sequenced_message_id AND m.idempotence_id = $1`, h.prefix+"paid"); err != nil {
		t.Fatal(err)
	}
	in, err := Inspect(ctx, h.pool, set, InspectQuery{ContextID: h.ctxID("7"), Sequence: "order"})
	if err != nil || in.Messages[0].Waits == nil || in.Messages[0].Waits.Text != "OrderPaid waits for OrderCreated, which has not arrived." {
		t.Fatalf("order/7: %+v, %v", in, err)
	}
}
