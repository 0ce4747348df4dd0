package controller

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// ActionReport is what `seqinbox action --output json` prints and writes as its Job's termination
// message; the operator decodes it with this same type, so the two never drift apart.
type ActionReport struct {
	// Action is the requested action as the SequentialInboxAction names it (Consume, ...).
	Action string `json:"action"`
	// Target names the message ("message <type>/<idempotence ID>") or the instance
	// ("instance <sequence>/<context ID>").
	Target string `json:"target"`
	// Recorded is true when the action is recorded in the database as pending.
	Recorded bool `json:"recorded"`
	// Executed is true once a consumer ran the action; Outcome and Detail say how it went.
	Executed bool `json:"executed,omitempty"`
	// Outcome is Executed, Failed or Superseded (another request replaced it before it ran).
	Outcome string `json:"outcome,omitempty"`
	// Detail says, for a person, what the action did or why it could not.
	Detail string `json:"detail,omitempty"`
	// Error says why the action was not recorded (e.g. the target does not exist).
	Error string `json:"error,omitempty"`
}

// EncodeWithin encodes the report in at most limit bytes (the termination message keeps 4 KiB),
// shortening the error and then the target, on rune boundaries, when they are too long.
func (r ActionReport) EncodeWithin(limit int) ([]byte, error) {
	for {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode action report: %w", err)
		}
		if len(b) <= limit {
			return b, nil
		}
		switch {
		case len(r.Error) > 1:
			r.Error = shortenHalf(r.Error)
		case len(r.Detail) > 1:
			r.Detail = shortenHalf(r.Detail)
		case len(r.Target) > 1:
			r.Target = shortenHalf(r.Target)
		default:
			return nil, fmt.Errorf("encode action report: %d bytes do not fit in %d", len(b), limit)
		}
	}
}

// shortenHalf cuts s to about half its length on a rune boundary and marks the cut.
func shortenHalf(s string) string {
	cut := len(s) / 2
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Outcomes of an executed action as ActionReport.Outcome carries them (the engine's words).
const (
	OutcomeExecuted   = "Executed"
	OutcomeFailed     = "Failed"
	OutcomeSuperseded = "Superseded"
)

// parseActionReport decodes the report that `seqinbox action` wrote to the termination message
// of its Job's container; a report without action or target is not one.
func parseActionReport(message string) (*ActionReport, error) {
	var r ActionReport
	if err := json.Unmarshal([]byte(message), &r); err != nil {
		return nil, fmt.Errorf("decode action report: %w", err)
	}
	if r.Action == "" || r.Target == "" {
		return nil, fmt.Errorf("action report without action or target: %.200q", message)
	}
	return &r, nil
}
