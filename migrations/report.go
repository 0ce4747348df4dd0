package migrations

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"
)

// TerminationMessageLimit is the size Kubernetes keeps of a container's termination message; the
// migrate Job's report must fit in it.
const TerminationMessageLimit = 4096

// Report is what `seqinbox migrate --output json` prints and writes as the Job's termination
// message. The operator decodes it with this same type, so the two never drift apart.
type Report struct {
	// SchemaVersion is the database's schema version after the run (before it, for a dry run).
	SchemaVersion int `json:"schemaVersion"`
	// Applied lists the versions this run applied; never null.
	Applied []int `json:"applied"`
	// Pending lists the versions still to apply; empty after a successful run, never null.
	Pending []int `json:"pending"`
	// ClaimProtocol is the claim protocol of the binary that ran the migration.
	ClaimProtocol string `json:"claimProtocol"`
	// EngineVersion is the release of the binary that ran the migration.
	EngineVersion string `json:"engineVersion"`
	// Owner is the inbox (namespace/name) recorded as the owner of the tables after the run; when
	// the run was refused because another inbox owns them, that inbox. Empty when none is recorded.
	Owner string `json:"owner,omitempty"`
	// LiveConsumers are the consumers registered with a recent heartbeat; never null.
	LiveConsumers []LiveConsumer `json:"liveConsumers"`
	// LiveConsumersTruncated says that LiveConsumers was cut to fit the termination message.
	LiveConsumersTruncated bool `json:"liveConsumersTruncated,omitempty"`
	// DryRun says that the run applied nothing on purpose.
	DryRun bool `json:"dryRun,omitempty"`
	// Error is set when the run failed, so that the reader of a failed Job learns why.
	Error string `json:"error,omitempty"`
}

// LiveConsumer is one registered consumer as the migrate report lists it.
type LiveConsumer struct {
	InstanceID    string    `json:"instanceId"`
	ConsumerGroup string    `json:"consumerGroup"`
	EngineVersion string    `json:"engineVersion"`
	ClaimProtocol string    `json:"claimProtocol"`
	HeartbeatAt   time.Time `json:"heartbeatAt"`
	// Blocked is the record the consumer retried longest after infrastructure errors at its last
	// heartbeat; absent when none.
	Blocked *BlockedRecord `json:"blocked,omitempty"`
}

// BlockedRecord is a record a consumer retries after infrastructure errors
// (docs/design.md#records-retried-for-long).
type BlockedRecord struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Since is the record's first failed attempt, by the database clock.
	Since time.Time `json:"since"`
	// Error is the last attempt's error, cut to MaxBlockedError bytes.
	Error string `json:"error"`
}

// MaxBlockedError bounds the error of a BlockedRecord in the report, so that the records of
// several consumers fit in the termination message.
const MaxBlockedError = 300

// normalized returns r with null lists replaced by empty ones.
func (r Report) normalized() Report {
	if r.Applied == nil {
		r.Applied = []int{}
	}
	if r.Pending == nil {
		r.Pending = []int{}
	}
	if r.LiveConsumers == nil {
		r.LiveConsumers = []LiveConsumer{}
	}
	return r
}

// MarshalJSON encodes the report with empty lists as [] rather than null.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	return json.Marshal(plain(r.normalized()))
}

// EncodeWithin encodes the report in at most limit bytes: when the whole report does not fit, it
// drops live consumers from the end of the list, those without a blocked record first (and sets
// LiveConsumersTruncated), then shortens Error.
func (r Report) EncodeWithin(limit int) ([]byte, error) {
	r = r.normalized()
	for {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("encode migrate report: %w", err)
		}
		if len(b) <= limit {
			return b, nil
		}
		switch {
		case len(r.LiveConsumers) > 0:
			r.LiveConsumers = dropOne(r.LiveConsumers)
			r.LiveConsumersTruncated = true
		case r.Error != "":
			r.Error = shorten(r.Error, len(r.Error)-(len(b)-limit)-len("…"))
		default:
			return nil, fmt.Errorf("migrate report needs %d bytes without any consumer, more than the limit of %d", len(b), limit)
		}
	}
}

// dropOne returns live without its last consumer that has no blocked record, or without its last
// one when all have: blocked records are what the operator's Degraded condition needs.
func dropOne(live []LiveConsumer) []LiveConsumer {
	out := slices.Clone(live)
	for i := len(out) - 1; i >= 0; i-- {
		if out[i].Blocked == nil {
			return slices.Delete(out, i, i+1)
		}
	}
	return out[:len(out)-1]
}

// ShortError cuts an error message to MaxBlockedError bytes for a BlockedRecord.
func ShortError(s string) string {
	if len(s) <= MaxBlockedError {
		return s
	}
	return shorten(s, MaxBlockedError-len("…"))
}

// shorten cuts s to at most n bytes on a rune boundary and marks the cut with an ellipsis; with
// no room left it returns "".
func shorten(s string, n int) string {
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
