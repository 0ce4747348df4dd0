// Package filter compiles and evaluates the per-message-type CEL filter of a SequentialInbox: an
// expression over one record that says whether the record is sequenced (true) or handed to the
// listener at once (false). It imports no Kubernetes package, so the consumer runtime can use it.
package filter

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/interpreter"
)

// CostLimit bounds the work of one evaluation (CEL cost units, roughly one per operation), so that
// a filter cannot stall a partition; an evaluation that exceeds it returns an error.
const CostLimit = 100_000

// Names of the variables a filter expression can read.
const (
	varType    = "type"
	varSubtype = "subtype"
	varHeaders = "headers"
	varKey     = "key"
	varPayload = "payload"
)

// Input is the part of a record that a filter sees.
type Input struct {
	// Type and Subtype are the record's message type and subtype (empty without subtype).
	Type, Subtype string
	// Headers are the record headers by name; the decoder decides which value wins for a
	// repeated name.
	Headers map[string]string
	// Key is the record key.
	Key string
	// Payload is the raw record value. The expression sees it parsed as JSON, or null when it is
	// empty or not JSON; it is parsed only when the expression reads `payload`.
	Payload []byte
}

// Program is a compiled filter, safe for concurrent use; compile once per message type.
type Program struct {
	expr    string
	program cel.Program
}

// Compile parses and type-checks a filter expression; it fails when the expression is not valid
// CEL, reads an undeclared variable, or does not yield a bool.
func Compile(expr string) (*Program, error) {
	env, err := cel.NewEnv(
		cel.Variable(varType, cel.StringType),
		cel.Variable(varSubtype, cel.StringType),
		cel.Variable(varHeaders, cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable(varKey, cel.StringType),
		cel.Variable(varPayload, cel.DynType),
	)
	if err != nil {
		return nil, fmt.Errorf("filter environment: %w", err)
	}
	ast, issues := env.Compile(expr)
	if issues.Err() != nil {
		return nil, fmt.Errorf("filter %q is not valid CEL over type, subtype, headers, key and payload: %s", expr, oneLine(issues))
	}
	if !ast.OutputType().IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("filter %q yields %s, not bool; a filter must say true (sequence the record) or false (deliver it at once), for example compare with == true", expr, ast.OutputType())
	}
	program, err := env.Program(ast, cel.CostLimit(CostLimit))
	if err != nil {
		return nil, fmt.Errorf("filter %q: %w", expr, err)
	}
	return &Program{expr: expr, program: program}, nil
}

// oneLine renders compile issues on one line ("column 4: Syntax error: ..."), so that they fit
// into a status condition; multi-line expressions also name the line.
func oneLine(issues *cel.Issues) string {
	parts := make([]string, 0, len(issues.Errors()))
	for _, e := range issues.Errors() {
		at := fmt.Sprintf("column %d", e.Location.Column()+1)
		if e.Location.Line() > 1 {
			at = fmt.Sprintf("line %d %s", e.Location.Line(), at)
		}
		parts = append(parts, at+": "+e.Message)
	}
	return strings.Join(parts, "; ")
}

// String returns the source expression, for logs and dead-letter headers.
func (p *Program) String() string { return p.expr }

// Eval runs the filter over one record. An error (a missing map key, a type mismatch at run time,
// the cost limit) means the filter cannot decide; the consumer dead-letters the record.
func (p *Program) Eval(in Input) (bool, error) {
	out, _, err := p.program.Eval(&activation{in: in})
	if err != nil {
		return false, fmt.Errorf("evaluate filter %q: %w", p.expr, err)
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("evaluate filter %q: yielded %s, not bool", p.expr, out.Type())
	}
	return bool(b), nil
}

// activation resolves the filter variables from an Input, parsing the payload on first use.
type activation struct {
	in      Input
	parsed  bool
	payload any
}

// ResolveName implements interpreter.Activation.
func (a *activation) ResolveName(name string) (any, bool) {
	switch name {
	case varType:
		return a.in.Type, true
	case varSubtype:
		return a.in.Subtype, true
	case varHeaders:
		if a.in.Headers == nil {
			return map[string]string{}, true
		}
		return a.in.Headers, true
	case varKey:
		return a.in.Key, true
	case varPayload:
		if !a.parsed {
			a.parsed = true
			a.payload = parseJSON(a.in.Payload)
		}
		if a.payload == nil {
			return types.NullValue, true
		}
		return a.payload, true
	default:
		return nil, false
	}
}

// Parent implements interpreter.Activation.
func (a *activation) Parent() interpreter.Activation { return nil }

// parseJSON returns the payload as generic JSON values, or nil when it is not JSON.
func parseJSON(raw []byte) any {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return nil
	}
	return v
}
