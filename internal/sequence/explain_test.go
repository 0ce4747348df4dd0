package sequence

import (
	"slices"
	"testing"
	"time"
)

func TestMissingIsWhatTheProcessedTypesDoNotMeetAndNilExactlyWhenTheConditionHolds(t *testing.T) {
	a, b, c, d := Predecessor("A"), Predecessor("B"), Predecessor("C"), Predecessor("D")
	tests := []struct {
		name      string
		cond      Condition
		processed []string
		want      string // "" when nothing is missing
	}{
		{"predecessor missing", a, nil, "A"},
		{"predecessor processed", a, []string{"A"}, ""},
		{"and, one of two processed", And{a, b}, []string{"B"}, "A"},
		{"and, none processed", And{a, b}, nil, "A and B"},
		{"or, none processed", Or{a, b}, nil, "A or B"},
		{"or, one processed", Or{a, b}, []string{"B"}, ""},
		{"and of or, the and's leaf processed", And{a, Or{b, c}}, []string{"A"}, "B or C"},
		{"and of or, the or met", And{a, Or{b, c}}, []string{"C"}, "A"},
		{"or of and, both halves partly met", Or{And{a, b}, And{c, d}}, []string{"A", "D"}, "B or C"},
		{"or of and, one half met", Or{And{a, b}, And{c, d}}, []string{"C", "D"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			processed := map[string]bool{}
			for _, p := range tt.processed {
				processed[p] = true
			}
			m := tt.cond.Missing(processed)
			got := ""
			if m != nil {
				got = m.String()
			}
			if got != tt.want {
				t.Fatalf("Missing = %q; want %q", got, tt.want)
			}
			if (m == nil) != tt.cond.Holds(processed) {
				t.Fatalf("Missing is %v but Holds is %v", m, tt.cond.Holds(processed))
			}
			// What is missing, once processed too, meets the condition.
			if m != nil {
				for _, p := range m.Predecessors() {
					processed[p] = true
				}
				if !tt.cond.Holds(processed) {
					t.Fatalf("processing %v, all that Missing names, does not meet %s", m.Predecessors(), tt.cond)
				}
			}
		})
	}
}

func TestExplainNamesTheMissingPredecessorAndTheProcessedOneWithItsTime(t *testing.T) {
	arrived := time.Date(2026, 12, 2, 7, 39, 0, 0, time.UTC)
	processedAt := time.Date(2026, 12, 2, 7, 40, 0, 0, time.FixedZone("CET", 3600))
	shipped := &MessageType{Type: "OrderShipped", Qualified: "OrderShipped",
		Condition: And{Predecessor("OrderPaid"), Predecessor("OrderValidated.STOCK_AVAILABLE")}}
	tests := []struct {
		name     string
		t        *MessageType
		instance map[string]Presence
		holds    bool
		missing  []string
		text     string
	}{
		{
			name: "one missing, one processed",
			t:    shipped,
			instance: map[string]Presence{
				"OrderValidated.STOCK_AVAILABLE": {State: Processed, ArrivedAt: arrived, Since: processedAt},
				"OrderShipped":                   {State: Waiting, ArrivedAt: arrived, Since: arrived},
			},
			missing: []string{"OrderPaid"},
			text:    "OrderShipped waits for OrderPaid, which has not arrived; OrderValidated.STOCK_AVAILABLE arrived and was processed at 2026-12-02T06:40:00Z.",
		},
		{
			name: "both missing, one waits itself",
			t:    shipped,
			instance: map[string]Presence{
				"OrderPaid": {State: Waiting, ArrivedAt: arrived, Since: arrived},
			},
			missing: []string{"OrderPaid", "OrderValidated.STOCK_AVAILABLE"},
			text:    "OrderShipped waits for OrderPaid and OrderValidated.STOCK_AVAILABLE: OrderPaid arrived at 2026-12-02T07:39:00Z and waits itself, OrderValidated.STOCK_AVAILABLE has not arrived.",
		},
		{
			name: "a failed predecessor",
			t:    &MessageType{Qualified: "OrderPaid", Condition: Predecessor("OrderCreated")},
			instance: map[string]Presence{
				"OrderCreated": {State: Failed, ArrivedAt: arrived, Since: processedAt},
			},
			missing: []string{"OrderCreated"},
			text:    "OrderPaid waits for OrderCreated, which arrived at 2026-12-02T07:39:00Z and its delivery failed at 2026-12-02T06:40:00Z (a retry of its dead letter, or a consume action, delivers it).",
		},
		{
			name:    "either of two",
			t:       &MessageType{Qualified: "Refund", Condition: Or{Predecessor("Paid"), Predecessor("Cancelled")}},
			missing: []string{"Cancelled", "Paid"},
			text:    "Refund waits for Paid or Cancelled: Cancelled has not arrived, Paid has not arrived.",
		},
		{
			name: "the condition holds",
			t:    &MessageType{Qualified: "OrderPaid", Condition: Predecessor("OrderCreated")},
			instance: map[string]Presence{
				"OrderCreated": {State: Processed, ArrivedAt: arrived, Since: arrived},
			},
			holds: true,
			text:  "OrderPaid's release condition OrderCreated holds: the next release of its instance delivers it; OrderCreated arrived and was processed at 2026-12-02T07:39:00Z.",
		},
		{
			name:  "no condition",
			t:     &MessageType{Qualified: "OrderCreated"},
			holds: true,
			text:  "OrderCreated has no release condition: the next release of its instance delivers it.",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex := tt.t.Explain(tt.instance)
			if ex.Holds != tt.holds || !slices.Equal(ex.MissingTypes, tt.missing) || ex.Text != tt.text {
				t.Fatalf("Explain = holds %v, missing %q, text\n  %s\nwant holds %v, missing %q, text\n  %s",
					ex.Holds, ex.MissingTypes, ex.Text, tt.holds, tt.missing, tt.text)
			}
			if tt.t.Condition != nil && ex.Condition != tt.t.Condition.String() {
				t.Fatalf("Condition = %q; want %q", ex.Condition, tt.t.Condition.String())
			}
		})
	}
}

func TestATypeTheSequenceNoLongerDeclaresWaitsForNothing(t *testing.T) {
	s := &Sequence{Name: "order", Types: []*MessageType{{Qualified: "OrderPaid", Condition: Predecessor("OrderCreated")}}}
	if ex := s.Explain("OrderPaid", nil); ex.Holds || ex.Missing != "OrderCreated" {
		t.Fatalf("declared type: %+v", ex)
	}
	ex := s.Explain("OrderRefunded", nil)
	if !ex.Holds || ex.Text != "OrderRefunded is no longer declared in sequence order: no condition holds it back, the next release of its instance delivers it." {
		t.Fatalf("undeclared type: %+v", ex)
	}
}
