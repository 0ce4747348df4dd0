package demo

import (
	"fmt"
	"sort"
	"strings"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// Verdict says whether the run kept the product's promise: every sequenced logical message reached
// the sink exactly once and only after its release condition held; unsequenced messages reached
// it once per consumer group; every poison record went to the dead-letter topic and nothing else.
type Verdict struct {
	// Sequenced counts the sequenced logical messages, Orders the orders they belong to.
	Sequenced, Orders int
	// Unsequenced counts the logical messages delivered without sequencing.
	Unsequenced int
	// Poison counts the poison records.
	Poison int
	// Problems lists every broken promise; empty when the verdict holds.
	Problems []string
}

// Holds reports whether the run kept every promise.
func (v Verdict) Holds() bool { return len(v.Problems) == 0 }

// String is the one-line verdict of the report.
func (v Verdict) String() string {
	if !v.Holds() {
		return fmt.Sprintf("VERDICT: FAILED — %d problem(s): %s", len(v.Problems), strings.Join(v.Problems, "; "))
	}
	return fmt.Sprintf("VERDICT: holds — all %d sequenced messages of %d orders reached the sink exactly once, each after "+
		"its release condition held; %d unsequenced message(s) once per consumer group; %d poison records dead-lettered by each group",
		v.Sequenced, v.Orders, v.Unsequenced, v.Poison)
}

// Check judges a run: the scenario that was sent, what the sink received in arrival order, and
// what the dead-letter topic holds, for the given number of consumer groups that each read every
// record. The order is checked against the declaration's release conditions (Condition.Holds),
// not against a list of expected orders.
func Check(set *sequence.Set, sc *Scenario, deliveries []Delivery, deadLetters []DeadLetter, groups int) Verdict {
	var v Verdict
	problem := func(format string, args ...any) { v.Problems = append(v.Problems, fmt.Sprintf(format, args...)) }

	events := map[string]*Event{}
	for _, e := range sc.Events() {
		events[e.ID] = e
	}
	poison := map[string]bool{}
	sendsOf := map[*Event]int{}
	for _, s := range sc.Sends {
		if s.Poison != nil {
			poison[s.Poison.ID] = true
		} else {
			sendsOf[s.Event]++
		}
	}

	accepted := map[string]int{}
	processed := map[string]map[string]bool{}
	for _, d := range deliveries {
		if d.Problem != "" {
			problem("the sink refused a request from %s: %s", d.Via, d.Problem)
			continue
		}
		if !d.Accepted() {
			continue
		}
		e, known := events[d.ID]
		switch {
		case poison[d.ID]:
			problem("poison record %s reached the sink", d.ID)
			continue
		case !known:
			problem("the sink received %s (ce-id %s), which the scenario never sent", d.Type, d.ID)
			continue
		}
		accepted[d.ID]++
		if e.Test {
			continue
		}
		mt, declared := set.Lookup(e.Qualified())
		if !declared {
			problem("%s %s reached the sink although no sequence declares it", e.OrderID, e.Qualified())
			continue
		}
		if d.Sequence != mt.Sequence.Name || d.ContextID != e.OrderID {
			problem("%s %s reached the sink with sequence %q and context %q, want %q and %q",
				e.OrderID, e.Qualified(), d.Sequence, d.ContextID, mt.Sequence.Name, e.OrderID)
		}
		done := processed[e.OrderID]
		if done == nil {
			done = map[string]bool{}
			processed[e.OrderID] = done
		}
		if mt.Condition != nil && !mt.Condition.Holds(done) {
			problem("%s %s reached the sink before its release condition (%s) held; processed were %s",
				e.OrderID, e.Qualified(), mt.Condition, setString(done))
		}
		done[e.Qualified()] = true
	}

	orders := map[string]bool{}
	for _, e := range sc.Events() {
		want := 1
		if e.Test {
			// A message that is not sequenced bypasses the claim
			// (docs/design.md#records-that-are-not-sequenced): every consumer group that reads its
			// record delivers it.
			want = sendsOf[e] * groups
			v.Unsequenced++
		} else {
			v.Sequenced++
			orders[e.OrderID] = true
		}
		switch got := accepted[e.ID]; {
		case got == 0:
			problem("%s %s (ce-id %s) never reached the sink", e.OrderID, e.Qualified(), e.ID)
		case got != want:
			problem("%s %s (ce-id %s) reached the sink %d times, want %d", e.OrderID, e.Qualified(), e.ID, got, want)
		}
	}
	v.Orders = len(orders)

	dead := map[string]int{}
	for _, dl := range deadLetters {
		if !poison[dl.ID] {
			problem("%s (ce-id %s) went to the dead-letter topic: %s: %s", dl.Type, dl.ID, dl.Reason, dl.Message)
			continue
		}
		dead[dl.ID]++
	}
	v.Poison = len(poison)
	for _, id := range sortedKeys(poison) {
		if dead[id] != groups {
			problem("poison record %s is %d times in the dead-letter topic, want %d (once per consumer group)", id, dead[id], groups)
		}
	}
	return v
}

func setString(set map[string]bool) string {
	if len(set) == 0 {
		return "none"
	}
	return strings.Join(sortedKeys(set), ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
