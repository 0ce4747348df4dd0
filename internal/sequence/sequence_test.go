package sequence

import "testing"

// seq builds a sequence from qualified types and their conditions (nil: released at once).
func seq(types map[string]Condition, order ...string) *Sequence {
	s := &Sequence{Name: "s"}
	for _, q := range order {
		s.Types = append(s.Types, &MessageType{Type: q, Qualified: q, Condition: types[q]})
	}
	return s
}

func TestLongestChainCountsEveryMessageOneRecordCanRelease(t *testing.T) {
	tests := []struct {
		name  string
		types map[string]Condition
		order []string
		want  int
	}{
		{"one type", map[string]Condition{"A": nil}, []string{"A"}, 1},
		{"independent types", map[string]Condition{"A": nil, "B": nil}, []string{"A", "B"}, 1},
		{"chain", map[string]Condition{"A": nil, "B": Predecessor("A"), "C": Predecessor("B")}, []string{"C", "B", "A"}, 3},
		{
			// A late A releases B, C and D in the same release transaction: four listener calls.
			"fan-out",
			map[string]Condition{"A": nil, "B": Predecessor("A"), "C": Predecessor("A"), "D": Predecessor("A")},
			[]string{"A", "B", "C", "D"}, 4,
		},
		{
			"diamond",
			map[string]Condition{"A": nil, "B": Predecessor("A"), "C": Predecessor("A"), "D": And{Predecessor("B"), Predecessor("C")}},
			[]string{"A", "B", "C", "D"}, 4,
		},
		{
			// The order sample: OrderCreated releases all four others.
			"order sample",
			map[string]Condition{
				"Created":   nil,
				"Validated": Predecessor("Created"),
				"Paid":      Predecessor("Created"),
				"Shipped":   And{Predecessor("Paid"), Predecessor("Validated")},
				"Delivered": Predecessor("Shipped"),
			},
			[]string{"Created", "Validated", "Paid", "Shipped", "Delivered"}, 5,
		},
		{
			// Either predecessor may be the one that releases C, so both count as a path.
			"or",
			map[string]Condition{"A": nil, "B": nil, "C": Or{Predecessor("A"), Predecessor("B")}, "D": Predecessor("C")},
			[]string{"A", "B", "C", "D"}, 3,
		},
		{
			"two roots, the larger wins",
			map[string]Condition{"A": nil, "B": Predecessor("A"), "X": nil, "Y": Predecessor("X"), "Z": Predecessor("X")},
			[]string{"A", "B", "X", "Y", "Z"}, 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := seq(tt.types, tt.order...).LongestChain(); got != tt.want {
				t.Errorf("LongestChain = %d, want %d", got, tt.want)
			}
		})
	}
}
