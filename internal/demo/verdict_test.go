package demo

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// inOrder returns what a correct run delivers: per order, each sequenced event once, always one
// whose release condition holds; each unsequenced event once per group; each poison record in
// the dead-letter topic once per group.
func inOrder(t *testing.T, set *sequence.Set, sc *Scenario, groups int) ([]Delivery, []DeadLetter) {
	t.Helper()
	var out []Delivery
	deliver := func(e *Event) {
		d := Delivery{ID: e.ID, Type: e.Type, OrderID: e.OrderID, Status: http.StatusNoContent}
		if !e.Test {
			mt, _ := set.Lookup(e.Qualified())
			d.Sequence, d.ContextID = mt.Sequence.Name, e.OrderID
		}
		out = append(out, d)
	}
	pending := map[string][]*Event{}
	var orders []string
	for _, e := range sc.Events() {
		if e.Test {
			for range groups {
				deliver(e)
			}
			continue
		}
		if _, seen := pending[e.OrderID]; !seen {
			orders = append(orders, e.OrderID)
		}
		pending[e.OrderID] = append(pending[e.OrderID], e)
	}
	for _, order := range orders {
		processed := map[string]bool{}
		for left := pending[order]; len(left) > 0; {
			i := slices.IndexFunc(left, func(e *Event) bool {
				mt, ok := set.Lookup(e.Qualified())
				return ok && (mt.Condition == nil || mt.Condition.Holds(processed))
			})
			if i < 0 {
				t.Fatalf("%s: no releasable event among %d left; the scenario cannot complete", order, len(left))
			}
			deliver(left[i])
			processed[left[i].Qualified()] = true
			left = slices.Delete(slices.Clone(left), i, i+1)
		}
	}
	var dead []DeadLetter
	for i, s := range sc.Sends {
		if s.Poison != nil {
			for range groups {
				dead = append(dead, DeadLetter{ID: s.Poison.ID, Type: typeOf(s.Poison), Reason: "InvalidJSON",
					Origin: fmt.Sprintf("%s[%d]@%d", sc.Topic, s.Partition, i)})
			}
		}
	}
	return out, dead
}

func indexOf(ds []Delivery, id string) int {
	return slices.IndexFunc(ds, func(d Delivery) bool { return d.ID == id })
}

func TestCheckJudgesSinkOrderAgainstTheReleaseConditions(t *testing.T) {
	_, set := sample(t)
	sc := OrderScenario("orders")
	const groups = 2

	cases := []struct {
		name string
		// mutate turns a correct run into the case's run.
		mutate func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter)
		// problem is a part of the one expected problem; empty: the verdict holds.
		problem string
	}{
		{name: "every message once, each after its condition", mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
			return ds, dead
		}},
		{name: "a rejected attempt before the accepted one does not count", mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
			i := indexOf(ds, sc.RejectOnce)
			rejected := ds[i]
			rejected.Status = http.StatusInternalServerError
			return slices.Insert(ds, i, rejected), dead
		}},
		{name: "shipped before paid", problem: "order-1003 OrderShipped reached the sink before its release condition (OrderPaid and OrderValidated.STOCK_AVAILABLE) held",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				shipped := ds[indexOf(ds, "evt-1003-shipped")]
				ds = slices.Delete(ds, indexOf(ds, "evt-1003-shipped"), indexOf(ds, "evt-1003-shipped")+1)
				return slices.Insert(ds, indexOf(ds, "evt-1003-created")+1, shipped), dead
			}},
		{name: "a duplicate reached the sink", problem: "order-1002 OrderPaid (ce-id evt-1002-paid) reached the sink 2 times, want 1",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				return append(ds, ds[indexOf(ds, "evt-1002-paid")]), dead
			}},
		{name: "a message never arrived", problem: "order-1001 OrderDelivered (ce-id evt-1001-delivered) never reached the sink",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				i := indexOf(ds, "evt-1001-delivered")
				return slices.Delete(ds, i, i+1), dead
			}},
		{name: "the test order reached only one consumer group's delivery", problem: "order-9001 OrderCreated (ce-id evt-9001-created) reached the sink 1 times, want 2",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				i := indexOf(ds, "evt-9001-created")
				return slices.Delete(ds, i, i+1), dead
			}},
		{name: "wrong sequence context header", problem: `with sequence "order" and context "order-1002"`,
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				ds[indexOf(ds, "evt-1001-paid")].ContextID = "order-1002"
				return ds, dead
			}},
		{name: "a malformed request", problem: "the sink refused a request from consumer-b",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				return append(ds, Delivery{Via: "consumer-b", ID: "x", Status: http.StatusBadRequest, Problem: "ce-specversion is \"\""}), dead
			}},
		{name: "a poison record reached the sink", problem: "poison record evt-1005-paid reached the sink",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				return append(ds, Delivery{ID: "evt-1005-paid", Type: "OrderPaid", Status: http.StatusOK}), dead
			}},
		{name: "a poison record is missing from the dead-letter topic", problem: "poison record evt-1004-validated is 1 times in the dead-letter topic, want 2",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				i := slices.IndexFunc(dead, func(d DeadLetter) bool { return d.ID == "evt-1004-validated" })
				return ds, slices.Delete(dead, i, i+1)
			}},
		{name: "a good message was dead-lettered", problem: "OrderPaid (ce-id evt-1002-paid) went to the dead-letter topic: Failed: sink down",
			mutate: func(ds []Delivery, dead []DeadLetter) ([]Delivery, []DeadLetter) {
				return ds, append(dead, DeadLetter{ID: "evt-1002-paid", Type: "OrderPaid", Reason: "Failed", Message: "sink down"})
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ds, dead := inOrder(t, set, sc, groups)
			ds, dead = tc.mutate(ds, dead)
			v := Check(set, sc, ds, dead, groups)
			if tc.problem == "" {
				if !v.Holds() {
					t.Fatalf("verdict fails on a correct run: %v", v.Problems)
				}
				if v.Sequenced != 16 || v.Orders != 4 || v.Unsequenced != 1 {
					t.Errorf("counted %d sequenced messages of %d orders and %d unsequenced, want 16, 4 and 1", v.Sequenced, v.Orders, v.Unsequenced)
				}
				return
			}
			if v.Holds() {
				t.Fatalf("verdict holds, want the problem %q", tc.problem)
			}
			if len(v.Problems) != 1 || !strings.Contains(v.Problems[0], tc.problem) {
				t.Fatalf("problems = %q, want exactly one containing %q", v.Problems, tc.problem)
			}
			if !strings.HasPrefix(v.String(), "VERDICT: FAILED") {
				t.Errorf("verdict line %q does not say FAILED", v.String())
			}
		})
	}
}

func TestScenarioReleaseOrderDiffersFromSendOrder(t *testing.T) {
	_, set := sample(t)
	sc := OrderScenario("orders")
	ds, _ := inOrder(t, set, sc, 2)
	var sent, released []string
	for _, s := range sc.Sends {
		if s.Event != nil && s.Event.OrderID == orderReversed {
			sent = append(sent, s.Event.Qualified())
		}
	}
	for _, d := range ds {
		if d.OrderID == orderReversed {
			released = append(released, eventByID(sc, d.ID).Qualified())
		}
	}
	if sent[0] != "OrderDelivered" || released[0] != "OrderCreated" || released[len(released)-1] != "OrderDelivered" {
		t.Fatalf("%s is sent %v and released %v; the demo must show an order that arrives reversed", orderReversed, sent, released)
	}
}
