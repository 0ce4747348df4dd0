// Package sequence is the compiled, validated sequence declaration that the claim engine and the
// record decoder read. It is built by internal/declaration from a SequentialInbox spec and is
// read-only afterwards. It imports no Kubernetes package, so the engine does not either.
package sequence

import (
	"sort"
	"strings"
	"time"
)

// Qualify joins a message type and an optional subtype into the qualified type: the type alone,
// or type, '.', subtype. A type may contain dots (com.example.order.created), a subtype may not,
// so the subtype of a qualified type is what follows its last dot, if the declaration has one
// there (Set.Split); names written before types could contain dots are read as they were.
// See docs/design.md#qualified-types.
func Qualify(typ, subtype string) string {
	if subtype == "" {
		return typ
	}
	return typ + "." + subtype
}

// SourceKind says which part of a record a Source reads.
type SourceKind int

const (
	// FromHeader reads a record header.
	FromHeader SourceKind = iota + 1
	// FromJSONPointer reads a value of the JSON payload at an RFC 6901 pointer.
	FromJSONPointer
	// FromKey reads the record key.
	FromKey
)

// Source names one place of a record (a header, a JSON pointer into the payload, or the key).
type Source struct {
	Kind SourceKind
	// Name is the header name or the JSON pointer; empty for FromKey.
	Name string
}

// String renders the source for logs and error messages.
func (s Source) String() string {
	switch s.Kind {
	case FromHeader:
		return "header " + s.Name
	case FromJSONPointer:
		return "payload " + s.Name
	case FromKey:
		return "record key"
	default:
		return "nowhere"
	}
}

// Condition is a release condition: whether a message may be released given the qualified types
// already PROCESSED in its instance.
type Condition interface {
	// Holds reports whether the condition is met by the processed qualified types.
	Holds(processed map[string]bool) bool
	// Predecessors lists every qualified type the condition mentions, each once, sorted.
	Predecessors() []string
	// Missing is the part of the condition that the processed types do not meet yet, nil when
	// it holds: for "OrderCreated and (OrderPaid or OrderCancelled)" with OrderCreated processed,
	// "OrderPaid or OrderCancelled". It decides with Holds, so it agrees with the release.
	Missing(processed map[string]bool) Condition
	// String renders the condition, for example "OrderCreated and (OrderPaid or OrderCancelled)".
	String() string
}

// Predecessor holds when the named qualified type was processed.
type Predecessor string

// Holds implements Condition.
func (p Predecessor) Holds(processed map[string]bool) bool { return processed[string(p)] }

// Predecessors implements Condition.
func (p Predecessor) Predecessors() []string { return []string{string(p)} }

// String implements Condition.
func (p Predecessor) String() string { return string(p) }

// Missing implements Condition.
func (p Predecessor) Missing(processed map[string]bool) Condition {
	if p.Holds(processed) {
		return nil
	}
	return p
}

// And holds when every operand holds.
type And []Condition

// Holds implements Condition.
func (a And) Holds(processed map[string]bool) bool {
	for _, c := range a {
		if !c.Holds(processed) {
			return false
		}
	}
	return true
}

// Predecessors implements Condition.
func (a And) Predecessors() []string { return predecessorsOf(a) }

// String implements Condition.
func (a And) String() string { return join(a, " and ") }

// Missing implements Condition: the operands that do not hold, each reduced to what it misses.
func (a And) Missing(processed map[string]bool) Condition {
	var missing And
	for _, c := range a {
		if m := c.Missing(processed); m != nil {
			missing = append(missing, m)
		}
	}
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return missing[0]
	default:
		return missing
	}
}

// Or holds when any operand holds.
type Or []Condition

// Holds implements Condition.
func (o Or) Holds(processed map[string]bool) bool {
	for _, c := range o {
		if c.Holds(processed) {
			return true
		}
	}
	return false
}

// Predecessors implements Condition.
func (o Or) Predecessors() []string { return predecessorsOf(o) }

// String implements Condition.
func (o Or) String() string { return join(o, " or ") }

// Missing implements Condition: nothing when one operand holds, else any one of the operands,
// each reduced to what it misses.
func (o Or) Missing(processed map[string]bool) Condition {
	if o.Holds(processed) {
		return nil
	}
	missing := make(Or, len(o))
	for i, c := range o {
		missing[i] = c.Missing(processed)
	}
	return missing
}

func predecessorsOf(cs []Condition) []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range cs {
		for _, p := range c.Predecessors() {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	sort.Strings(out)
	return out
}

func join(cs []Condition, sep string) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		s := c.String()
		if _, leaf := c.(Predecessor); !leaf {
			s = "(" + s + ")"
		}
		parts[i] = s
	}
	return strings.Join(parts, sep)
}

// MessageType is one qualified message type of a sequence and how a record of it is read.
type MessageType struct {
	// Type is the message type (CloudEvents type), Subtype the optional subtype.
	Type, Subtype string
	// Qualified is Type or Type.Subtype; the key of claims and sequenced_message rows.
	Qualified string
	// Sequence is the sequence the type belongs to.
	Sequence *Sequence
	// Condition must hold before a message is released; nil releases at once.
	Condition Condition
	// ContextID, IdempotenceID and SubtypeFrom say where a record carries these values.
	ContextID, IdempotenceID Source
	// SubtypeFrom is set when the type is declared with subtypes.
	SubtypeFrom *Source
	// Filter is a CEL expression; empty means every record is sequenced.
	Filter string
}

// Sequence is one declared sequence.
type Sequence struct {
	Name string
	// Retention is how long an open instance waits for its messages after it was created.
	Retention time.Duration
	// DuplicateProtection is how long a closed instance and its claims are kept after closing,
	// so that duplicates of its messages are recognised.
	DuplicateProtection time.Duration
	// KeepDeliveredRecords keeps the raw records of delivered messages for replay (a CONSUME of
	// a PROCESSED message); without it a record exists only while the engine may still deliver it.
	KeepDeliveredRecords bool
	// Types are the sequence's qualified types in declaration order.
	Types []*MessageType
}

// Complete reports whether every qualified type of the sequence was processed.
func (s *Sequence) Complete(processed map[string]bool) bool {
	for _, t := range s.Types {
		if !processed[t.Qualified] {
			return false
		}
	}
	return true
}

// LongestChain is the largest number of listener calls that one record can cause in its instance
// when each type occurs once: the record itself plus every type that waits for it directly or
// transitively, because the record's release transaction releases all of them in a row. The
// operator budgets maxPollIntervalMs against it. (The depth of the predecessor graph would
// undercount fan-out: a late OrderCreated releases OrderPaid and OrderValidated both.)
func (s *Sequence) LongestChain() int {
	dependents := map[string][]string{}
	for _, t := range s.Types {
		if t.Condition == nil {
			continue
		}
		for _, p := range t.Condition.Predecessors() {
			dependents[p] = append(dependents[p], t.Qualified)
		}
	}
	longest := 0
	for _, t := range s.Types {
		released := map[string]bool{t.Qualified: true}
		queue := []string{t.Qualified}
		for len(queue) > 0 {
			next := queue[0]
			queue = queue[1:]
			for _, d := range dependents[next] {
				if !released[d] {
					released[d] = true
					queue = append(queue, d)
				}
			}
		}
		longest = max(longest, len(released))
	}
	return longest
}

// Set is the whole compiled declaration of one inbox.
type Set struct {
	sequences   []*Sequence
	byQualified map[string]*MessageType
	byType      map[string][]*MessageType
}

// NewSet indexes already validated sequences; internal/declaration.Compile is its caller.
func NewSet(sequences []*Sequence) *Set {
	s := &Set{sequences: sequences, byQualified: map[string]*MessageType{}, byType: map[string][]*MessageType{}}
	for _, seq := range sequences {
		for _, t := range seq.Types {
			t.Sequence = seq
			s.byQualified[t.Qualified] = t
			s.byType[t.Type] = append(s.byType[t.Type], t)
		}
	}
	return s
}

// Sequences returns the sequences in declaration order.
func (s *Set) Sequences() []*Sequence { return s.sequences }

// Sequence returns the sequence with the given name.
func (s *Set) Sequence(name string) (*Sequence, bool) {
	for _, seq := range s.sequences {
		if seq.Name == name {
			return seq, true
		}
	}
	return nil, false
}

// Lookup returns the declaration of a qualified type.
func (s *Set) Lookup(qualified string) (*MessageType, bool) {
	t, ok := s.byQualified[qualified]
	return t, ok
}

// Split recovers type and subtype of a stored qualified type by the declaration: a declared
// qualified type is its declaration's; otherwise, when the part before its last dot is a declared
// type, the part after it is the subtype (a subtype that is no longer declared); otherwise the
// whole name is the type. Qualify(Split(q)) is q either way.
func (s *Set) Split(qualified string) (typ, subtype string) {
	if t, ok := s.byQualified[qualified]; ok {
		return t.Type, t.Subtype
	}
	if i := strings.LastIndexByte(qualified, '.'); i > 0 && i < len(qualified)-1 {
		if _, declared := s.byType[qualified[:i]]; declared {
			return qualified[:i], qualified[i+1:]
		}
	}
	return qualified, ""
}

// TypesOf returns every declaration of a (unqualified) message type, one per declared subtype,
// so that a decoder knows whether and where to read a subtype.
func (s *Set) TypesOf(typ string) []*MessageType { return s.byType[typ] }
