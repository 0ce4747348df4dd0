package demo

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ConsumerStats are the claim-engine counters one consumer reported, in the order of Counters.
type ConsumerStats struct {
	Name, Group string
	Values      []float64
}

// Report is what a demo run observed and how it is judged.
type Report struct {
	Scenario *Scenario
	// Counters are the rows of the claim-engine table, Consumers their values per consumer.
	Counters  []Counter
	Consumers []ConsumerStats
	// Deliveries are the sink's requests in arrival order.
	Deliveries []Delivery
	// Database is the temporary database the run created and dropped.
	Database string
	// DeadLetterTopic and DeadLetters are what the dead-letter topic holds after the run.
	DeadLetterTopic string
	DeadLetters     []DeadLetter
	Verdict         Verdict
	// Elapsed is the time from the start of the run to the verdict.
	Elapsed time.Duration
}

// Write renders the report for a person.
func (r *Report) Write(w io.Writer) error {
	var b strings.Builder
	r.writeOrders(&b)
	r.writeSink(&b)
	r.writeEngine(&b)
	r.writeDeadLetters(&b)
	fmt.Fprintf(&b, "\n%s\n(the run took %.1fs)\n", r.Verdict, r.Elapsed.Seconds())
	_, err := io.WriteString(w, b.String())
	return err
}

// writeOrders shows, per order, what was sent (each logical message once, in production order)
// and the order in which the sink accepted it.
func (r *Report) writeOrders(b *strings.Builder) {
	b.WriteString("\nOrders: what was sent, and what the sink accepted, in arrival order\n")
	var orders []string
	sent := map[string][]string{}
	sends := map[*Event]int{}
	for _, s := range r.Scenario.Sends {
		if s.Event != nil {
			sends[s.Event]++
		}
	}
	listed := map[*Event]bool{}
	for _, s := range r.Scenario.Sends {
		var order, label string
		switch {
		case s.Poison != nil:
			order, label = s.Poison.OrderID, "✗"+typeOf(s.Poison)
		case listed[s.Event]:
			continue
		default:
			listed[s.Event] = true
			order, label = s.Event.OrderID, s.Event.Qualified()
			if n := sends[s.Event]; n > 1 {
				label += fmt.Sprintf("×%d", n)
			}
		}
		if _, seen := sent[order]; !seen {
			orders = append(orders, order)
		}
		sent[order] = append(sent[order], label)
	}
	received := map[string][]string{}
	failed := map[string][]string{}
	for _, d := range r.Deliveries {
		switch {
		case d.OrderID == "":
		case !d.Accepted():
			failed[d.ID] = append(failed[d.ID], strconv.Itoa(d.Status))
		default:
			label := qualifiedOf(r.Scenario, d)
			if f := failed[d.ID]; len(f) > 0 {
				label += " (after a " + strings.Join(f, ", ") + ")"
				delete(failed, d.ID)
			}
			received[d.OrderID] = append(received[d.OrderID], label)
		}
	}
	sort.Strings(orders)
	for _, order := range orders {
		got, sep, sentNote, receivedNote := received[order], " → ", "", ""
		if e := firstEvent(r.Scenario, order); e != nil && e.Test {
			sep = ", "
			sentNote = "   (a test order: the filter says do not sequence)"
			receivedNote = "   (once per consumer group: an unsequenced message bypasses the claim)"
		}
		fmt.Fprintf(b, "  %-11s sent      %s%s\n", order, strings.Join(sent[order], "  "), sentNote)
		line := "(nothing)"
		if len(got) > 0 {
			line = strings.Join(got, sep) + receivedNote
		}
		fmt.Fprintf(b, "  %-11s received  %s\n", "", line)
	}
	b.WriteString("  ×2: sent twice (a duplicate, also on another partition); ✗: a poison record\n")
}

// writeSink summarizes the sink's answers.
func (r *Report) writeSink(b *strings.Builder) {
	accepted, rejected, refused := 0, []string{}, 0
	for _, d := range r.Deliveries {
		switch {
		case d.Accepted():
			accepted++
		case d.Problem != "":
			refused++
		default:
			rejected = append(rejected, fmt.Sprintf("%s %s answered %d", d.OrderID, d.ID, d.Status))
		}
	}
	fmt.Fprintf(b, "\nSink (the demo's order service): %d requests, %d accepted", len(r.Deliveries), accepted)
	if len(rejected) > 0 {
		fmt.Fprintf(b, ", %s (the consumer retried)", strings.Join(rejected, ", "))
	}
	if refused > 0 {
		fmt.Fprintf(b, ", %d refused as malformed", refused)
	}
	b.WriteString("\n")
}

// writeEngine prints the claim-engine counters of each consumer and their total.
func (r *Report) writeEngine(b *strings.Builder) {
	b.WriteString("\nClaim engine (Prometheus metrics of each consumer; every record reaches both consumer groups)\n")
	labelWidth := 0
	for _, c := range r.Counters {
		labelWidth = max(labelWidth, utf8.RuneCountInString(c.Label))
	}
	fmt.Fprintf(b, "  %-*s", labelWidth, "")
	for _, c := range r.Consumers {
		fmt.Fprintf(b, "%12s", c.Name)
	}
	fmt.Fprintf(b, "%8s\n", "total")
	for i, counter := range r.Counters {
		fmt.Fprintf(b, "  %-*s", labelWidth, counter.Label)
		var total float64
		for _, c := range r.Consumers {
			fmt.Fprintf(b, "%12g", c.Values[i])
			total += c.Values[i]
		}
		fmt.Fprintf(b, "%8g\n", total)
	}
}

// writeDeadLetters lists the dead-letter topic, one line per distinct record and reason.
func (r *Report) writeDeadLetters(b *strings.Builder) {
	fmt.Fprintf(b, "\nDead-letter topic %s: %d records\n", r.DeadLetterTopic, len(r.DeadLetters))
	type key struct{ id, typ, reason, message, origin string }
	var keys []key
	count := map[key]int{}
	for _, dl := range r.DeadLetters {
		k := key{dl.ID, dl.Type, dl.Reason, dl.Message, dl.Origin}
		if count[k] == 0 {
			keys = append(keys, k)
		}
		count[k]++
	}
	for _, k := range keys {
		why := ""
		if p := poisonByID(r.Scenario, k.id); p != nil {
			why = " — " + p.Why
		}
		// The message may repeat the reason as its prefix; say it once.
		message := strings.TrimPrefix(k.message, k.reason+": ")
		fmt.Fprintf(b, "  %s %s from %s ×%d%s\n      %s: %s\n", k.typ, k.id, k.origin, count[k], why, k.reason, message)
	}
}

func typeOf(p *Poison) string {
	for _, h := range p.Headers {
		if h.Key == "ce_type" {
			return string(h.Value)
		}
	}
	return "record"
}

func qualifiedOf(sc *Scenario, d Delivery) string {
	if e := eventByID(sc, d.ID); e != nil {
		return e.Qualified()
	}
	return d.Type + "(?)"
}

func eventByID(sc *Scenario, id string) *Event {
	for _, e := range sc.Events() {
		if e.ID == id {
			return e
		}
	}
	return nil
}

func firstEvent(sc *Scenario, order string) *Event {
	for _, e := range sc.Events() {
		if e.OrderID == order {
			return e
		}
	}
	return nil
}

func poisonByID(sc *Scenario, id string) *Poison {
	for _, s := range sc.Sends {
		if s.Poison != nil && s.Poison.ID == id {
			return s.Poison
		}
	}
	return nil
}
