package sink

import (
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/seqinbox/seqinbox/internal/inbox"
)

// Record headers the sink reads by their exact (Kafka binding) names.
const (
	attributePrefix   = "ce_"
	contentTypeHeader = "content-type"
)

// traceHeaders carry the W3C trace context; they are always forwarded.
var traceHeaders = map[string]bool{"traceparent": true, "tracestate": true}

// headers renders a message as the request's HTTP headers, which belong to the inbox alone:
//   - the CloudEvents attributes, from the record's `ce_<name>` headers only (lower-case
//     attribute names, as the CloudEvents type system defines them), as `ce-<name>` with values
//     percent-encoded as the HTTP binding requires; a raw `ce-type` or `Ce_Type` header is no
//     attribute and is never sent;
//   - content-type, traceparent and tracestate;
//   - the record headers that spec.sink.forwardHeaders allow-lists (forwardSet refuses
//     credential, hop-by-hop, proxy and attribute names);
//   - the sequence and context extensions, set last, so no record header replaces them.
func (s *Sink) headers(m inbox.Message) http.Header {
	h := http.Header{}
	for _, rh := range m.Record.Headers {
		switch key := rh.Key; {
		case strings.HasPrefix(key, attributePrefix):
			name := key[len(attributePrefix):]
			if isAttributeName(name) && "ce-"+name != SequenceHeader && "ce-"+name != ContextIDHeader {
				h.Set("ce-"+name, percentEncode(rh.Value))
			}
		case key == contentTypeHeader:
			if validValue(rh.Value) {
				h.Set("Content-Type", string(rh.Value))
			}
		case traceHeaders[key] || s.forward[strings.ToLower(key)]:
			if validValue(rh.Value) {
				h.Set(key, string(rh.Value))
			}
		}
	}
	h.Set(SequenceHeader, percentEncode([]byte(m.Sequence)))
	h.Set(ContextIDHeader, percentEncode([]byte(m.ContextID)))
	return h
}

// isAttributeName: CloudEvents attribute names consist of lower-case ASCII letters and digits.
func isAttributeName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// neverForwarded are headers no record may set on the request: the HTTP client's own
// (hop-by-hop, framing), credentials, and what proxies and the service trust about the caller.
var neverForwarded = map[string]bool{
	"authorization": true, "cookie": true, "set-cookie": true, "www-authenticate": true,
	"connection": true, "content-length": true, "expect": true, "host": true, "keep-alive": true,
	"te": true, "trailer": true, "transfer-encoding": true, "upgrade": true,
	"forwarded": true, "via": true, "x-real-ip": true, "x-api-key": true, "x-auth-token": true,
	"x-csrf-token": true, "x-amz-security-token": true,
	contentTypeHeader: true, "traceparent": true, "tracestate": true,
}

// neverForwardedPrefixes are families of such headers: proxy credentials and hints, forwarding
// claims, CloudEvents attributes in either binding, and the inbox's own dead-letter headers.
var neverForwardedPrefixes = []string{"proxy-", "x-forwarded-", "ce-", "ce_", "seqinbox-"}

// ForwardHeadersPath is where spec.sink.forwardHeaders sits in a SequentialInbox.
var ForwardHeadersPath = field.NewPath("spec", "sink", "forwardHeaders")

// CheckForwardHeaders checks an allow-list of record headers, naming each refused entry by its
// index below path. The consumer's sink (forwardSet) and the operator's validation both call it,
// so a list the operator reports as valid is one the consumers accept.
func CheckForwardHeaders(path *field.Path, names []string) field.ErrorList {
	var errs field.ErrorList
	for i, name := range names {
		lower := strings.ToLower(name)
		switch {
		case name == "" || !isToken(name):
			errs = append(errs, field.Invalid(path.Index(i), name, "not an HTTP header name"))
		case lower == "content-type" || lower == "traceparent" || lower == "tracestate":
			errs = append(errs, field.Invalid(path.Index(i), name, "always sent; remove it from the list"))
		case neverForwarded[lower] || hasPrefix(lower, neverForwardedPrefixes):
			errs = append(errs, field.Forbidden(path.Index(i), fmt.Sprintf("%q may not come from a record: credential, hop-by-hop, "+
				"proxy and forwarding headers, CloudEvents attributes (ce-, ce_) and seqinbox- headers belong to the inbox and its network; "+
				"remove it from the list", name)))
		}
	}
	return errs
}

// forwardSet checks spec.sink.forwardHeaders and returns it as a set of lower-case names.
func forwardSet(names []string) (map[string]bool, error) {
	if errs := CheckForwardHeaders(ForwardHeadersPath, names); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	set := make(map[string]bool, len(names))
	for _, name := range names {
		set[strings.ToLower(name)] = true
	}
	return set, nil
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func isToken(name string) bool {
	for _, c := range []byte(name) {
		if !isTokenChar(c) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// validValue refuses values net/http would reject (control characters), so that one bad header
// never fails the whole delivery.
func validValue(v []byte) bool {
	for _, c := range v {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// percentEncode encodes what the CloudEvents HTTP binding requires for attribute header values:
// bytes outside printable ASCII, space, double quote and percent.
func percentEncode(v []byte) string {
	var b strings.Builder
	for _, c := range v {
		if c > 0x20 && c < 0x7f && c != '"' && c != '%' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}
