// Package decode turns a Kafka record into the inbox.Record the claim engine processes: it reads
// the CloudEvent (Kafka protocol binding, binary or structured mode), resolves the declared
// message type and subtype, reads idempotence and context ID where the declaration says, and runs
// the type's filter. A record that cannot be decoded yields an *Error whose Class becomes the
// dead-letter reason; decoding never panics on input.
package decode

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/filter"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// Error classes: the dead-letter reason of a record that cannot be decoded
// (docs/design.md#failures-and-dead-letters).
const (
	// ClassInvalidCloudEvent: neither a binary- nor a structured-mode CloudEvent, a missing
	// source, or a specversion other than 1.0.
	ClassInvalidCloudEvent = "InvalidCloudEvent"
	// ClassInvalidJSON: a structured-mode envelope, or a payload a JSON pointer reads, is not JSON.
	ClassInvalidJSON = "InvalidJSON"
	// ClassMissingID: the CloudEvent has no id.
	ClassMissingID = "MissingID"
	// ClassMissingType: the CloudEvent has no type.
	ClassMissingType = "MissingType"
	// ClassUndeclaredType: no sequence declares the type.
	ClassUndeclaredType = "UndeclaredType"
	// ClassInvalidSubtype: the subtype is missing or not declared for the type.
	ClassInvalidSubtype = "InvalidSubtype"
	// ClassFilterError: the type's filter could not decide.
	ClassFilterError = "FilterError"
	// ClassMissingIdempotenceID: a sequenced record without idempotence ID.
	ClassMissingIdempotenceID = "MissingIdempotenceID"
	// ClassInvalidField: a JSON pointer names an object or array where a text value is needed.
	ClassInvalidField = "InvalidField"
	// ClassInvalidID: the CloudEvent id, the idempotence ID or the context ID is not valid
	// UTF-8, contains a NUL byte, or is longer than MaxIDBytes.
	ClassInvalidID = "InvalidID"
	// ClassInvalidHeader: a header the inbox stores (its name, or the trace context's value) is
	// not valid UTF-8 or contains a NUL byte.
	ClassInvalidHeader = "InvalidHeader"
)

// Classes are the error classes, every one a dead-letter reason.
func Classes() []string {
	return []string{ClassInvalidCloudEvent, ClassInvalidJSON, ClassMissingID, ClassMissingType, ClassUndeclaredType,
		ClassInvalidSubtype, ClassFilterError, ClassMissingIdempotenceID, ClassInvalidField, ClassInvalidID, ClassInvalidHeader}
}

// Error is a record that cannot be processed; Class is its dead-letter reason.
type Error struct {
	Class string
	Err   error
}

// Error implements error.
func (e *Error) Error() string { return e.Class + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func fail(class, format string, args ...any) *Error {
	return &Error{Class: class, Err: fmt.Errorf(format, args...)}
}

// Header names of the CloudEvents Kafka protocol binding.
const (
	// AttributePrefix starts the header of every CloudEvents attribute in binary mode (`ce_id`).
	AttributePrefix = "ce_"
	// ContentTypeHeader carries datacontenttype in binary mode and the event format in
	// structured mode.
	ContentTypeHeader = "content-type"
	// StructuredContentType marks a structured-mode record (the JSON event format).
	StructuredContentType = "application/cloudevents+json"
	// SpecVersion is the only CloudEvents version this build reads.
	SpecVersion = "1.0"
)

// Decoder decodes records for one compiled declaration; safe for concurrent use.
type Decoder struct {
	set     *sequence.Set
	filters map[string]*filter.Program // by qualified type
}

// New compiles the filters of the declaration once.
func New(set *sequence.Set) (*Decoder, error) {
	d := &Decoder{set: set, filters: map[string]*filter.Program{}}
	for _, seq := range set.Sequences() {
		for _, mt := range seq.Types {
			if mt.Filter == "" {
				continue
			}
			p, err := filter.Compile(mt.Filter)
			if err != nil {
				return nil, fmt.Errorf("message type %s of sequence %s: %w", mt.Qualified, seq.Name, err)
			}
			d.filters[mt.Qualified] = p
		}
	}
	return d, nil
}

// Decode reads one record. On error the returned Record still carries what could be read (origin,
// raw key/value/headers, type, context ID), so that the dead letter says as much as possible.
//
// The Record holds the event in binary mode: for a structured-mode record, Value is the event's
// data and Headers are the attributes as `ce_<name>` headers plus content-type, so that header
// sources, filters, buffering and the sink read both modes the same way.
func (d *Decoder) Decode(r *kgo.Record, receivedAt time.Time) (inbox.Record, error) {
	rec := inbox.Record{
		Key:        r.Key,
		Value:      r.Value,
		Headers:    make([]inbox.Header, len(r.Headers)),
		Origin:     inbox.Origin{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset},
		ReceivedAt: receivedAt,
	}
	for i, h := range r.Headers {
		rec.Headers[i] = inbox.Header{Key: h.Key, Value: h.Value}
	}
	if isStructured(rec.Headers) {
		if err := toBinaryMode(&rec); err != nil {
			return rec, err
		}
	}
	headers := HeaderMap(rec.Headers)
	rec.Origin.MessageID = headers[AttributePrefix+"id"]
	if err := checkAttributes(headers); err != nil {
		return rec, err
	}
	if err := checkID("the CloudEvent id", rec.Origin.MessageID); err != nil {
		return rec, err
	}
	if err := checkStoredHeaders(rec.Headers); err != nil {
		return rec, err
	}
	rec.Type = headers[AttributePrefix+"type"]
	types := d.set.TypesOf(rec.Type)
	if len(types) == 0 {
		return rec, fail(ClassUndeclaredType, "type %q is not declared by any sequence", rec.Type)
	}
	f := fields{rec: &rec, headers: headers}
	mt, err := resolveSubtype(types, &f)
	if err != nil {
		return rec, err
	}
	rec.Subtype = mt.Subtype
	rec.Sequenced = true
	if p := d.filters[mt.Qualified]; p != nil {
		ok, err := p.Eval(filter.Input{Type: rec.Type, Subtype: rec.Subtype, Headers: headers, Key: string(rec.Key), Payload: rec.Value})
		if err != nil {
			return rec, &Error{Class: ClassFilterError, Err: err}
		}
		rec.Sequenced = ok
	}
	contextID, ctxErr := f.read(mt.ContextID)
	rec.ContextID = contextID
	idempotenceID, idErr := f.read(mt.IdempotenceID)
	rec.IdempotenceID = idempotenceID
	if !rec.Sequenced || rec.ContextID == "" && ctxErr == nil {
		// Delivered without sequencing (docs/design.md#records-that-are-not-sequenced): neither ID
		// is needed.
		return rec, nil
	}
	if ctxErr != nil {
		return rec, ctxErr
	}
	if idErr != nil {
		return rec, idErr
	}
	if rec.IdempotenceID == "" {
		return rec, fail(ClassMissingIdempotenceID, "%s %s has no idempotence ID at %s", mt.Qualified, rec.Origin.MessageID, mt.IdempotenceID)
	}
	if err := checkID(fmt.Sprintf("the context ID (at %s)", mt.ContextID), rec.ContextID); err != nil {
		return rec, err
	}
	return rec, checkID(fmt.Sprintf("the idempotence ID (at %s)", mt.IdempotenceID), rec.IdempotenceID)
}

// MaxIDBytes is the longest CloudEvent id, idempotence ID or context ID the inbox accepts, in
// bytes of UTF-8. The claim and instance keys are B-tree indexed, and PostgreSQL refuses an index
// entry beyond about a third of a page (2.7 KB); 1024 bytes leave room for the message type and
// sequence name beside the ID.
const MaxIDBytes = 1024

// checkID refuses an ID that PostgreSQL could not store or index: invalid UTF-8, a NUL byte, or
// more than MaxIDBytes.
func checkID(what, id string) error {
	if err := checkText(id); err != nil {
		return fail(ClassInvalidID, "%s %s", what, err)
	}
	if len(id) > MaxIDBytes {
		return fail(ClassInvalidID, "%s is %d bytes long; at most %d bytes are allowed", what, len(id), MaxIDBytes)
	}
	return nil
}

// checkText refuses what a PostgreSQL text value cannot hold.
func checkText(s string) error {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return fmt.Errorf("is not valid UTF-8 (byte 0x%02X at byte %d)", s[i], i)
		}
		i += size
	}
	if i := strings.IndexByte(s, 0); i >= 0 {
		return fmt.Errorf("contains a NUL byte at byte %d, which PostgreSQL text cannot hold", i)
	}
	return nil
}

// storedTextHeaders are the headers whose values the inbox stores as text (the trace context of
// a sequenced message).
var storedTextHeaders = map[string]bool{"traceparent": true, "ce_traceparent": true}

// checkStoredHeaders refuses header names, and trace context values, that PostgreSQL could not
// store when the record is buffered.
func checkStoredHeaders(hs []inbox.Header) error {
	for _, h := range hs {
		if err := checkText(h.Key); err != nil {
			return fail(ClassInvalidHeader, "header name %q %s", h.Key, err)
		}
		if storedTextHeaders[h.Key] {
			if err := checkText(string(h.Value)); err != nil {
				return fail(ClassInvalidHeader, "header %s %s", h.Key, err)
			}
		}
	}
	return nil
}

// HeaderMap indexes headers by name; the last of a repeated name wins, as Kafka clients'
// lastHeader does.
func HeaderMap(hs []inbox.Header) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

func checkAttributes(headers map[string]string) error {
	specVersion, ok := headers[AttributePrefix+"specversion"]
	switch {
	case !ok:
		return fail(ClassInvalidCloudEvent, "no %sspecversion header and content-type is not %s: not a CloudEvent", AttributePrefix, StructuredContentType)
	case specVersion != SpecVersion:
		return fail(ClassInvalidCloudEvent, "specversion %q, this build reads %s", specVersion, SpecVersion)
	case headers[AttributePrefix+"id"] == "":
		return fail(ClassMissingID, "the CloudEvent has no id")
	case headers[AttributePrefix+"source"] == "":
		return fail(ClassInvalidCloudEvent, "the CloudEvent has no source")
	case headers[AttributePrefix+"type"] == "":
		return fail(ClassMissingType, "the CloudEvent has no type")
	}
	return nil
}

// resolveSubtype picks the declaration of the record's qualified type.
func resolveSubtype(types []*sequence.MessageType, f *fields) (*sequence.MessageType, error) {
	if types[0].SubtypeFrom == nil {
		return types[0], nil
	}
	// The declaration compiler guarantees one SubtypeFrom for all subtypes of a type.
	from := *types[0].SubtypeFrom
	subtype, err := f.read(from)
	if err != nil {
		return nil, err
	}
	declared := make([]string, 0, len(types))
	for _, mt := range types {
		if mt.Subtype == subtype {
			return mt, nil
		}
		declared = append(declared, mt.Subtype)
	}
	if subtype == "" {
		return nil, fail(ClassInvalidSubtype, "type %s needs a subtype at %s, found none", types[0].Type, from)
	}
	return nil, fail(ClassInvalidSubtype, "subtype %q (at %s) is not declared for type %s; declared: %s", subtype, from, types[0].Type, strings.Join(declared, ", "))
}

// fields reads sources of one record, parsing the payload at most once.
type fields struct {
	rec     *inbox.Record
	headers map[string]string
	parsed  bool
	payload any
	jsonErr error
}

// read returns the text at a source; a missing header, key or pointer target reads as "".
func (f *fields) read(src sequence.Source) (string, error) {
	switch src.Kind {
	case sequence.FromHeader:
		return f.headers[src.Name], nil
	case sequence.FromKey:
		return string(f.rec.Key), nil
	case sequence.FromJSONPointer:
		if !f.parsed {
			f.parsed = true
			f.payload, f.jsonErr = parseJSON(f.rec.Value)
		}
		if f.jsonErr != nil {
			return "", &Error{Class: ClassInvalidJSON, Err: fmt.Errorf("read %s: %w", src, f.jsonErr)}
		}
		v, found, err := resolvePointer(f.payload, src.Name)
		if err != nil {
			return "", fail(ClassInvalidField, "read %s: %v", src, err)
		}
		if !found {
			return "", nil
		}
		text, err := scalarText(v)
		if err != nil {
			return "", fail(ClassInvalidField, "read %s: %v", src, err)
		}
		return text, nil
	default:
		return "", fmt.Errorf("source kind %d is not readable", src.Kind)
	}
}

func parseJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("payload is not JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("payload is not JSON: data after the first value")
	}
	return v, nil
}

// resolvePointer walks an RFC 6901 JSON pointer; found is false when a step does not exist.
func resolvePointer(doc any, pointer string) (v any, found bool, err error) {
	if pointer == "" {
		return doc, true, nil
	}
	if !strings.HasPrefix(pointer, "/") {
		return nil, false, fmt.Errorf("JSON pointer %q does not start with /", pointer)
	}
	v = doc
	for _, token := range strings.Split(pointer[1:], "/") {
		token = strings.ReplaceAll(strings.ReplaceAll(token, "~1", "/"), "~0", "~")
		switch node := v.(type) {
		case map[string]any:
			next, ok := node[token]
			if !ok {
				return nil, false, nil
			}
			v = next
		case []any:
			i, err := strconv.Atoi(token)
			if err != nil || i < 0 || i >= len(node) || token != strconv.Itoa(i) {
				return nil, false, nil
			}
			v = node[i]
		default:
			return nil, false, nil
		}
	}
	return v, true, nil
}

// scalarText renders a JSON scalar as the text an ID is compared by; null reads as "".
func scalarText(v any) (string, error) {
	switch s := v.(type) {
	case nil:
		return "", nil
	case string:
		return s, nil
	case json.Number:
		return s.String(), nil
	case bool:
		return strconv.FormatBool(s), nil
	default:
		return "", fmt.Errorf("found a JSON %s, need a string, number or bool", jsonKind(v))
	}
}

func jsonKind(v any) string {
	if _, ok := v.([]any); ok {
		return "array"
	}
	return "object"
}

func isStructured(hs []inbox.Header) bool {
	ct, ok := HeaderMap(hs)[ContentTypeHeader]
	if !ok {
		return false
	}
	mediaType, _, err := mime.ParseMediaType(ct)
	return err == nil && mediaType == StructuredContentType
}

// toBinaryMode replaces a structured-mode record's envelope by its data and its attributes by
// `ce_<name>` headers (header sources work in both modes: docs/design.md#cloudevents-records).
// Other headers are kept.
func toBinaryMode(rec *inbox.Record) error {
	dec := json.NewDecoder(bytes.NewReader(rec.Value))
	dec.UseNumber()
	var envelope map[string]json.RawMessage
	if err := dec.Decode(&envelope); err != nil {
		return fail(ClassInvalidJSON, "structured-mode CloudEvent is not a JSON object: %v", err)
	}
	headers := make([]inbox.Header, 0, len(rec.Headers)+len(envelope))
	for _, h := range rec.Headers {
		if h.Key != ContentTypeHeader && !strings.HasPrefix(h.Key, AttributePrefix) {
			headers = append(headers, h)
		}
	}
	var data []byte
	_, hasData := envelope["data"]
	_, hasBase64 := envelope["data_base64"]
	if hasData && hasBase64 {
		return fail(ClassInvalidCloudEvent, "structured-mode CloudEvent has both data and data_base64")
	}
	names := make([]string, 0, len(envelope))
	for name := range envelope {
		names = append(names, name)
	}
	slices.Sort(names)
	contentType := ""
	for _, name := range names {
		raw := envelope[name]
		switch name {
		case "data", "data_base64":
			continue
		case "datacontenttype":
			text, err := attributeText(name, raw)
			if err != nil {
				return err
			}
			contentType = text
			continue
		}
		text, err := attributeText(name, raw)
		if err != nil {
			return err
		}
		headers = append(headers, inbox.Header{Key: AttributePrefix + name, Value: []byte(text)})
	}
	switch {
	case hasBase64:
		var encoded string
		if err := json.Unmarshal(envelope["data_base64"], &encoded); err != nil {
			return fail(ClassInvalidCloudEvent, "data_base64 is not a JSON string: %v", err)
		}
		decoded, err := base64.StdEncoding.DecodeString(encoded)
		if err != nil {
			return fail(ClassInvalidCloudEvent, "data_base64 is not base64: %v", err)
		}
		data = decoded
	case hasData:
		data = envelope["data"]
		if !isJSONContentType(contentType) {
			// Non-JSON data is carried as a JSON string in the JSON event format.
			var text string
			if err := json.Unmarshal(data, &text); err == nil {
				data = []byte(text)
			}
		}
		if contentType == "" {
			contentType = "application/json"
		}
	}
	if contentType != "" {
		headers = append(headers, inbox.Header{Key: ContentTypeHeader, Value: []byte(contentType)})
	}
	rec.Value = data
	rec.Headers = headers
	return nil
}

// attributeText renders an envelope attribute as its binary-mode header value.
func attributeText(name string, raw json.RawMessage) (string, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return "", fail(ClassInvalidJSON, "attribute %s: %v", name, err)
	}
	text, err := scalarText(v)
	if err != nil {
		return "", fail(ClassInvalidCloudEvent, "attribute %s: %v", name, err)
	}
	return text, nil
}

// isJSONContentType reports whether data of this content type is JSON (absent means JSON).
func isJSONContentType(ct string) bool {
	if ct == "" {
		return true
	}
	mediaType, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mediaType == "application/json" || mediaType == "text/json" || strings.HasSuffix(mediaType, "+json")
}
