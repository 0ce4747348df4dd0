package decode

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/inbox"
)

// spec declares one type per way of reading a record: context ID from the payload, a header and
// the key; a subtype from a header; a filter; a custom idempotence ID.
const spec = `
sequences:
- name: order
  retention: 1h
  messages:
  - type: OrderCreated
    contextId: {jsonPointer: /order/id}
    filter: "!(has(payload.test) && payload.test == true)"
  - type: OrderValidated
    subtype: OK
    subtypeFrom: {header: ce_result}
    contextId: {jsonPointer: /order/id}
    releaseCondition: {predecessor: OrderCreated}
  - type: OrderValidated
    subtype: REJECTED
    subtypeFrom: {header: ce_result}
    contextId: {jsonPointer: /order/id}
    releaseCondition: {predecessor: OrderCreated}
- name: shipment
  retention: 1h
  messages:
  - type: ShipmentBooked
    contextId: {header: ce_subject}
    idempotenceId: {jsonPointer: /bookingNo}
  - type: ShipmentLeft
    releaseCondition: {predecessor: ShipmentBooked}
`

func newDecoder(t testing.TB) *Decoder {
	t.Helper()
	var s v1alpha1.SequentialInboxSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	set, errs := declaration.Compile(&s)
	if len(errs) > 0 {
		t.Fatalf("compile: %v", errs.ToAggregate())
	}
	d, err := New(set)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// binary builds a binary-mode record from attribute headers (without the ce_ prefix).
func binary(key, value string, attrs ...string) *kgo.Record {
	r := &kgo.Record{Topic: "orders", Partition: 2, Offset: 40, Value: []byte(value)}
	if key != "" {
		r.Key = []byte(key)
	}
	base := map[string]string{"specversion": "1.0", "source": "/shop"}
	for i := 0; i+1 < len(attrs); i += 2 {
		base[attrs[i]] = attrs[i+1]
	}
	for _, name := range []string{"specversion", "id", "source", "type", "subject", "result"} {
		if v, ok := base[name]; ok && v != "<absent>" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "ce_" + name, Value: []byte(v)})
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: "content-type", Value: []byte("application/json")})
	return r
}

func structured(envelope string, extra ...kgo.RecordHeader) *kgo.Record {
	return &kgo.Record{
		Topic: "orders", Value: []byte(envelope),
		Headers: append([]kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json; charset=utf-8")}}, extra...),
	}
}

func TestDecode(t *testing.T) {
	d := newDecoder(t)
	tests := []struct {
		name   string
		record *kgo.Record
		want   inbox.Record // only the decoded fields are compared
	}{
		{
			name:   "binary mode, context ID from a JSON pointer, idempotence ID from ce_id",
			record: binary("k1", `{"order":{"id":"o-1"}}`, "id", "e-1", "type", "OrderCreated"),
			want:   inbox.Record{Type: "OrderCreated", IdempotenceID: "e-1", ContextID: "o-1", Sequenced: true},
		},
		{
			name:   "numeric context ID is read as its JSON text",
			record: binary("", `{"order":{"id":42}}`, "id", "e-2", "type", "OrderCreated"),
			want:   inbox.Record{Type: "OrderCreated", IdempotenceID: "e-2", ContextID: "42", Sequenced: true},
		},
		{
			name:   "filter false delivers without sequencing",
			record: binary("", `{"order":{"id":"o-1"},"test":true}`, "id", "e-3", "type", "OrderCreated"),
			want:   inbox.Record{Type: "OrderCreated", IdempotenceID: "e-3", ContextID: "o-1", Sequenced: false},
		},
		{
			name:   "subtype from a header selects the qualified type",
			record: binary("", `{"order":{"id":"o-1"}}`, "id", "e-4", "type", "OrderValidated", "result", "REJECTED"),
			want:   inbox.Record{Type: "OrderValidated", Subtype: "REJECTED", IdempotenceID: "e-4", ContextID: "o-1", Sequenced: true},
		},
		{
			name:   "context ID from a header, idempotence ID from the payload",
			record: binary("", `{"bookingNo":"B7"}`, "id", "e-5", "type", "ShipmentBooked", "subject", "s-9"),
			want:   inbox.Record{Type: "ShipmentBooked", IdempotenceID: "B7", ContextID: "s-9", Sequenced: true},
		},
		{
			name:   "context ID from the key (the default)",
			record: binary("s-9", `not json at all`, "id", "e-6", "type", "ShipmentLeft"),
			want:   inbox.Record{Type: "ShipmentLeft", IdempotenceID: "e-6", ContextID: "s-9", Sequenced: true},
		},
		{
			name:   "empty context ID delivers without sequencing and needs no idempotence ID",
			record: binary("", `{"order":{}}`, "id", "e-7", "type", "OrderCreated"),
			want:   inbox.Record{Type: "OrderCreated", IdempotenceID: "e-7", ContextID: "", Sequenced: true},
		},
		{
			name: "structured mode maps attributes to ce_ headers and data to the payload",
			record: structured(`{"specversion":"1.0","id":"e-8","source":"/shop","type":"OrderValidated",
				"result":"OK","datacontenttype":"application/json","data":{"order":{"id":"o-3"}}}`),
			want: inbox.Record{Type: "OrderValidated", Subtype: "OK", IdempotenceID: "e-8", ContextID: "o-3", Sequenced: true},
		},
		{
			name: "structured mode with data_base64",
			record: structured(`{"specversion":"1.0","id":"e-9","source":"/shop","type":"ShipmentBooked",
				"subject":"s-1","data_base64":"eyJib29raW5nTm8iOiJCOCJ9"}`),
			want: inbox.Record{Type: "ShipmentBooked", IdempotenceID: "B8", ContextID: "s-1", Sequenced: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := d.Decode(tt.record, time.Unix(100, 0))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if got.Type != tt.want.Type || got.Subtype != tt.want.Subtype || got.IdempotenceID != tt.want.IdempotenceID ||
				got.ContextID != tt.want.ContextID || got.Sequenced != tt.want.Sequenced {
				t.Fatalf("decoded type=%q subtype=%q idempotence=%q context=%q sequenced=%v, want type=%q subtype=%q idempotence=%q context=%q sequenced=%v",
					got.Type, got.Subtype, got.IdempotenceID, got.ContextID, got.Sequenced,
					tt.want.Type, tt.want.Subtype, tt.want.IdempotenceID, tt.want.ContextID, tt.want.Sequenced)
			}
			if got.Origin.Topic != tt.record.Topic || got.Origin.Offset != tt.record.Offset || got.Origin.MessageID == "" {
				t.Fatalf("origin %+v does not name the record", got.Origin)
			}
		})
	}
}

func TestDecodeBinaryModeKeepsRecordByteForByte(t *testing.T) {
	d := newDecoder(t)
	r := binary("k", `{"order":{"id":"o-1"}}`, "id", "e-1", "type", "OrderCreated")
	got, err := d.Decode(r, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Value) != string(r.Value) || string(got.Key) != string(r.Key) || len(got.Headers) != len(r.Headers) {
		t.Fatalf("record changed: %+v", got)
	}
	for i, h := range r.Headers {
		if got.Headers[i].Key != h.Key || string(got.Headers[i].Value) != string(h.Value) {
			t.Fatalf("header %d: got %s=%s, want %s=%s", i, got.Headers[i].Key, got.Headers[i].Value, h.Key, h.Value)
		}
	}
}

func TestDecodeStructuredModeBecomesBinaryMode(t *testing.T) {
	d := newDecoder(t)
	r := structured(`{"specversion":"1.0","id":"e-1","source":"/shop","type":"OrderCreated","seq":7,
		"datacontenttype":"application/json","data":{"order":{"id":"o-1"}}}`,
		kgo.RecordHeader{Key: "traceparent", Value: []byte("00-abc-def-01")})
	got, err := d.Decode(r, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	headers := HeaderMap(got.Headers)
	want := map[string]string{
		"ce_specversion": "1.0", "ce_id": "e-1", "ce_source": "/shop", "ce_type": "OrderCreated", "ce_seq": "7",
		"content-type": "application/json", "traceparent": "00-abc-def-01",
	}
	if len(headers) != len(want) {
		t.Fatalf("headers %v, want exactly %v", headers, want)
	}
	for k, v := range want {
		if headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, headers[k], v)
		}
	}
	if string(got.Value) != `{"order":{"id":"o-1"}}` {
		t.Errorf("payload %s, want the event data", got.Value)
	}
}

func TestDecodeErrors(t *testing.T) {
	d := newDecoder(t)
	tests := []struct {
		name      string
		record    *kgo.Record
		wantClass string
	}{
		{"no CloudEvent headers", &kgo.Record{Value: []byte(`{}`)}, ClassInvalidCloudEvent},
		{"specversion 0.3", binary("", `{}`, "specversion", "0.3", "id", "e", "type", "OrderCreated"), ClassInvalidCloudEvent},
		{"missing ce_id", binary("", `{"order":{"id":"o"}}`, "type", "OrderCreated"), ClassMissingID},
		{"missing ce_source", binary("", `{}`, "id", "e", "type", "OrderCreated", "source", "<absent>"), ClassInvalidCloudEvent},
		{"missing ce_type", binary("", `{}`, "id", "e"), ClassMissingType},
		{"undeclared type", binary("", `{}`, "id", "e", "type", "InvoiceSent"), ClassUndeclaredType},
		{"undeclared subtype", binary("", `{"order":{"id":"o"}}`, "id", "e", "type", "OrderValidated", "result", "MAYBE"), ClassInvalidSubtype},
		{"missing subtype", binary("", `{"order":{"id":"o"}}`, "id", "e", "type", "OrderValidated"), ClassInvalidSubtype},
		{"bad JSON payload for a pointer", binary("", `{"order":`, "id", "e", "type", "OrderValidated", "result", "OK"), ClassInvalidJSON},
		{"filter passes bad JSON, the context pointer cannot read it", binary("", `{"order":`, "id", "e", "type", "OrderCreated"), ClassInvalidJSON},
		{"filter cannot decide on a JSON array", binary("", `[1]`, "id", "e", "type", "OrderCreated"), ClassFilterError},
		{"context ID is an object", binary("", `{"order":{"id":{"x":1}}}`, "id", "e", "type", "OrderValidated", "result", "OK"), ClassInvalidField},
		{"missing idempotence ID", binary("", `{}`, "id", "e", "type", "ShipmentBooked", "subject", "s-1"), ClassMissingIdempotenceID},
		{"structured envelope not JSON", structured(`{"specversion":`), ClassInvalidJSON},
		{"structured data and data_base64", structured(`{"specversion":"1.0","id":"e","source":"/s","type":"OrderCreated","data":{},"data_base64":"e30="}`), ClassInvalidCloudEvent},
		{"structured missing id", structured(`{"specversion":"1.0","source":"/s","type":"OrderCreated","data":{"order":{"id":"o"}}}`), ClassMissingID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := d.Decode(tt.record, time.Now())
			var de *Error
			if !errors.As(err, &de) {
				t.Fatalf("Decode returned %v (record %+v), want a *decode.Error of class %s", err, got, tt.wantClass)
			}
			if de.Class != tt.wantClass {
				t.Fatalf("class %s (%v), want %s", de.Class, err, tt.wantClass)
			}
		})
	}
}

// TestDecodeRefusesIDsPostgreSQLCannotStore checks every ID the inbox stores or indexes against
// what PostgreSQL text and its B-tree indexes take, and that the reason names the limit.
func TestDecodeRefusesIDsPostgreSQLCannotStore(t *testing.T) {
	d := newDecoder(t)
	long := strings.Repeat("x", MaxIDBytes+1)
	withHeader := func(r *kgo.Record, key, value string) *kgo.Record {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
		return r
	}
	tests := []struct {
		name        string
		record      *kgo.Record
		wantClass   string
		wantMessage string
	}{
		{"ce_id with 0xFF", binary("", `{"order":{"id":"o"}}`, "id", "a\xff", "type", "OrderCreated"), ClassInvalidID, "not valid UTF-8 (byte 0xFF at byte 1)"},
		{"ce_id with NUL", binary("", `{"order":{"id":"o"}}`, "id", "a\x00", "type", "OrderCreated"), ClassInvalidID, "NUL byte at byte 1"},
		{"ce_id too long", binary("", `{"order":{"id":"o"}}`, "id", long, "type", "OrderCreated"), ClassInvalidID, "at most 1024 bytes"},
		{"context ID with NUL", binary("", `{"order":{"id":"o\u0000"}}`, "id", "e", "type", "OrderCreated"), ClassInvalidID, "the context ID (at payload /order/id) contains a NUL"},
		{"context ID from a header, invalid UTF-8", binary("", `{"bookingNo":"b"}`, "id", "e", "type", "ShipmentBooked", "subject", "s\xc3"), ClassInvalidID, "the context ID (at header ce_subject) is not valid UTF-8"},
		{"context ID too long", binary("", `{"order":{"id":"`+long+`"}}`, "id", "e", "type", "OrderCreated"), ClassInvalidID, "1025 bytes long"},
		{"idempotence ID too long", binary("", `{"bookingNo":"`+long+`"}`, "id", "e", "type", "ShipmentBooked", "subject", "s-1"), ClassInvalidID, "the idempotence ID (at payload /bookingNo) is 1025 bytes"},
		{"traceparent with NUL", withHeader(binary("", `{"order":{"id":"o"}}`, "id", "e", "type", "OrderCreated"), "traceparent", "00-\x00"), ClassInvalidHeader, "header traceparent contains a NUL"},
		{"header name with NUL", withHeader(binary("", `{"order":{"id":"o"}}`, "id", "e", "type", "OrderCreated"), "x\x00", "v"), ClassInvalidHeader, "header name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.Decode(tt.record, time.Now())
			var de *Error
			if !errors.As(err, &de) || de.Class != tt.wantClass || !strings.Contains(err.Error(), tt.wantMessage) {
				t.Fatalf("Decode: %v, want class %s with a message containing %q", err, tt.wantClass, tt.wantMessage)
			}
		})
	}
	// At the limit, and with multi-byte text, IDs are fine; an unsequenced record's context ID
	// is never stored and not checked.
	atLimit := strings.Repeat("é", MaxIDBytes/2)
	if _, err := d.Decode(binary("", `{"order":{"id":"`+atLimit+`"}}`, "id", atLimit, "type", "OrderCreated"), time.Now()); err != nil {
		t.Fatalf("IDs of exactly %d bytes: %v", MaxIDBytes, err)
	}
	if _, err := d.Decode(binary("", `{"order":{"id":"`+long+`"},"test":true}`, "id", "e", "type", "OrderCreated"), time.Now()); err != nil {
		t.Fatalf("a filtered-out record with a long context ID: %v", err)
	}
}

func TestResolvePointer(t *testing.T) {
	doc, err := parseJSON([]byte(`{"a":{"b/c":[10,{"~d":"x"}]},"n":null}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		pointer   string
		want      string
		wantFound bool
	}{
		{"/a/b~1c/0", "10", true},
		{"/a/b~1c/1/~0d", "x", true},
		{"/a/b~1c/2", "", false},
		{"/a/b~1c/01", "", false},
		{"/missing", "", false},
		{"/n", "", true},
	}
	for _, tt := range tests {
		v, found, err := resolvePointer(doc, tt.pointer)
		if err != nil || found != tt.wantFound {
			t.Errorf("%s: found=%v err=%v, want found=%v", tt.pointer, found, err, tt.wantFound)
			continue
		}
		if !found {
			continue
		}
		text, err := scalarText(v)
		if err != nil || text != tt.want {
			t.Errorf("%s: %q %v, want %q", tt.pointer, text, err, tt.want)
		}
	}
}
