package inbox

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// recOfType is h.rec for a type that may contain dots: type and subtype given apart.
func (h *harness) recOfType(typ, subtype, idem, contextID string) Record {
	r := h.rec(typ, idem, contextID)
	r.Type, r.Subtype = typ, subtype
	return r
}

// storedTypes lists the message_type of the stored rows of a context, oldest first.
func (h *harness) storedTypes(table, contextID string) []string {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `SELECT t.message_type FROM `+table+` t
		JOIN sequence_instance i ON i.id = t.sequence_instance_id WHERE i.context_id = $1 ORDER BY t.message_type`, h.ctxID(contextID))
	if err != nil {
		h.t.Fatal(err)
	}
	types, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatal(err)
	}
	return types
}

// TestNamesStoredBeforeTypesCouldContainDotsKeepTheirMeaning writes claims and messages with the
// declaration of a release whose types had no dots (OrderCreated processed, the subtyped
// OrderValidated.STOCK_AVAILABLE buffered), checks that they are stored under exactly the names
// that release wrote, and then runs a new engine whose declaration adds a CloudEvents type with
// dots on the same migrated database: the old claim still recognises a duplicate, the old
// buffered message is released as type and subtype once its predecessor comes, and the dotted
// type after it; the instance closes. No name was rewritten.
func TestNamesStoredBeforeTypesCouldContainDotsKeepTheirMeaning(t *testing.T) {
	oldTypes := func() []*sequence.MessageType {
		return []*sequence.MessageType{
			mt("OrderCreated", "", nil),
			mt("OrderPaid", "", sequence.Predecessor("OrderCreated")),
			mt("OrderValidated", "STOCK_AVAILABLE", sequence.Predecessor("OrderPaid")),
		}
	}
	before := newHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("order", oldTypes()...)}))
	if res := before.process(before.rec("OrderCreated", "created", "o1")); res.Outcome != Delivered {
		t.Fatalf("OrderCreated: %v, want Delivered", res.Outcome)
	}
	if res := before.process(before.recOfType("OrderValidated", "STOCK_AVAILABLE", "validated", "o1")); res.Outcome != Buffered {
		t.Fatalf("OrderValidated.STOCK_AVAILABLE: %v, want Buffered", res.Outcome)
	}
	stored := []string{"OrderCreated", "OrderValidated.STOCK_AVAILABLE"}
	for _, table := range []string{"sequenced_message", "sequential_inbox_idempotence"} {
		if got := before.storedTypes(table, "o1"); !slices.Equal(got, stored) {
			t.Fatalf("%s holds %v, want the names the previous release wrote: %v", table, got, stored)
		}
	}

	const shipped = "com.example.order.shipped"
	after := newHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("order",
		append(oldTypes(), mt(shipped, "", sequence.Predecessor("OrderValidated.STOCK_AVAILABLE")))...)}))
	after.prefix = before.prefix

	if res := after.process(after.rec("OrderCreated", "created", "o1")); res.Outcome != Duplicate {
		t.Errorf("a resend of OrderCreated: %v, want Duplicate (its claim was written under the old name)", res.Outcome)
	}
	if res := after.process(after.recOfType(shipped, "", "shipped", "o1")); res.Outcome != Buffered {
		t.Fatalf("%s: %v, want Buffered behind OrderValidated.STOCK_AVAILABLE", shipped, res.Outcome)
	}
	res := after.process(after.rec("OrderPaid", "paid", "o1"))
	if res.Outcome != Delivered {
		t.Fatalf("OrderPaid: %v, want Delivered", res.Outcome)
	}
	var released [][2]string
	for _, m := range res.Released {
		released = append(released, [2]string{m.Record.Type, m.Record.Subtype})
	}
	if want := [][2]string{{"OrderValidated", "STOCK_AVAILABLE"}, {shipped, ""}}; !slices.Equal(released, want) {
		t.Errorf("OrderPaid released (type, subtype) %v, want %v", released, want)
	}
	if got, want := after.listener.deliveredTypes(after.ctxID("o1")), []string{"OrderPaid", "OrderValidated.STOCK_AVAILABLE", shipped}; !slices.Equal(got, want) {
		t.Errorf("the new engine delivered %v, want %v", got, want)
	}
	if n := before.listener.callCount(); n != 1 {
		t.Errorf("the old engine's listener was called %d times, want once (OrderCreated)", n)
	}
	if s := after.instanceState("order", "o1"); s != "CLOSED" {
		t.Errorf("instance is %q, want CLOSED: every declared type was processed", s)
	}
	want := []string{"OrderCreated", "OrderPaid", "OrderValidated.STOCK_AVAILABLE", shipped}
	if got := after.storedTypes("sequenced_message", "o1"); !slices.Equal(got, want) {
		t.Errorf("sequenced_message holds %v, want %v", got, want)
	}
}

// TestDottedTypesAreClaimedAndReleasedUnderTheirFullName sequences CloudEvents types with dots,
// one of them with a subtype, out of order through the engine: each is claimed under its full
// qualified name, buffered until its predecessor was processed, and released with its type and
// subtype intact; a resend is a duplicate.
func TestDottedTypesAreClaimedAndReleasedUnderTheirFullName(t *testing.T) {
	const (
		created   = "com.example.order.created"
		validated = "com.example.order.validated"
	)
	h := newHarness(t, sequence.NewSet([]*sequence.Sequence{seqOf("order",
		mt(created, "", nil),
		mt(validated, "OK", sequence.Predecessor(created)),
		mt("com.example.order", "archived", sequence.Predecessor(validated+".OK")),
	)}))
	if res := h.process(h.recOfType("com.example.order", "archived", "archived", "o1")); res.Outcome != Buffered {
		t.Fatalf("com.example.order.archived: %v, want Buffered", res.Outcome)
	}
	if res := h.process(h.recOfType(validated, "OK", "validated", "o1")); res.Outcome != Buffered {
		t.Fatalf("%s.OK: %v, want Buffered", validated, res.Outcome)
	}
	res := h.process(h.recOfType(created, "", "created", "o1"))
	if res.Outcome != Delivered || len(res.Released) != 2 {
		t.Fatalf("%s: %v releasing %d, want Delivered releasing 2", created, res.Outcome, len(res.Released))
	}
	if r := res.Released[0].Record; r.Type != validated || r.Subtype != "OK" {
		t.Errorf("released first as type %q subtype %q, want %s and OK", r.Type, r.Subtype, validated)
	}
	if r := res.Released[1].Record; r.Type != "com.example.order" || r.Subtype != "archived" {
		t.Errorf("released second as type %q subtype %q, want com.example.order and archived", r.Type, r.Subtype)
	}
	want := []string{created, validated + ".OK", "com.example.order.archived"}
	if got := h.listener.deliveredTypes(h.ctxID("o1")); !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
	if n := h.claims(validated+".OK", "validated"); n != 1 {
		t.Errorf("%d claims of %s.OK, want 1", n, validated)
	}
	if res := h.process(h.recOfType(validated, "OK", "validated", "o1")); res.Outcome != Duplicate {
		t.Errorf("a resend of %s.OK: %v, want Duplicate", validated, res.Outcome)
	}
	if s := h.instanceState("order", "o1"); s != "CLOSED" {
		t.Errorf("instance is %q, want CLOSED", s)
	}
}
