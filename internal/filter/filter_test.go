package filter

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestCompileRejectsInvalidExpressionsWithAClearMessage(t *testing.T) {
	tests := []struct {
		name string
		expr string
		// want are substrings the error must contain.
		want []string
	}{
		{"syntax error names the position", "payload.test ==", []string{`"payload.test =="`, "column 16: Syntax error"}},
		{"empty expression", "", []string{"Syntax error"}},
		{"error on a later line names the line", "type == 'A' &&\n  payload.", []string{"line 2 column 11: Syntax error"}},
		{"undeclared variable", "value == 'x'", []string{"undeclared reference to 'value'", "type, subtype, headers, key and payload"}},
		{"string result", "headers['ce_source']", []string{"yields string, not bool"}},
		{"dyn result from the payload", "payload.test", []string{"yields dyn, not bool", "== true"}},
		{"int result", "size(key)", []string{"yields int, not bool"}},
		{"header values are strings", "headers['n'] > 3", []string{"no matching overload"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(tt.expr)
			if err == nil {
				t.Fatalf("Compile(%q) = %v, want an error", tt.expr, p)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("Compile(%q) error spans several lines, it must fit a status condition: %q", tt.expr, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Compile(%q) error %q does not contain %q", tt.expr, err, w)
				}
			}
		})
	}
}

func TestEvalDecidesOverTheRecord(t *testing.T) {
	order := Input{
		Type:    "OrderCreated",
		Headers: map[string]string{"ce_source": "shop", "tenant": "ch"},
		Key:     "order-1",
		Payload: []byte(`{"orderId":"o-1","test":true,"quantity":3,"total":10.5,"customer":{"country":"CH"}}`),
	}
	realOrder := order
	realOrder.Payload = []byte(`{"orderId":"o-2","quantity":1}`)
	notJSON := order
	notJSON.Payload = []byte("not json")
	noHeaders := order
	noHeaders.Headers = nil
	validated := order
	validated.Type, validated.Subtype = "OrderValidated", "STOCK_AVAILABLE"

	tests := []struct {
		name string
		expr string
		in   Input
		want bool
	}{
		{"header matches", "headers['tenant'] == 'ch'", order, true},
		{"header differs", "headers['tenant'] == 'de'", order, false},
		{"header presence", "'tenant' in headers", order, true},
		{"absent header", "'trace' in headers", order, false},
		{"no headers at all", "'tenant' in headers", noHeaders, false},
		{"type", "type == 'OrderCreated'", order, true},
		{"subtype", "subtype == 'STOCK_AVAILABLE'", validated, true},
		{"empty subtype", "subtype == ''", order, true},
		{"key", "key.startsWith('order-')", order, true},
		{"payload bool field", "payload.test == true", order, true},
		{"payload number as int literal", "payload.quantity == 3", order, true},
		{"payload number compared with a fraction", "payload.total > 10", order, true},
		{"JSON numbers are doubles, int() converts", "int(payload.quantity) % 2 == 1", order, true},
		{"nested payload field", "payload.customer.country == 'CH'", order, true},
		{"test order is not sequenced", "!(has(payload.test) && payload.test == true)", order, false},
		{"real order without the field is sequenced", "!(has(payload.test) && payload.test == true)", realOrder, true},
		{"has is false for a missing field", "has(payload.test)", realOrder, false},
		{"has is false when the payload is not JSON", "has(payload.test)", notJSON, false},
		{"non-JSON payload is null", "payload == null", notJSON, true},
		{"JSON payload is not null", "payload == null", order, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(tt.expr)
			if err != nil {
				t.Fatalf("Compile(%q): %v", tt.expr, err)
			}
			got, err := p.Eval(tt.in)
			if err != nil {
				t.Fatalf("Eval(%q): %v", tt.expr, err)
			}
			if got != tt.want {
				t.Errorf("Eval(%q) = %v, want %v", tt.expr, got, tt.want)
			}
		})
	}
}

func TestEvalReturnsErrorsInsteadOfDeciding(t *testing.T) {
	var big strings.Builder
	big.WriteString("[0")
	for i := 1; i < 1000; i++ {
		fmt.Fprintf(&big, ",%d", i)
	}
	big.WriteString("]")

	tests := []struct {
		name    string
		expr    string
		payload string
		want    string
	}{
		{"missing payload field without has", "payload.test == true", `{"orderId":"o-1"}`, "no such key: test"},
		{"field of a non-JSON payload", "payload.test == true", `plain text`, "no such key: test"},
		{"runtime type mismatch", "payload.orderId > 3", `{"orderId":"o-1"}`, "no such overload"},
		{"integer arithmetic on a JSON number", "payload.n % 2 == 0", `{"n":4}`, "no such overload"},
		{"cost limit", "payload.all(x, payload.all(y, x + y >= 0))", big.String(), "cost limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(tt.expr)
			if err != nil {
				t.Fatalf("Compile(%q): %v", tt.expr, err)
			}
			got, err := p.Eval(Input{Payload: []byte(tt.payload)})
			if err == nil {
				t.Fatalf("Eval(%q) = %v, want an error containing %q", tt.expr, got, tt.want)
			}
			if got {
				t.Errorf("Eval(%q) returned true together with the error %v", tt.expr, err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.expr) {
				t.Errorf("Eval(%q) error %q should name the expression and contain %q", tt.expr, err, tt.want)
			}
		})
	}
}

func TestProgramEvaluatesConcurrently(t *testing.T) {
	p, err := Compile("int(payload.n) % 2 == 0 && headers['n'] == string(int(payload.n))")
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, iterations = 8, 200
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for i := range iterations {
				n := g*iterations + i
				in := Input{Headers: map[string]string{"n": fmt.Sprint(n)}, Payload: fmt.Appendf(nil, `{"n":%d}`, n)}
				got, err := p.Eval(in)
				if err != nil {
					errs <- fmt.Errorf("n=%d: %w", n, err)
					return
				}
				if got != (n%2 == 0) {
					errs <- fmt.Errorf("n=%d: got %v, want %v", n, got, n%2 == 0)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func BenchmarkEval(b *testing.B) {
	in := Input{
		Type:    "OrderCreated",
		Headers: map[string]string{"ce_id": "1", "ce_type": "OrderCreated", "tenant": "ch"},
		Key:     "order-1",
		Payload: []byte(`{"orderId":"o-1","test":false,"quantity":3,"lines":[{"sku":"a"},{"sku":"b"}]}`),
	}
	for _, expr := range []string{
		"headers['tenant'] == 'ch'",
		"!(has(payload.test) && payload.test == true)",
	} {
		p, err := Compile(expr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(expr, func(b *testing.B) {
			for b.Loop() {
				if _, err := p.Eval(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCompile(b *testing.B) {
	for b.Loop() {
		if _, err := Compile("!(has(payload.test) && payload.test == true)"); err != nil {
			b.Fatal(err)
		}
	}
}
