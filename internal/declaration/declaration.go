// Package declaration compiles the sequences of a SequentialInbox spec into the immutable
// sequence.Set that the claim engine reads, and rejects every declaration that cannot work
// (docs/design.md#the-declaration). The operator calls Compile to validate a resource, the consumer
// calls it to build its engine: one function, so that both always agree on what a declaration
// means.
package declaration

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/filter"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// MinRetention is the shortest retention of a sequence: instances and their claims must outlive the
// redelivery of a record, and housekeeping runs in minutes.
const MinRetention = time.Minute

// DefaultIdempotenceHeader carries the idempotence ID when a message type does not say: the
// CloudEvents id (binary mode header; the decoder maps structured-mode attributes to the same name).
const DefaultIdempotenceHeader = "ce_id"

// Compile validates spec.sequences and the spec's durations, and builds the sequence set. It
// reports every problem it finds, each with the field path below `spec` and what to change; on
// any error the set is nil.
func Compile(spec *v1alpha1.SequentialInboxSpec) (*sequence.Set, field.ErrorList) {
	root := field.NewPath("spec")
	if spec == nil {
		return nil, field.ErrorList{field.Required(root, "a SequentialInbox needs a spec with sequences")}
	}
	c := &compiler{owner: map[string]*entry{}, firstOfType: map[string]*entry{}}
	c.errs = append(c.errs, checkDurations(root, spec)...)
	sequences := c.declare(root.Child("sequences"), spec.Sequences)
	for _, e := range c.entries {
		c.compileCondition(e)
	}
	for _, seq := range sequences {
		c.findCycles(seq)
	}
	if len(c.errs) > 0 {
		return nil, c.errs
	}
	return sequence.NewSet(sequences), nil
}

// checkDurations reports every duration outside the sequences that is no duration at all. The
// API server refuses such values, but an object stored before its rules existed may hold one;
// decoding keeps it (v1alpha1.Duration) so that it is reported here instead of failing the
// operator's cache for every inbox.
func checkDurations(root *field.Path, spec *v1alpha1.SequentialInboxSpec) field.ErrorList {
	var errs field.ErrorList
	for _, d := range []struct {
		path  *field.Path
		value v1alpha1.Duration
	}{
		{root.Child("database", "idleLockTimeout"), spec.Database.IdleLockTimeout},
		{root.Child("sink", "timeout"), spec.Sink.Timeout},
		{root.Child("sink", "initialBackoff"), spec.Sink.InitialBackoff},
		{root.Child("housekeeping", "interval"), spec.Housekeeping.Interval},
		{root.Child("housekeeping", "expiryDelay"), spec.Housekeeping.ExpiryDelay},
		{root.Child("housekeeping", "maxDuration"), spec.Housekeeping.MaxDuration},
	} {
		if written, malformed := d.value.Malformed(); malformed {
			errs = append(errs, malformedDuration(d.path, written))
		}
	}
	return errs
}

// malformedDuration is the error of a duration field whose value is no duration.
func malformedDuration(path *field.Path, written string) *field.Error {
	return field.Invalid(path, written, "not a duration: write a number with a unit (ns, us, ms, s, m, h), such as 10s or 1h30m")
}

// LongestChain is the largest sequence.Sequence.LongestChain of the set: the most listener calls
// that one record can cause, which the operator budgets maxPollIntervalMs against.
func LongestChain(set *sequence.Set) int {
	longest := 0
	for _, seq := range set.Sequences() {
		longest = max(longest, seq.LongestChain())
	}
	return longest
}

// entry is one declared message type while the declaration is compiled.
type entry struct {
	path     *field.Path
	seqIndex int
	seqName  string
	spec     *v1alpha1.MessageSpec
	mt       *sequence.MessageType
	// waitsFor are the valid predecessors of the release condition, the edges of the cycle check.
	waitsFor []string
}

// compiler collects errors and indexes while a spec is compiled.
type compiler struct {
	errs    field.ErrorList
	entries []*entry
	// owner is the entry of each qualified type; firstOfType the first entry of each base type.
	owner       map[string]*entry
	firstOfType map[string]*entry
	// bySequence are the entries of each sequence, by sequence index.
	bySequence [][]*entry
}

// declare checks the sequences and message types and builds the model without conditions.
func (c *compiler) declare(path *field.Path, specs []v1alpha1.SequenceSpec) []*sequence.Sequence {
	if len(specs) == 0 {
		c.errs = append(c.errs, field.Required(path, "declare at least one sequence with its message types"))
	}
	names := map[string]int{}
	out := make([]*sequence.Sequence, 0, len(specs))
	c.bySequence = make([][]*entry, len(specs))
	for i := range specs {
		s := &specs[i]
		sp := path.Index(i)
		switch first, dup := names[s.Name]; {
		case s.Name == "":
			c.errs = append(c.errs, field.Required(sp.Child("name"), "name the sequence; the name keys its instances in the database"))
		case dup:
			e := field.Duplicate(sp.Child("name"), s.Name)
			e.Detail = fmt.Sprintf("%s has the same name; give every sequence a unique name", path.Index(first))
			c.errs = append(c.errs, e)
		default:
			names[s.Name] = i
		}
		if written, malformed := s.Retention.Malformed(); malformed {
			c.errs = append(c.errs, malformedDuration(sp.Child("retention"), written))
		} else if s.Retention.Duration < MinRetention {
			c.errs = append(c.errs, field.Invalid(sp.Child("retention"), s.Retention.String(),
				fmt.Sprintf("must be at least %s: an open instance and its claims (the duplicate protection) are kept this long after creation; use for example 24h", MinRetention)))
		}
		protection := s.Retention.Duration
		if s.DuplicateProtection != nil {
			protection = s.DuplicateProtection.Duration
			if written, malformed := s.DuplicateProtection.Malformed(); malformed {
				c.errs = append(c.errs, malformedDuration(sp.Child("duplicateProtection"), written))
			}
		}
		if protection < 0 {
			c.errs = append(c.errs, field.Invalid(sp.Child("duplicateProtection"), protection.String(),
				"must not be negative: it is how long a closed instance and its claims are kept; leave it unset to keep them for the retention"))
		}
		if len(s.Messages) == 0 {
			c.errs = append(c.errs, field.Required(sp.Child("messages"), "a sequence needs at least one message type; add messages or remove the sequence"))
		}
		seq := &sequence.Sequence{Name: s.Name, Retention: s.Retention.Duration, DuplicateProtection: protection,
			KeepDeliveredRecords: s.KeepDeliveredRecords}
		for j := range s.Messages {
			e := c.declareMessage(sp.Child("messages").Index(j), i, s.Name, &s.Messages[j])
			if e == nil {
				continue
			}
			seq.Types = append(seq.Types, e.mt)
			c.bySequence[i] = append(c.bySequence[i], e)
		}
		out = append(out, seq)
	}
	return out
}

// declareMessage checks one message type without its release condition. It returns nil when the
// type itself is unusable (no valid qualified type), so later checks do not repeat the error.
func (c *compiler) declareMessage(path *field.Path, seqIndex int, seqName string, m *v1alpha1.MessageSpec) *entry {
	typeOK := c.checkType(path.Child("type"), m.Type)
	subtypeOK := c.checkSubtype(path.Child("subtype"), m.Subtype)
	if !typeOK || !subtypeOK {
		return nil
	}
	qualified := sequence.Qualify(m.Type, m.Subtype)
	mt := &sequence.MessageType{
		Type:          m.Type,
		Subtype:       m.Subtype,
		Qualified:     qualified,
		ContextID:     c.source(path.Child("contextId"), m.ContextID, sequence.Source{Kind: sequence.FromKey}),
		IdempotenceID: c.source(path.Child("idempotenceId"), m.IdempotenceID, sequence.Source{Kind: sequence.FromHeader, Name: DefaultIdempotenceHeader}),
		Filter:        m.Filter,
	}
	e := &entry{path: path, seqIndex: seqIndex, seqName: seqName, spec: m, mt: mt}

	switch {
	case m.Subtype != "" && m.SubtypeFrom == nil:
		c.errs = append(c.errs, field.Required(path.Child("subtypeFrom"),
			fmt.Sprintf("%s declares subtype %s, so it must say where a record carries its subtype: set header or jsonPointer", m.Type, m.Subtype)))
	case m.Subtype == "" && m.SubtypeFrom != nil:
		c.errs = append(c.errs, field.Forbidden(path.Child("subtypeFrom"),
			fmt.Sprintf("%s declares no subtype, so there is nothing to read; remove subtypeFrom or set subtype", m.Type)))
	case m.SubtypeFrom != nil:
		src := c.source(path.Child("subtypeFrom"), m.SubtypeFrom, sequence.Source{})
		mt.SubtypeFrom = &src
	}

	if m.Filter != "" {
		if _, err := filter.Compile(m.Filter); err != nil {
			c.errs = append(c.errs, field.Invalid(path.Child("filter"), m.Filter,
				fmt.Sprintf("the filter of message type %s does not compile: %v", qualified, err)))
		}
	}

	if prev, dup := c.owner[qualified]; dup && prev.mt.Type != m.Type {
		// Two declarations whose qualified names coincide (a.b, and a with subtype b): a stored
		// message of that name could not be told apart (docs/design.md#qualified-types).
		at, value := path.Child("type"), m.Type
		if m.Subtype != "" {
			at, value = path.Child("subtype"), m.Subtype
		}
		c.errs = append(c.errs, field.Invalid(at, value,
			fmt.Sprintf("the qualified type %s would be ambiguous: %s declares %s, this entry %s; claims and stored messages are named by the qualified type, so one of them must change its type or subtype",
				qualified, prev.path, describeQualified(prev.mt), describeQualified(mt))))
		return nil
	} else if dup {
		where := "in the same sequence"
		if prev.seqIndex != seqIndex {
			where = fmt.Sprintf("in sequence %q", prev.seqName)
		}
		err := field.Duplicate(path.Child("type"), qualified)
		err.Detail = fmt.Sprintf("%s is already declared at %s (%s); a qualified type belongs to exactly one sequence, declared once: remove one of them or add a subtype",
			qualified, prev.path, where)
		c.errs = append(c.errs, err)
		return nil
	}
	c.owner[qualified] = e
	c.checkSameTypeAgrees(e)
	c.entries = append(c.entries, e)
	return e
}

// checkSameTypeAgrees rejects entries of one base type that disagree on subtypes: a record of the
// type must resolve to one qualified type, and it carries its subtype in one place.
func (c *compiler) checkSameTypeAgrees(e *entry) {
	first, seen := c.firstOfType[e.mt.Type]
	if !seen {
		c.firstOfType[e.mt.Type] = e
		return
	}
	switch {
	case (first.mt.Subtype == "") != (e.mt.Subtype == ""):
		with, without := e, first
		if e.mt.Subtype == "" {
			with, without = first, e
		}
		c.errs = append(c.errs, field.Invalid(e.path.Child("subtype"), e.mt.Subtype,
			fmt.Sprintf("type %s is declared without subtype at %s and with subtype %s at %s; a record of this type could not be told apart: declare every entry of %s with a subtype, or none",
				e.mt.Type, without.path, with.mt.Subtype, with.path, e.mt.Type)))
	case first.mt.SubtypeFrom != nil && e.mt.SubtypeFrom != nil && *first.mt.SubtypeFrom != *e.mt.SubtypeFrom:
		c.errs = append(c.errs, field.Invalid(e.path.Child("subtypeFrom"), e.mt.SubtypeFrom.String(),
			fmt.Sprintf("type %s reads its subtype from %s at %s; a record carries its subtype in one place, so every entry of %s must use the same subtypeFrom",
				e.mt.Type, first.mt.SubtypeFrom, first.path, e.mt.Type)))
	}
}

// describeQualified says how a declaration forms its qualified type, for the ambiguity error.
func describeQualified(mt *sequence.MessageType) string {
	if mt.Subtype == "" {
		return fmt.Sprintf("type %s without subtype", mt.Type)
	}
	return fmt.Sprintf("type %s with subtype %s", mt.Type, mt.Subtype)
}

// checkType accepts any type a CloudEvents producer may send: a non-empty string of printable
// characters, dots included (com.example.order.created).
func (c *compiler) checkType(path *field.Path, name string) bool {
	switch {
	case name == "":
		c.errs = append(c.errs, field.Required(path, "set the message type, for example the CloudEvents type OrderCreated or com.example.order.created"))
		return false
	case !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		c.errs = append(c.errs, field.Invalid(path, name, "must not contain control characters: a CloudEvents type is printable text"))
		return false
	}
	return true
}

// checkSubtype rejects subtypes that would make qualified types ambiguous: the subtype is what
// follows the last dot of a qualified type.
func (c *compiler) checkSubtype(path *field.Path, name string) bool {
	if strings.ContainsFunc(name, func(r rune) bool { return r == '.' || unicode.IsSpace(r) || unicode.IsControl(r) }) {
		c.errs = append(c.errs, field.Invalid(path, name,
			"must not contain '.' or whitespace: the qualified type is <type>.<subtype>, and its last '.' separates the subtype"))
		return false
	}
	return true
}

// source compiles a FieldSource; def is used when it is unset.
func (c *compiler) source(path *field.Path, fs *v1alpha1.FieldSource, def sequence.Source) sequence.Source {
	if fs == nil {
		return def
	}
	set := 0
	for _, ok := range []bool{fs.Header != "", fs.JSONPointer != "", fs.Key} {
		if ok {
			set++
		}
	}
	switch {
	case set == 0:
		c.errs = append(c.errs, field.Required(path, "set exactly one of header, jsonPointer or key"))
	case set > 1:
		c.errs = append(c.errs, field.Invalid(path, describeFieldSource(fs), "set exactly one of header, jsonPointer or key"))
	case fs.Header != "":
		return sequence.Source{Kind: sequence.FromHeader, Name: fs.Header}
	case fs.JSONPointer != "":
		if err := checkJSONPointer(fs.JSONPointer); err != nil {
			c.errs = append(c.errs, field.Invalid(path.Child("jsonPointer"), fs.JSONPointer,
				fmt.Sprintf("not an RFC 6901 JSON pointer: %v; write for example /orderId or /customer/id (~0 for '~', ~1 for '/')", err)))
		}
		return sequence.Source{Kind: sequence.FromJSONPointer, Name: fs.JSONPointer}
	default:
		return sequence.Source{Kind: sequence.FromKey}
	}
	return def
}

func describeFieldSource(fs *v1alpha1.FieldSource) string {
	var parts []string
	if fs.Header != "" {
		parts = append(parts, "header "+fs.Header)
	}
	if fs.JSONPointer != "" {
		parts = append(parts, "jsonPointer "+fs.JSONPointer)
	}
	if fs.Key {
		parts = append(parts, "key")
	}
	return strings.Join(parts, ", ")
}

// checkJSONPointer checks RFC 6901 syntax: empty (the whole document) or '/'-separated reference
// tokens in which '~' only starts the escapes ~0 and ~1.
func checkJSONPointer(p string) error {
	if p == "" {
		return nil
	}
	if p[0] != '/' {
		return fmt.Errorf("it must start with '/'")
	}
	for i := 0; i < len(p); i++ {
		if p[i] != '~' {
			continue
		}
		if i+1 == len(p) || (p[i+1] != '0' && p[i+1] != '1') {
			return fmt.Errorf("'~' at offset %d must be followed by 0 or 1", i)
		}
	}
	return nil
}

// term is one node of a release condition tree, whatever its level in the API types.
type term struct {
	predecessor string
	and, or     []term
}

func termOf(rc *v1alpha1.ReleaseCondition) term {
	t := term{predecessor: rc.Predecessor}
	if rc.And != nil {
		t.and = make([]term, 0, len(rc.And))
		for _, o := range rc.And {
			t.and = append(t.and, termOfTerm(o))
		}
	}
	if rc.Or != nil {
		t.or = make([]term, 0, len(rc.Or))
		for _, o := range rc.Or {
			t.or = append(t.or, termOfTerm(o))
		}
	}
	return t
}

func termOfTerm(rc v1alpha1.ReleaseConditionTerm) term {
	t := term{predecessor: rc.Predecessor}
	if rc.And != nil {
		t.and = make([]term, 0, len(rc.And))
		for _, o := range rc.And {
			t.and = append(t.and, term{predecessor: o.Predecessor})
		}
	}
	if rc.Or != nil {
		t.or = make([]term, 0, len(rc.Or))
		for _, o := range rc.Or {
			t.or = append(t.or, term{predecessor: o.Predecessor})
		}
	}
	return t
}

// compileCondition builds the release condition of one entry; every qualified type is declared by now.
func (c *compiler) compileCondition(e *entry) {
	if e.spec.ReleaseCondition == nil {
		return
	}
	cond, _, ok := c.compileTerm(e, e.path.Child("releaseCondition"), termOf(e.spec.ReleaseCondition), levelTop)
	if ok {
		e.mt.Condition = cond
	}
}

// Levels of a release condition tree: the top (ReleaseCondition), its operands
// (ReleaseConditionTerm) and theirs (ReleaseConditionLeaf, a predecessor only).
const (
	levelTop = iota
	levelTerm
	levelLeaf
)

// compileTerm compiles one node. key is a canonical form (operands sorted) for the duplicate check.
func (c *compiler) compileTerm(e *entry, path *field.Path, t term, level int) (cond sequence.Condition, key string, ok bool) {
	var set []string
	if t.predecessor != "" {
		set = append(set, "predecessor")
	}
	if t.and != nil {
		set = append(set, "and")
	}
	if t.or != nil {
		set = append(set, "or")
	}
	switch {
	case len(set) == 0 && level == levelLeaf:
		c.errs = append(c.errs, field.Required(path.Child("predecessor"), "name the qualified type this message waits for"))
	case len(set) == 0:
		c.errs = append(c.errs, field.Required(path, "set exactly one of predecessor, and or or"))
	case len(set) > 1:
		c.errs = append(c.errs, field.Invalid(path, strings.Join(set, ", "),
			"set exactly one of predecessor, and or or; to combine conditions, list them as operands of one and or or"))
	case t.predecessor != "":
		if c.checkPredecessor(e, path.Child("predecessor"), t.predecessor) {
			return sequence.Predecessor(t.predecessor), t.predecessor, true
		}
	case t.and != nil:
		ops, keys, ok := c.compileOperands(e, path.Child("and"), "and", t.and, level+1)
		if ok {
			return sequence.And(ops), "and(" + strings.Join(keys, ",") + ")", true
		}
	default:
		ops, keys, ok := c.compileOperands(e, path.Child("or"), "or", t.or, level+1)
		if ok {
			return sequence.Or(ops), "or(" + strings.Join(keys, ",") + ")", true
		}
	}
	return nil, "", false
}

// compileOperands compiles the operands of an and/or and returns their sorted canonical keys.
func (c *compiler) compileOperands(e *entry, path *field.Path, op string, terms []term, level int) ([]sequence.Condition, []string, bool) {
	ok := true
	if len(terms) < 2 {
		err := field.TooFew(path, len(terms), 2)
		err.Detail += fmt.Sprintf(": an %s combines at least two operands; for a single predecessor write predecessor: <type> instead", op)
		c.errs = append(c.errs, err)
		ok = false
	}
	ops := make([]sequence.Condition, 0, len(terms))
	keys := make([]string, 0, len(terms))
	seen := map[string]int{}
	for k, t := range terms {
		cond, key, opOK := c.compileTerm(e, path.Index(k), t, level)
		if !opOK {
			ok = false
			continue
		}
		if first, dup := seen[key]; dup {
			err := field.Duplicate(path.Index(k), cond.String())
			err.Detail = fmt.Sprintf("repeats %s; remove the repetition", path.Index(first))
			c.errs = append(c.errs, err)
			ok = false
			continue
		}
		seen[key] = k
		ops = append(ops, cond)
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return ops, keys, ok
}

// checkPredecessor checks that a predecessor names another qualified type of the same sequence
// and records it as an edge for the cycle check.
func (c *compiler) checkPredecessor(e *entry, path *field.Path, name string) bool {
	if name == e.mt.Qualified {
		c.errs = append(c.errs, field.Invalid(path, name,
			fmt.Sprintf("%s cannot wait for itself; name another type of sequence %q or remove the condition", name, e.seqName)))
		return false
	}
	owner, declared := c.owner[name]
	if !declared {
		err := field.NotFound(path, name)
		err.Detail = c.unknownPredecessorHint(e, name)
		c.errs = append(c.errs, err)
		return false
	}
	if owner.seqIndex != e.seqIndex {
		c.errs = append(c.errs, field.Invalid(path, name,
			fmt.Sprintf("%s belongs to sequence %q (%s), not to sequence %q; a release condition can only name types of its own sequence, because an instance holds the messages of one sequence",
				name, owner.seqName, owner.path, e.seqName)))
		return false
	}
	if !slices.Contains(e.waitsFor, name) {
		e.waitsFor = append(e.waitsFor, name)
	}
	return true
}

// unknownPredecessorHint says what the author may have meant by an undeclared predecessor.
func (c *compiler) unknownPredecessorHint(e *entry, name string) string {
	if first, ok := c.firstOfType[name]; ok && first.mt.Subtype != "" {
		var qualified []string
		for _, o := range c.entries {
			if o.mt.Type == name {
				qualified = append(qualified, o.mt.Qualified)
			}
		}
		return fmt.Sprintf("%s is only declared with subtypes; name a qualified type: %s", name, strings.Join(qualified, ", "))
	}
	var same []string
	for _, o := range c.bySequence[e.seqIndex] {
		if o != e {
			same = append(same, o.mt.Qualified)
		}
	}
	if len(same) == 0 {
		return fmt.Sprintf("no sequence declares %s; declare it in sequence %q first", name, e.seqName)
	}
	return fmt.Sprintf("no sequence declares %s; declare it in sequence %q or name one of its types: %s", name, e.seqName, strings.Join(same, ", "))
}

// findCycles reports each cycle of "waits for" edges in one sequence once, including edges through
// or: a cycle is rejected even when another operand could release it, because the declaration then
// depends on arrival order in a way nobody meant.
func (c *compiler) findCycles(seq *sequence.Sequence) {
	var entries []*entry
	for _, t := range seq.Types {
		entries = append(entries, c.owner[t.Qualified])
	}
	const (
		unvisited = iota
		onStack
		done
	)
	state := map[string]int{}
	var stack []string
	reported := map[string]bool{}
	var visit func(e *entry)
	visit = func(e *entry) {
		state[e.mt.Qualified] = onStack
		stack = append(stack, e.mt.Qualified)
		for _, p := range e.waitsFor {
			switch state[p] {
			case unvisited:
				visit(c.owner[p])
			case onStack:
				start := slices.Index(stack, p)
				c.reportCycle(slices.Clone(stack[start:]), reported)
			}
		}
		stack = stack[:len(stack)-1]
		state[e.mt.Qualified] = done
	}
	for _, e := range entries {
		if state[e.mt.Qualified] == unvisited {
			visit(e)
		}
	}
}

// reportCycle reports a cycle (each type waits for the next, the last for the first) once,
// at the release condition of its first declared type.
func (c *compiler) reportCycle(cycle []string, reported map[string]bool) {
	first := 0
	for i, q := range cycle {
		if c.before(q, cycle[first]) {
			first = i
		}
	}
	cycle = append(cycle[first:], cycle[:first]...)
	key := strings.Join(cycle, "\x00")
	if reported[key] {
		return
	}
	reported[key] = true
	at := c.owner[cycle[0]]
	c.errs = append(c.errs, field.Invalid(at.path.Child("releaseCondition"), strings.Join(append(cycle, cycle[0]), " → "),
		fmt.Sprintf("release conditions form a cycle in sequence %q (each type waits for the next), so these messages could wait for each other forever; remove one of the predecessors",
			at.seqName)))
}

// before orders qualified types by declaration.
func (c *compiler) before(a, b string) bool {
	ea, eb := c.owner[a], c.owner[b]
	if ea.seqIndex != eb.seqIndex {
		return ea.seqIndex < eb.seqIndex
	}
	return slices.Index(c.bySequence[ea.seqIndex], ea) < slices.Index(c.bySequence[eb.seqIndex], eb)
}
