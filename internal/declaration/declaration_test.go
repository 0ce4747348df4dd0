package declaration

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// specOf reads the YAML of spec.sequences into a spec, strictly, so that a typo fails the test.
func specOf(t *testing.T, sequences string) *v1alpha1.SequentialInboxSpec {
	t.Helper()
	var spec v1alpha1.SequentialInboxSpec
	if err := yaml.UnmarshalStrict([]byte("sequences:\n"+sequences), &spec); err != nil {
		t.Fatalf("test spec does not parse: %v\n%s", err, sequences)
	}
	return &spec
}

// wantErr is one expected error: exact field path and type, and phrases of its message.
type wantErr struct {
	field    string
	typ      field.ErrorType
	contains []string
}

func TestCompileRejects(t *testing.T) {
	tests := []struct {
		name      string
		sequences string
		want      []wantErr
	}{
		{
			name: "unknown predecessor",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: OrderCreated}
  - {type: OrderPaid, releaseCondition: {predecessor: OrderCreatd}}`,
			want: []wantErr{{"spec.sequences[0].messages[1].releaseCondition.predecessor", field.ErrorTypeNotFound,
				[]string{"no sequence declares OrderCreatd", `"order"`, "OrderCreated"}}},
		},
		{
			name: "predecessor names a type declared only with subtypes",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: OrderValidated, subtype: OK, subtypeFrom: {header: ce_result}}
  - {type: OrderValidated, subtype: FAILED, subtypeFrom: {header: ce_result}}
  - {type: OrderShipped, releaseCondition: {predecessor: OrderValidated}}`,
			want: []wantErr{{"spec.sequences[0].messages[2].releaseCondition.predecessor", field.ErrorTypeNotFound,
				[]string{"only declared with subtypes", "OrderValidated.OK, OrderValidated.FAILED"}}},
		},
		{
			name: "predecessor in another sequence",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: OrderCreated}
  - {type: OrderPaid, releaseCondition: {predecessor: InvoiceSent}}
- name: billing
  retention: 24h
  messages:
  - {type: InvoiceSent}`,
			want: []wantErr{{"spec.sequences[0].messages[1].releaseCondition.predecessor", field.ErrorTypeInvalid,
				[]string{`belongs to sequence "billing"`, "spec.sequences[1].messages[0]", `not to sequence "order"`}}},
		},
		{
			name: "and with one operand",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: B, releaseCondition: {and: [{predecessor: A}]}}`,
			want: []wantErr{{"spec.sequences[0].messages[1].releaseCondition.and", field.ErrorTypeTooFew,
				[]string{"at least 2", "predecessor: <type> instead"}}},
		},
		{
			name: "empty or",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: B, releaseCondition: {or: []}}`,
			want: []wantErr{{"spec.sequences[0].messages[1].releaseCondition.or", field.ErrorTypeTooFew, []string{"an or combines"}}},
		},
		{
			name: "nested or with one operand",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: B}
  - {type: C, releaseCondition: {and: [{predecessor: A}, {or: [{predecessor: B}]}]}}`,
			want: []wantErr{{"spec.sequences[0].messages[2].releaseCondition.and[1].or", field.ErrorTypeTooFew, nil}},
		},
		{
			name: "duplicate predecessor operands",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: B, releaseCondition: {and: [{predecessor: A}, {predecessor: A}]}}`,
			want: []wantErr{{"spec.sequences[0].messages[1].releaseCondition.and[1]", field.ErrorTypeDuplicate,
				[]string{"repeats spec.sequences[0].messages[1].releaseCondition.and[0]"}}},
		},
		{
			name: "duplicate nested operands in another order",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: B}
  - {type: C}
  - {type: D, releaseCondition: {or: [{and: [{predecessor: A}, {predecessor: B}]}, {predecessor: C}, {and: [{predecessor: B}, {predecessor: A}]}]}}`,
			want: []wantErr{{"spec.sequences[0].messages[3].releaseCondition.or[2]", field.ErrorTypeDuplicate,
				[]string{"repeats spec.sequences[0].messages[3].releaseCondition.or[0]"}}},
		},
		{
			name: "two-type cycle",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A, releaseCondition: {predecessor: B}}
  - {type: B, releaseCondition: {predecessor: A}}`,
			want: []wantErr{{"spec.sequences[0].messages[0].releaseCondition", field.ErrorTypeInvalid,
				[]string{`"A → B → A"`, `cycle in sequence "order"`}}},
		},
		{
			name: "cycle through or, even though another operand could release it",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: X}
  - {type: A, releaseCondition: {or: [{predecessor: X}, {predecessor: C}]}}
  - {type: B, releaseCondition: {predecessor: A}}
  - {type: C, releaseCondition: {and: [{predecessor: B}, {predecessor: X}]}}`,
			want: []wantErr{{"spec.sequences[0].messages[1].releaseCondition", field.ErrorTypeInvalid,
				[]string{`"A → C → B → A"`}}},
		},
		{
			name: "two separate cycles are both named",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A, releaseCondition: {predecessor: B}}
  - {type: B, releaseCondition: {predecessor: A}}
  - {type: C, releaseCondition: {predecessor: D}}
  - {type: D, releaseCondition: {predecessor: C}}`,
			want: []wantErr{
				{"spec.sequences[0].messages[0].releaseCondition", field.ErrorTypeInvalid, []string{`"A → B → A"`}},
				{"spec.sequences[0].messages[2].releaseCondition", field.ErrorTypeInvalid, []string{`"C → D → C"`}},
			},
		},
		{
			name: "own type as predecessor",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: B, releaseCondition: {or: [{predecessor: A}, {predecessor: B}]}}`,
			want: []wantErr{{"spec.sequences[0].messages[1].releaseCondition.or[1].predecessor", field.ErrorTypeInvalid,
				[]string{"B cannot wait for itself"}}},
		},
		{
			name: "qualified type twice in one sequence",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: A}`,
			want: []wantErr{{"spec.sequences[0].messages[1].type", field.ErrorTypeDuplicate,
				[]string{"already declared at spec.sequences[0].messages[0]", "in the same sequence"}}},
		},
		{
			name: "qualified type in two sequences",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: V, subtype: OK, subtypeFrom: {header: ce_result}}
- name: audit
  retention: 24h
  messages:
  - {type: V, subtype: OK, subtypeFrom: {header: ce_result}}`,
			want: []wantErr{{"spec.sequences[1].messages[0].type", field.ErrorTypeDuplicate,
				[]string{`"V.OK"`, "already declared at spec.sequences[0].messages[0]", `in sequence "order"`}}},
		},
		{
			name: "type with and without subtype",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: V}
- name: audit
  retention: 24h
  messages:
  - {type: V, subtype: OK, subtypeFrom: {header: ce_result}}`,
			want: []wantErr{{"spec.sequences[1].messages[0].subtype", field.ErrorTypeInvalid,
				[]string{"declared without subtype at spec.sequences[0].messages[0]", "with subtype OK at spec.sequences[1].messages[0]"}}},
		},
		{
			name: "type with subtype first, then without",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: V, subtype: OK, subtypeFrom: {header: ce_result}}
  - {type: V}`,
			want: []wantErr{{"spec.sequences[0].messages[1].subtype", field.ErrorTypeInvalid,
				[]string{"declared without subtype at spec.sequences[0].messages[1]", "with subtype OK at spec.sequences[0].messages[0]"}}},
		},
		{
			name: "same type reads its subtype from different places",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: V, subtype: OK, subtypeFrom: {header: ce_result}}
  - {type: V, subtype: FAILED, subtypeFrom: {jsonPointer: /result}}`,
			want: []wantErr{{"spec.sequences[0].messages[1].subtypeFrom", field.ErrorTypeInvalid,
				[]string{"reads its subtype from header ce_result at spec.sequences[0].messages[0]", "same subtypeFrom"}}},
		},
		{
			name: "subtype without subtypeFrom",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: V, subtype: OK}`,
			want: []wantErr{{"spec.sequences[0].messages[0].subtypeFrom", field.ErrorTypeRequired, []string{"declares subtype OK"}}},
		},
		{
			name: "subtypeFrom without subtype",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: V, subtypeFrom: {header: ce_result}}`,
			want: []wantErr{{"spec.sequences[0].messages[0].subtypeFrom", field.ErrorTypeForbidden, []string{"remove subtypeFrom or set subtype"}}},
		},
		{
			name: "retention under one minute",
			sequences: `
- name: order
  retention: 59s
  messages:
  - {type: A}`,
			want: []wantErr{{"spec.sequences[0].retention", field.ErrorTypeInvalid, []string{`"59s"`, "at least 1m0s"}}},
		},
		{
			name: "retention unset",
			sequences: `
- name: order
  messages:
  - {type: A}`,
			want: []wantErr{{"spec.sequences[0].retention", field.ErrorTypeInvalid, []string{`"0s"`}}},
		},
		{
			name: "negative duplicate protection",
			sequences: `
- name: order
  retention: 24h
  duplicateProtection: -1h
  messages:
  - {type: A}`,
			want: []wantErr{{"spec.sequences[0].duplicateProtection", field.ErrorTypeInvalid, []string{`"-1h0m0s"`, "must not be negative"}}},
		},
		{
			name: "sequence without messages",
			sequences: `
- name: order
  retention: 24h
  messages: []`,
			want: []wantErr{{"spec.sequences[0].messages", field.ErrorTypeRequired, []string{"at least one message type"}}},
		},
		{
			name: "duplicate sequence names",
			sequences: `
- name: order
  retention: 24h
  messages: [{type: A}]
- name: order
  retention: 24h
  messages: [{type: B}]`,
			want: []wantErr{{"spec.sequences[1].name", field.ErrorTypeDuplicate, []string{"spec.sequences[0] has the same name"}}},
		},
		{
			name: "filter syntax error names the message type",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: V, subtype: OK, subtypeFrom: {header: ce_result}, filter: "payload.test =="}`,
			want: []wantErr{{"spec.sequences[0].messages[0].filter", field.ErrorTypeInvalid,
				[]string{"the filter of message type V.OK does not compile", "Syntax error"}}},
		},
		{
			name: "filter that does not yield bool",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A, filter: "headers['tenant']"}`,
			want: []wantErr{{"spec.sequences[0].messages[0].filter", field.ErrorTypeInvalid, []string{"message type A", "not bool"}}},
		},
		{
			name: "JSON pointers that break RFC 6901",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A, contextId: {jsonPointer: orderId}}
  - {type: B, idempotenceId: {jsonPointer: /a~2b}}
  - {type: C, subtype: OK, subtypeFrom: {jsonPointer: /result~}}`,
			want: []wantErr{
				{"spec.sequences[0].messages[0].contextId.jsonPointer", field.ErrorTypeInvalid, []string{"must start with '/'", "/orderId"}},
				{"spec.sequences[0].messages[1].idempotenceId.jsonPointer", field.ErrorTypeInvalid, []string{"'~' at offset 2 must be followed by 0 or 1"}},
				{"spec.sequences[0].messages[2].subtypeFrom.jsonPointer", field.ErrorTypeInvalid, []string{"'~' at offset 7"}},
			},
		},
		{
			name: "field source with none or two places",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A, contextId: {}}
  - {type: B, contextId: {header: order, key: true}}`,
			want: []wantErr{
				{"spec.sequences[0].messages[0].contextId", field.ErrorTypeRequired, []string{"exactly one of header, jsonPointer or key"}},
				{"spec.sequences[0].messages[1].contextId", field.ErrorTypeInvalid, []string{`"header order, key"`}},
			},
		},
		{
			name: "release condition with no or several kinds",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: A}
  - {type: B}
  - {type: C, releaseCondition: {}}
  - {type: D, releaseCondition: {predecessor: A, and: [{predecessor: A}, {predecessor: B}]}}
  - {type: E, releaseCondition: {and: [{predecessor: A}, {or: [{}, {predecessor: B}]}]}}`,
			want: []wantErr{
				{"spec.sequences[0].messages[2].releaseCondition", field.ErrorTypeRequired, []string{"exactly one of predecessor, and or or"}},
				{"spec.sequences[0].messages[3].releaseCondition", field.ErrorTypeInvalid, []string{`"predecessor, and"`}},
				{"spec.sequences[0].messages[4].releaseCondition.and[1].or[0].predecessor", field.ErrorTypeRequired, []string{"name the qualified type"}},
			},
		},
		{
			name: "a subtype must not contain a dot, a type no control character",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: "Order\tCreated"}
  - {type: V, subtype: "A.B", subtypeFrom: {header: ce_result}}`,
			want: []wantErr{
				{"spec.sequences[0].messages[0].type", field.ErrorTypeInvalid, []string{"must not contain control characters"}},
				{"spec.sequences[0].messages[1].subtype", field.ErrorTypeInvalid, []string{"must not contain '.'", "last '.' separates the subtype"}},
			},
		},
		{
			name: "a dotted type and a type with subtype of the same qualified name are ambiguous",
			sequences: `
- name: order
  retention: 24h
  messages:
  - {type: com.example.order.validated, subtype: OK, subtypeFrom: {header: ce_result}}
- name: audit
  retention: 24h
  messages:
  - {type: com.example.order.validated.OK}
  - {type: com.example.order, subtype: validated, subtypeFrom: {header: ce_step}}
  - {type: com.example.order.validated}`,
			want: []wantErr{
				{"spec.sequences[1].messages[0].type", field.ErrorTypeInvalid, []string{
					"the qualified type com.example.order.validated.OK would be ambiguous",
					"spec.sequences[0].messages[0] declares type com.example.order.validated with subtype OK",
					"type com.example.order.validated.OK without subtype"}},
				{"spec.sequences[1].messages[2].type", field.ErrorTypeInvalid, []string{
					"the qualified type com.example.order.validated would be ambiguous",
					"spec.sequences[1].messages[1] declares type com.example.order with subtype validated"}},
			},
		},
		{
			name: "missing sequence name and message type",
			sequences: `
- retention: 24h
  messages:
  - {type: ""}`,
			want: []wantErr{
				{"spec.sequences[0].name", field.ErrorTypeRequired, []string{"name the sequence"}},
				{"spec.sequences[0].messages[0].type", field.ErrorTypeRequired, []string{"set the message type"}},
			},
		},
		{
			name: "every error is collected, not only the first",
			sequences: `
- name: order
  retention: 10s
  messages:
  - {type: A, filter: "1 +"}
  - {type: B, releaseCondition: {predecessor: Z}}
- name: order
  retention: 24h
  messages: []`,
			want: []wantErr{
				{"spec.sequences[0].retention", field.ErrorTypeInvalid, nil},
				{"spec.sequences[0].messages[0].filter", field.ErrorTypeInvalid, nil},
				{"spec.sequences[1].name", field.ErrorTypeDuplicate, nil},
				{"spec.sequences[1].messages", field.ErrorTypeRequired, nil},
				{"spec.sequences[0].messages[1].releaseCondition.predecessor", field.ErrorTypeNotFound, nil},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, errs := Compile(specOf(t, tt.sequences))
			if set != nil {
				t.Errorf("Compile returned a set together with errors")
			}
			assertErrors(t, errs, tt.want)
		})
	}
}

func TestCompileRejectsAMissingSpecOrSequences(t *testing.T) {
	set, errs := Compile(nil)
	if set != nil {
		t.Error("Compile(nil) returned a set")
	}
	assertErrors(t, errs, []wantErr{{"spec", field.ErrorTypeRequired, nil}})

	set, errs = Compile(&v1alpha1.SequentialInboxSpec{})
	if set != nil {
		t.Error("Compile of a spec without sequences returned a set")
	}
	assertErrors(t, errs, []wantErr{{"spec.sequences", field.ErrorTypeRequired, []string{"at least one sequence"}}})
}

func assertErrors(t *testing.T, errs field.ErrorList, want []wantErr) {
	t.Helper()
	if len(errs) != len(want) {
		t.Errorf("got %d errors, want %d:\n%s", len(errs), len(want), errs.ToAggregate())
	}
	for i := range min(len(errs), len(want)) {
		got, w := errs[i], want[i]
		if got.Field != w.field || got.Type != w.typ {
			t.Errorf("error %d is %s %s, want %s %s: %v", i, got.Field, got.Type, w.field, w.typ, got)
		}
		for _, phrase := range w.contains {
			if !strings.Contains(got.Error(), phrase) {
				t.Errorf("error %d %q does not contain %q", i, got.Error(), phrase)
			}
		}
	}
}

func TestCompileBuildsTheModel(t *testing.T) {
	set, errs := Compile(specOf(t, `
- name: order
  retention: 24h
  messages:
  - {type: OrderCreated, filter: "headers['tenant'] == 'ch'"}
  - type: OrderValidated
    subtype: OK
    subtypeFrom: {jsonPointer: /result}
    contextId: {jsonPointer: /orderId}
    idempotenceId: {header: messageId}
    releaseCondition: {predecessor: OrderCreated}
  - {type: OrderValidated, subtype: FAILED, subtypeFrom: {jsonPointer: /result}, contextId: {header: order}, releaseCondition: {predecessor: OrderCreated}}
- name: billing
  retention: 1m
  duplicateProtection: 168h
  keepDeliveredRecords: true
  messages:
  - {type: InvoiceSent, contextId: {key: true}}
  - {type: Audit, subtype: OK, subtypeFrom: {key: true}}
- name: audit
  retention: 1h
  duplicateProtection: 0s
  messages:
  - {type: Checked}`))
	if len(errs) > 0 {
		t.Fatalf("Compile: %v", errs.ToAggregate())
	}

	order, ok := set.Sequence("order")
	// Unset, the duplicate protection is the retention; set, it is what the user chose, 0s included.
	if !ok || order.Retention != 24*time.Hour || order.DuplicateProtection != 24*time.Hour || order.KeepDeliveredRecords || len(order.Types) != 3 {
		t.Fatalf("sequence order = %+v, %v", order, ok)
	}
	billing, ok := set.Sequence("billing")
	if !ok || billing.Retention != time.Minute || billing.DuplicateProtection != 168*time.Hour || !billing.KeepDeliveredRecords || len(billing.Types) != 2 {
		t.Fatalf("sequence billing = %+v, %v", billing, ok)
	}
	if audit, ok := set.Sequence("audit"); !ok || audit.DuplicateProtection != 0 {
		t.Fatalf("sequence audit = %+v, %v", audit, ok)
	}
	if names := []string{set.Sequences()[0].Name, set.Sequences()[1].Name}; names[0] != "order" || names[1] != "billing" {
		t.Errorf("sequences are %v, want declaration order [order billing]", names)
	}

	created := mustLookup(t, set, "OrderCreated")
	if created.Condition != nil || created.SubtypeFrom != nil || created.Sequence != order {
		t.Errorf("OrderCreated = %+v, want no condition, no subtype source, sequence order", created)
	}
	if created.ContextID != (sequence.Source{Kind: sequence.FromKey}) {
		t.Errorf("default context ID source = %v, want the record key", created.ContextID)
	}
	if created.IdempotenceID != (sequence.Source{Kind: sequence.FromHeader, Name: "ce_id"}) {
		t.Errorf("default idempotence ID source = %v, want header ce_id", created.IdempotenceID)
	}
	if created.Filter != "headers['tenant'] == 'ch'" {
		t.Errorf("filter = %q", created.Filter)
	}

	ok1 := mustLookup(t, set, "OrderValidated.OK")
	if ok1.Type != "OrderValidated" || ok1.Subtype != "OK" || ok1.Filter != "" {
		t.Errorf("OrderValidated.OK = %+v", ok1)
	}
	if ok1.SubtypeFrom == nil || *ok1.SubtypeFrom != (sequence.Source{Kind: sequence.FromJSONPointer, Name: "/result"}) {
		t.Errorf("subtype source = %v, want payload /result", ok1.SubtypeFrom)
	}
	if ok1.ContextID != (sequence.Source{Kind: sequence.FromJSONPointer, Name: "/orderId"}) ||
		ok1.IdempotenceID != (sequence.Source{Kind: sequence.FromHeader, Name: "messageId"}) {
		t.Errorf("sources = %v, %v", ok1.ContextID, ok1.IdempotenceID)
	}
	if ok1.Condition == nil || ok1.Condition.String() != "OrderCreated" {
		t.Errorf("condition = %v, want OrderCreated", ok1.Condition)
	}
	failed := mustLookup(t, set, "OrderValidated.FAILED")
	if failed.ContextID != (sequence.Source{Kind: sequence.FromHeader, Name: "order"}) {
		t.Errorf("context ID of OrderValidated.FAILED = %v, want header order", failed.ContextID)
	}
	if got := set.TypesOf("OrderValidated"); len(got) != 2 || got[0] != ok1 || got[1] != failed {
		t.Errorf("TypesOf(OrderValidated) = %v, want both subtypes in declaration order", got)
	}
	if _, ok := set.Lookup("OrderValidated"); ok {
		t.Error("the unqualified OrderValidated resolves, but it is only declared with subtypes")
	}
	if invoice := mustLookup(t, set, "InvoiceSent"); invoice.ContextID != (sequence.Source{Kind: sequence.FromKey}) || invoice.Sequence != billing {
		t.Errorf("InvoiceSent = %+v", invoice)
	}
	if audit := mustLookup(t, set, "Audit.OK"); audit.SubtypeFrom == nil || audit.SubtypeFrom.Kind != sequence.FromKey {
		t.Errorf("Audit.OK subtype source = %v, want the record key", audit.SubtypeFrom)
	}
}

func TestCompileAcceptsValidDeclarations(t *testing.T) {
	tests := []struct {
		name      string
		sequences string
	}{
		{"message without condition", `
- name: s
  retention: 1m
  messages: [{type: A}]`},
		{"same base type with different subtypes in two sequences", `
- name: s
  retention: 1h
  messages: [{type: V, subtype: OK, subtypeFrom: {header: ce_result}}]
- name: t
  retention: 1h
  messages: [{type: V, subtype: FAILED, subtypeFrom: {header: ce_result}}]`},
		{"diamond is not a cycle", `
- name: s
  retention: 1h
  messages:
  - {type: A}
  - {type: B, releaseCondition: {predecessor: A}}
  - {type: C, releaseCondition: {predecessor: A}}
  - {type: D, releaseCondition: {or: [{predecessor: B}, {and: [{predecessor: A}, {predecessor: C}]}]}}`},
		{"predecessor declared later in the list", `
- name: s
  retention: 1h
  messages:
  - {type: B, releaseCondition: {predecessor: A}}
  - {type: A}`},
		{"JSON pointers with escapes and the empty key", `
- name: s
  retention: 1h
  messages:
  - {type: A, contextId: {jsonPointer: "/a~0b/c~1d/0"}}
  - {type: B, contextId: {jsonPointer: "/"}}`},
		{"CloudEvents types with dots, with and without subtypes, as predecessors", `
- name: order
  retention: 1h
  messages:
  - {type: com.example.order.created}
  - {type: com.example.order.validated, subtype: OK, subtypeFrom: {header: ce_result}, releaseCondition: {predecessor: com.example.order.created}}
  - {type: com.example.order.validated, subtype: FAILED, subtypeFrom: {header: ce_result}}
  - {type: com.example.order, subtype: archived, subtypeFrom: {header: ce_step}}
  - {type: "com.example.order.paid v2", releaseCondition: {predecessor: com.example.order.validated.OK}}`},
		{"the same operand in different branches", `
- name: s
  retention: 1h
  messages:
  - {type: A}
  - {type: B}
  - {type: C}
  - {type: D, releaseCondition: {or: [{and: [{predecessor: A}, {predecessor: B}]}, {and: [{predecessor: A}, {predecessor: C}]}]}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, errs := Compile(specOf(t, tt.sequences))
			if len(errs) > 0 {
				t.Fatalf("Compile: %v", errs.ToAggregate())
			}
			if set == nil {
				t.Fatal("Compile returned no set and no errors")
			}
		})
	}
}

// TestNestedConditionsHold evaluates compiled conditions against every combination of processed
// types. The API nests three levels (and/or, and/or, predecessor), so a and (b or (c and d)) is
// declared in its equivalent form (a and b) or (a and c and d).
func TestNestedConditionsHold(t *testing.T) {
	tests := []struct {
		name      string
		condition string
		want      func(a, b, c, d bool) bool
		rendered  string
	}{
		{
			name:      "a and (b or (c and d))",
			condition: `{or: [{and: [{predecessor: a}, {predecessor: b}]}, {and: [{predecessor: a}, {predecessor: c}, {predecessor: d}]}]}`,
			want:      func(a, b, c, d bool) bool { return a && (b || (c && d)) },
			rendered:  "(a and b) or (a and c and d)",
		},
		{
			name:      "a and (b or c) and d",
			condition: `{and: [{predecessor: a}, {or: [{predecessor: b}, {predecessor: c}]}, {predecessor: d}]}`,
			want:      func(a, b, c, d bool) bool { return a && (b || c) && d },
			rendered:  "a and (b or c) and d",
		},
		{
			name:      "a or (b and c) or d",
			condition: `{or: [{predecessor: a}, {and: [{predecessor: b}, {predecessor: c}]}, {predecessor: d}]}`,
			want:      func(a, b, c, d bool) bool { return a || (b && c) || d },
			rendered:  "a or (b and c) or d",
		},
		{
			name:      "single predecessor",
			condition: `{predecessor: c}`,
			want:      func(_, _, c, _ bool) bool { return c },
			rendered:  "c",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, errs := Compile(specOf(t, `
- name: s
  retention: 1h
  messages:
  - {type: a}
  - {type: b}
  - {type: c}
  - {type: d}
  - {type: x, releaseCondition: `+tt.condition+`}`))
			if len(errs) > 0 {
				t.Fatalf("Compile: %v", errs.ToAggregate())
			}
			cond := mustLookup(t, set, "x").Condition
			if cond.String() != tt.rendered {
				t.Errorf("condition renders as %q, want %q", cond, tt.rendered)
			}
			for bits := range 16 {
				a, b, c, d := bits&1 != 0, bits&2 != 0, bits&4 != 0, bits&8 != 0
				processed := map[string]bool{"a": a, "b": b, "c": c, "d": d}
				if got, want := cond.Holds(processed), tt.want(a, b, c, d); got != want {
					t.Errorf("Holds(a=%v b=%v c=%v d=%v) = %v, want %v", a, b, c, d, got, want)
				}
			}
		})
	}
}

func TestLongestChainOfTheSet(t *testing.T) {
	set, errs := Compile(specOf(t, `
- name: short
  retention: 1h
  messages:
  - {type: A}
  - {type: B, releaseCondition: {predecessor: A}}
- name: long
  retention: 1h
  messages:
  - {type: C}
  - {type: D, releaseCondition: {predecessor: C}}
  - {type: E, releaseCondition: {predecessor: D}}`))
	if len(errs) > 0 {
		t.Fatalf("Compile: %v", errs.ToAggregate())
	}
	if got := LongestChain(set); got != 3 {
		t.Errorf("LongestChain = %d, want 3 (C releases D releases E)", got)
	}
}

func mustLookup(t *testing.T, set *sequence.Set, qualified string) *sequence.MessageType {
	t.Helper()
	mt, ok := set.Lookup(qualified)
	if !ok {
		t.Fatalf("%s is not in the set", qualified)
	}
	return mt
}

// TestCompileNamesEveryMalformedDuration decodes a spec as the operator's cache would decode one
// stored before the API server validated durations: decoding succeeds, Compile names each field.
func TestCompileNamesEveryMalformedDuration(t *testing.T) {
	var spec v1alpha1.SequentialInboxSpec
	err := yaml.UnmarshalStrict([]byte(`
database: {idleLockTimeout: 30}
sink: {timeout: tenseconds, initialBackoff: 200ms}
housekeeping: {interval: "", expiryDelay: 1h, maxDuration: [1m]}
sequences:
- name: order
  retention: a week
  duplicateProtection: forever
  messages: [{type: OrderCreated}]
`), &spec)
	if err != nil {
		t.Fatalf("decoding a spec with malformed durations failed: %v", err)
	}
	set, errs := Compile(&spec)
	if set != nil {
		t.Error("Compile returned a set for a spec with malformed durations")
	}
	assertErrors(t, errs, []wantErr{
		{"spec.database.idleLockTimeout", field.ErrorTypeInvalid, []string{"30", "not a duration"}},
		{"spec.sink.timeout", field.ErrorTypeInvalid, []string{`"tenseconds"`, "not a duration"}},
		{"spec.housekeeping.interval", field.ErrorTypeInvalid, []string{`""`, "not a duration"}},
		{"spec.housekeeping.maxDuration", field.ErrorTypeInvalid, []string{"1m", "not a duration"}},
		{"spec.sequences[0].retention", field.ErrorTypeInvalid, []string{`"a week"`, "not a duration"}},
		{"spec.sequences[0].duplicateProtection", field.ErrorTypeInvalid, []string{`"forever"`, "not a duration"}},
	})
	if spec.Sink.InitialBackoff.Duration != 200*time.Millisecond || spec.Housekeeping.ExpiryDelay.Duration != time.Hour {
		t.Errorf("valid durations beside the malformed ones decoded as %s and %s", spec.Sink.InitialBackoff, spec.Housekeeping.ExpiryDelay)
	}
}

// TestSplitReadsStoredNamesByTheDeclaration reads qualified types as the engine stores them back
// into type and subtype: declared names by their declaration, names stored before types could
// contain dots as they were, a subtype no longer declared by its declared type, anything else as
// a type. Joining the parts again always gives the stored name.
func TestSplitReadsStoredNamesByTheDeclaration(t *testing.T) {
	set, errs := Compile(specOf(t, `
- name: order
  retention: 1h
  messages:
  - {type: OrderCreated}
  - {type: OrderValidated, subtype: STOCK_AVAILABLE, subtypeFrom: {header: ce_result}}
  - {type: com.example.order.created}
  - {type: com.example.order.validated, subtype: OK, subtypeFrom: {header: ce_result}}
  - {type: com.example.order, subtype: archived, subtypeFrom: {header: ce_step}}`))
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	for stored, want := range map[string][2]string{
		"OrderCreated":                      {"OrderCreated", ""},
		"OrderValidated.STOCK_AVAILABLE":    {"OrderValidated", "STOCK_AVAILABLE"},
		"OrderValidated.GONE":               {"OrderValidated", "GONE"},
		"com.example.order.created":         {"com.example.order.created", ""},
		"com.example.order.validated.OK":    {"com.example.order.validated", "OK"},
		"com.example.order.validated.LATER": {"com.example.order.validated", "LATER"},
		"com.example.order.archived":        {"com.example.order", "archived"},
		"com.example.order.shipped":         {"com.example.order", "shipped"},
		"com.example.invoice.sent":          {"com.example.invoice.sent", ""},
		"Undeclared":                        {"Undeclared", ""},
	} {
		typ, subtype := set.Split(stored)
		if typ != want[0] || subtype != want[1] {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", stored, typ, subtype, want[0], want[1])
		}
		if again := sequence.Qualify(typ, subtype); again != stored {
			t.Errorf("Qualify(Split(%q)) = %q", stored, again)
		}
	}
}
