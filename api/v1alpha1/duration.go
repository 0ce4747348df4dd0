package v1alpha1

import (
	"bytes"
	"encoding/json"
	"time"
)

// Duration is a span of time written as a number with a unit (ns, us, ms, s, m, h), such as 10s
// or 1h30m. The API server refuses any other value; an object stored before it did is not lost
// or fatal: the operator reports it with the condition ConfigValid=False, reason InvalidSpec,
// naming the field, and goes on reconciling every other inbox. (In Go: like metav1.Duration,
// but a value that is no duration decodes without error and Malformed reports it.)
// +kubebuilder:validation:Type=string
type Duration struct {
	time.Duration `json:"-"`
	// Unparsed is the JSON text of a value that is no duration, as it was read (Duration is zero
	// then); empty for a duration. It is exported only so that reflection-based comparisons
	// (equality.Semantic) can see it; Malformed reads it.
	Unparsed string `json:"-"`
}

// Malformed returns the value as it was written and true when it is no duration.
func (d Duration) Malformed() (string, bool) {
	if d.Unparsed == "" {
		return "", false
	}
	var s string
	if json.Unmarshal([]byte(d.Unparsed), &s) == nil {
		return s, true
	}
	return d.Unparsed, true
}

// UnmarshalJSON decodes a duration string; any other value is kept for Malformed. null leaves
// the zero duration, as for a field that is absent.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		*d = Duration{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		if parsed, err := time.ParseDuration(s); err == nil {
			*d = Duration{Duration: parsed}
			return nil
		}
	}
	*d = Duration{Unparsed: string(b)}
	return nil
}

// MarshalJSON encodes a duration as its string, and a malformed value exactly as it was read, so
// that writing an object back changes none of its durations.
func (d Duration) MarshalJSON() ([]byte, error) {
	if d.Unparsed != "" {
		return []byte(d.Unparsed), nil
	}
	return json.Marshal(d.String())
}
