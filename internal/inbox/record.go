package inbox

import "time"

// Header is one record header, kept in order and byte for byte.
type Header struct {
	Key   string
	Value []byte
}

// Origin says where a record was read from, for dead letters and the sequenced_message row.
type Origin struct {
	Topic     string
	Partition int32
	Offset    int64
	// MessageID is the producer's message ID (for CloudEvents the `id`), informational.
	MessageID string
}

// Record is one decoded record, as the consumer runtime hands it to the engine.
type Record struct {
	// Type and Subtype make the qualified type.
	Type, Subtype string
	// IdempotenceID identifies the logical message together with the qualified type.
	IdempotenceID string
	// ContextID groups the messages of one sequence instance; empty delivers without sequencing.
	ContextID string
	// Sequenced is false when the type's filter said "deliver without sequencing".
	Sequenced  bool
	Key, Value []byte
	Headers    []Header
	Origin     Origin
	// ReceivedAt is when the consumer read the record.
	ReceivedAt time.Time
}
