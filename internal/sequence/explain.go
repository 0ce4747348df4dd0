package sequence

import (
	"strings"
	"time"
)

// PresenceState is how far the messages of one qualified type got in a sequence instance, as a
// release condition sees them: only Processed counts towards a condition.
type PresenceState int

const (
	// Absent means no message of the type has arrived in the instance.
	Absent PresenceState = iota
	// Failed means a message of the type arrived and its delivery failed; its claim was dropped, so a
	// resend or a CONSUME can still deliver it.
	Failed
	// Waiting means a message of the type arrived and waits for its own predecessors.
	Waiting
	// Processed means a message of the type was delivered (or expired); conditions that name the type
	// count it as met.
	Processed
)

// Presence is what an instance holds of one qualified type: the most advanced state of its
// messages, when the first of them arrived, and since when that state holds.
type Presence struct {
	State PresenceState
	// ArrivedAt is when the first message of the type was stored in the instance.
	ArrivedAt time.Time
	// Since is when the type reached State (for Processed: when the first of them was processed).
	Since time.Time
}

// Explanation says whether a message of a type may be released in an instance, and why not.
type Explanation struct {
	// Condition is the type's release condition, "" when it has none.
	Condition string
	// Holds is true when the condition is met (or there is none): the next release delivers it.
	Holds bool
	// Missing is the part of the condition that is not met yet (Condition.Missing), "" when it holds.
	Missing string
	// MissingTypes are the predecessors that Missing names, sorted.
	MissingTypes []string
	// Text says all of it in words, for a person.
	Text string
}

// Explain says in words whether and why a message of type t waits in an instance that holds
// instance (by qualified type): its release condition, what of it is missing, and for each
// predecessor it names whether it has not arrived, waits itself, failed or was processed and
// when. It decides with the condition's own Holds and Missing, as the release does.
func (t *MessageType) Explain(instance map[string]Presence) Explanation {
	if t.Condition == nil {
		return Explanation{Holds: true, Text: t.Qualified + " has no release condition: the next release of its instance delivers it."}
	}
	processed := map[string]bool{}
	for typ, p := range instance {
		if p.State == Processed {
			processed[typ] = true
		}
	}
	ex := Explanation{Condition: t.Condition.String()}
	missing := t.Condition.Missing(processed)
	var done []string
	for _, p := range t.Condition.Predecessors() {
		if processed[p] {
			done = append(done, p+" "+describe(instance[p]))
		}
	}
	if missing == nil {
		ex.Holds = true
		ex.Text = t.Qualified + "'s release condition " + ex.Condition + " holds: the next release of its instance delivers it"
		if len(done) > 0 {
			ex.Text += "; " + strings.Join(done, "; ")
		}
		ex.Text += "."
		return ex
	}
	ex.Missing, ex.MissingTypes = missing.String(), missing.Predecessors()
	var b strings.Builder
	b.WriteString(t.Qualified + " waits for " + ex.Missing)
	if p, single := missing.(Predecessor); single {
		b.WriteString(", which " + describe(instance[string(p)]))
	} else {
		parts := make([]string, len(ex.MissingTypes))
		for i, p := range ex.MissingTypes {
			parts[i] = p + " " + describe(instance[p])
		}
		b.WriteString(": " + strings.Join(parts, ", "))
	}
	for _, d := range done {
		b.WriteString("; " + d)
	}
	b.WriteString(".")
	ex.Text = b.String()
	return ex
}

// Explain is MessageType.Explain for the qualified type in the sequence. A type the sequence no
// longer declares has no condition left to wait for: the release delivers it, and so says this.
func (s *Sequence) Explain(qualified string, instance map[string]Presence) Explanation {
	for _, t := range s.Types {
		if t.Qualified == qualified {
			return t.Explain(instance)
		}
	}
	return Explanation{Holds: true, Text: qualified + " is no longer declared in sequence " + s.Name +
		": no condition holds it back, the next release of its instance delivers it."}
}

// describe says what became of a predecessor, as the rest of a sentence that begins with its name.
func describe(p Presence) string {
	switch p.State {
	case Waiting:
		return "arrived at " + stamp(p.ArrivedAt) + " and waits itself"
	case Failed:
		return "arrived at " + stamp(p.ArrivedAt) + " and its delivery failed at " + stamp(p.Since) +
			" (a retry of its dead letter, or a consume action, delivers it)"
	case Processed:
		return "arrived and was processed at " + stamp(p.Since)
	default:
		return "has not arrived"
	}
}

// stamp renders a time of an explanation: UTC, to the second.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
