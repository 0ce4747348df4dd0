// Package consumerstate is the channel from the consumers to the operator: each consumer serves
// what it knows (its partitions and their lag, the record it has retried longest, its readiness;
// the housekeeping leader also the database-wide counts) as JSON over HTTPS, and only the operator
// can read it. The operator generates the credentials of an inbox (NewCredentials) and keeps them
// in a Secret that the consumer pods mount: a self-signed certificate the consumers serve with and
// the operator trusts alone, and a bearer token the operator sends and the consumers check.
// No Secret, record key or payload is part of the state.
package consumerstate

import "time"

// State is what one consumer serves at Path: the wire type shared by the consumer and the operator.
type State struct {
	// Instance is the consumer's instance ID (its pod name in a cluster).
	Instance string `json:"instance"`
	// Ready is the consumer's readiness; Reason says why not.
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// EngineVersion and ClaimProtocol are what the consumer's build speaks.
	EngineVersion string `json:"engineVersion"`
	ClaimProtocol string `json:"claimProtocol"`
	// Partitions are the partitions the consumer holds, with their lag.
	Partitions []Partition `json:"partitions"`
	// Blocked is the record the consumer has retried longest after infrastructure errors; nil
	// when it retries none.
	Blocked *Blocked `json:"blocked,omitempty"`
	// DeadLettersLastHour counts the records this consumer dead-lettered in the last hour (since it
	// started, when that is less), to about a minute.
	DeadLettersLastHour int64 `json:"deadLettersLastHour"`
	// DeadLettersLastHourByReason is DeadLettersLastHour by dead-letter reason (only reasons with
	// letters); absent from consumers of releases before it.
	DeadLettersLastHourByReason map[string]int64 `json:"deadLettersLastHourByReason,omitempty"`
	// Database holds the database-wide counts; only the housekeeping leader serves them, so that
	// the operator counts each once. Nil on every other consumer.
	Database *Database `json:"database,omitempty"`
}

// Partition is one partition a consumer holds.
type Partition struct {
	// Topic and Partition name the partition.
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Lag is the records not processed yet: the high watermark minus the next offset to process.
	Lag int64 `json:"lag"`
}

// Blocked is a record retried after infrastructure errors: where it is, since when and why.
type Blocked struct {
	// Topic, Partition and Offset say where the record is.
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// Since is the record's first failed attempt.
	Since time.Time `json:"since"`
	// Error is the last attempt's error, cut to 512 bytes; never the record's payload.
	Error string `json:"error"`
}

// Database is what the housekeeping leader counts in the database.
type Database struct {
	// WaitingByType counts the messages WAITING for their predecessors, by qualified type.
	WaitingByType map[string]int64 `json:"waitingByType"`
	// OldestWaitingSeconds is the age of the oldest WAITING message; zero when none waits.
	OldestWaitingSeconds float64 `json:"oldestWaitingSeconds"`
	// OldestWaitingSecondsByType is the age of the oldest WAITING message of each qualified type
	// of WaitingByType; absent from consumers of releases before it.
	OldestWaitingSecondsByType map[string]float64 `json:"oldestWaitingSecondsByType,omitempty"`
	// InstancesExpiringSoon counts the open sequence instances whose retention ends within the
	// configured window; InstancesExpired those past it, waiting for removal.
	InstancesExpiringSoon int64 `json:"instancesExpiringSoon"`
	InstancesExpired      int64 `json:"instancesExpired"`
}

// Waiting is the number of WAITING messages of every type.
func (d *Database) Waiting() int64 {
	var n int64
	for _, v := range d.WaitingByType {
		n += v
	}
	return n
}

// Lag is the sum of the lag of the partitions the consumer holds.
func (s *State) Lag() int64 {
	var n int64
	for _, p := range s.Partitions {
		n += p.Lag
	}
	return n
}
