package inbox

import (
	"encoding/json"
	"fmt"
)

// storedHeader is one element of buffered_message.headers: [{"key": "...", "value": "<base64>"}],
// in record order. A header without value is stored with value null.
type storedHeader struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// encodeHeaders renders record headers for buffered_message.headers.
func encodeHeaders(hs []Header) (json.RawMessage, error) {
	stored := make([]storedHeader, len(hs))
	for i, h := range hs {
		stored[i] = storedHeader(h)
	}
	raw, err := json.Marshal(stored)
	if err != nil {
		return nil, fmt.Errorf("encode headers: %w", err)
	}
	return raw, nil
}

// decodeHeaders restores record headers from buffered_message.headers.
func decodeHeaders(raw []byte) ([]Header, error) {
	var stored []storedHeader
	if err := json.Unmarshal(raw, &stored); err != nil {
		return nil, fmt.Errorf("decode headers: %w", err)
	}
	if len(stored) == 0 {
		return nil, nil
	}
	hs := make([]Header, len(stored))
	for i, h := range stored {
		hs[i] = Header(h)
	}
	return hs, nil
}

// traceHeaders are the headers that carry a W3C trace context: plain, and as CloudEvents
// distributed-tracing extension in the Kafka binding.
var traceHeaders = [...]string{"traceparent", "ce_traceparent"}

// traceContext returns the record's W3C traceparent for sequenced_message.trace_context, or nil.
func traceContext(hs []Header) *string {
	for _, name := range traceHeaders {
		for _, h := range hs {
			if h.Key == name {
				v := string(h.Value)
				return &v
			}
		}
	}
	return nil
}
