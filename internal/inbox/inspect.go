package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// InspectQuery names what Inspect reads: the instance of a context ID (in Sequence, or in the one
// sequence that has an instance of it), or the instance of one message.
type InspectQuery struct {
	// ContextID is the instance's context ID.
	ContextID string
	// Sequence is the instance's sequence; empty: whichever sequence has an instance of ContextID.
	Sequence string
	// MessageType and IdempotenceID name one message (qualified type and idempotence ID); then
	// only that message is shown, and ContextID and Sequence, when set, must be its instance's.
	MessageType, IdempotenceID string
}

// Inspection is one sequence instance as the engine sees it: its state and windows, and its
// messages with their states and, for each WAITING one, what it waits for.
type Inspection struct {
	// Instance is the instance's row.
	Instance InspectedInstance `json:"instance"`
	// Messages are the instance's logical messages in the order they arrived (only the one asked
	// for with InspectQuery.MessageType).
	Messages []InspectedMessage `json:"messages"`
	// Now is the database's clock when it was read; the windows are measured against it.
	Now time.Time `json:"now"`
}

// InspectedInstance is the state of a sequence instance.
type InspectedInstance struct {
	// Sequence and ContextID name the instance.
	Sequence string `json:"sequence"`
	// ContextID is the instance's context ID.
	ContextID string `json:"contextId"`
	// Declared is false when the inbox's declaration no longer has the instance's sequence.
	Declared bool `json:"declared"`
	// State is OPEN or CLOSED.
	State string `json:"state"`
	// CreatedAt is when its first message arrived.
	CreatedAt time.Time `json:"createdAt"`
	// ClosedAt is when it closed: all its types processed, or a close action.
	ClosedAt *time.Time `json:"closedAt,omitempty"`
	// RetainUntil is when the retention of an open instance ends: past it, housekeeping removes
	// the instance at RemoveAfter and dead-letters its WAITING messages.
	RetainUntil time.Time `json:"retainUntil"`
	// RemoveAfter is when housekeeping deletes the instance with its claims: for a closed one the
	// end of its duplicate protection, for an open one past its retention the end of the expiry
	// delay; nil while an open instance is within its retention.
	RemoveAfter *time.Time `json:"removeAfter,omitempty"`
	// PendingAction is an operator action on the instance that no consumer has executed yet
	// (CONSUME_ALL, CLOSE).
	PendingAction string `json:"pendingAction,omitempty"`
	// Missing lists the declared types of the sequence no message of which was processed yet:
	// the instance closes when none is left.
	Missing []string `json:"missing"`
}

// InspectedMessage is one logical message of an instance: the row that stands for it.
type InspectedMessage struct {
	// Type is the qualified message type.
	Type string `json:"type"`
	// IdempotenceID is the producer's ID of the logical message.
	IdempotenceID string `json:"idempotenceId"`
	// State is WAITING, PROCESSED or FAILED.
	State string `json:"state"`
	// ArrivedAt is when the message was stored, StateSince when it reached State.
	ArrivedAt time.Time `json:"arrivedAt"`
	// StateSince is when the message reached State.
	StateSince time.Time `json:"stateSince"`
	// Claimed is whether its claim exists: a FAILED message has none, so a resend retries it.
	Claimed bool `json:"claimed"`
	// PendingAction is an operator action on the message not executed yet (CONSUME, EXPIRE).
	PendingAction string `json:"pendingAction,omitempty"`
	// Rows counts the stored rows of the logical message: more than one are historical
	// duplicates, of which this is the one that stands for it.
	Rows int `json:"rows"`
	// MessageID, Topic, Partition and Offset say where its latest delivery was read from.
	MessageID string `json:"messageId,omitempty"`
	// Topic is the topic its record was read from.
	Topic string `json:"topic,omitempty"`
	// Partition is the record's partition.
	Partition *int32 `json:"partition,omitempty"`
	// Offset is the record's offset.
	Offset *int64 `json:"offset,omitempty"`
	// Waits is, for a WAITING message, its release condition and what of it is missing, in words.
	Waits *sequence.Explanation `json:"waits,omitempty"`
}

// Why Inspect found nothing; errors.Is tells them apart.
var (
	// ErrNoInstance: no instance has the context ID (in the sequence asked for).
	ErrNoInstance = errors.New("no sequence instance")
	// ErrAmbiguousContext: instances of several sequences have the context ID.
	ErrAmbiguousContext = errors.New("context ID has instances in several sequences")
	// ErrNoMessage: no stored message has the type and idempotence ID.
	ErrNoMessage = errors.New("no stored message")
)

// TxBeginner begins transactions; *pgx.Conn and *pgxpool.Pool have it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// inspectInstancesSQL finds the instances of a context ID, in one sequence ($2) or in all ($2 empty).
const inspectInstancesSQL = `SELECT id, name FROM sequence_instance
WHERE context_id = $1 AND ($2 = '' OR name = $2)
ORDER BY name`

// inspectMessageInstanceSQL finds the instance of the row that stands for a logical message.
const inspectMessageInstanceSQL = `SELECT sequence_instance_id FROM sequenced_message
WHERE idempotence_id = $2 AND message_type = $1
` + standingRowFirst

// inspectInstanceSQL reads an instance row, and the database's clock.
const inspectInstanceSQL = `SELECT name, context_id, state, created_at, closed_at, retain_until, remove_after,
  coalesce(pending_action, ''), now()
FROM sequence_instance WHERE id = $1`

// inspectMessagesSQL reads the row that stands for each logical message of an instance (the rule
// of lookupMessageSQL: PROCESSED before WAITING before FAILED, then the newest), how many rows
// the message has, and whether its claim exists. The raw records are not read: inspect never
// shows a payload, and a message may have none.
const inspectMessagesSQL = `SELECT DISTINCT ON (m.message_type, m.idempotence_id)
  m.message_type, m.idempotence_id, m.state, m.created_at, m.state_changed_at,
  coalesce(m.pending_action, ''), count(*) OVER (PARTITION BY m.message_type, m.idempotence_id),
  coalesce(m.message_id, ''), coalesce(m.topic, ''), m.partition, m."offset", m.id,
  EXISTS (SELECT 1 FROM sequential_inbox_idempotence c
          WHERE c.message_type = m.message_type AND c.idempotence_id = m.idempotence_id)
FROM sequenced_message m
WHERE m.sequence_instance_id = $1
ORDER BY m.message_type, m.idempotence_id,
  CASE m.state WHEN 'PROCESSED' THEN 0 WHEN 'WAITING' THEN 1 ELSE 2 END, m.id DESC`

// Inspect reads one sequence instance as the engine sees it, in one read-only transaction (one
// snapshot, so the instance and its messages agree): its row, the row that stands for each of its
// logical messages, and for each WAITING message its release condition from set and what of it
// the instance's PROCESSED messages do not meet yet, in words. It changes no row. It returns
// ErrNoInstance, ErrAmbiguousContext or ErrNoMessage, wrapped, when the query names nothing.
func Inspect(ctx context.Context, db TxBeginner, set *sequence.Set, q InspectQuery) (*Inspection, error) {
	what := inspectTarget(q)
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("inspect %s: begin: %w", what, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	id, err := findInstance(ctx, tx, q)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", what, err)
	}
	in, err := readInspection(ctx, tx, set, id)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", what, err)
	}
	if q.MessageType != "" {
		in.Messages = slices.DeleteFunc(in.Messages, func(m InspectedMessage) bool {
			return m.Type != q.MessageType || m.IdempotenceID != q.IdempotenceID
		})
		if (q.ContextID != "" && in.Instance.ContextID != q.ContextID) || (q.Sequence != "" && in.Instance.Sequence != q.Sequence) {
			return nil, fmt.Errorf("inspect %s: the message belongs to instance %s/%s", what, in.Instance.Sequence, in.Instance.ContextID)
		}
	}
	return in, nil
}

// inspectTarget names what a query asks for, for errors.
func inspectTarget(q InspectQuery) string {
	if q.MessageType != "" {
		return "message " + q.MessageType + "/" + q.IdempotenceID
	}
	if q.Sequence != "" {
		return "instance " + q.Sequence + "/" + q.ContextID
	}
	return "context " + q.ContextID
}

// findInstance returns the id of the instance the query names.
func findInstance(ctx context.Context, tx pgx.Tx, q InspectQuery) (int64, error) {
	if q.MessageType != "" {
		var id int64
		err := tx.QueryRow(ctx, inspectMessageInstanceSQL, q.MessageType, q.IdempotenceID).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, ErrNoMessage
		}
		return id, err
	}
	rows, err := tx.Query(ctx, inspectInstancesSQL, q.ContextID, q.Sequence)
	if err != nil {
		return 0, err
	}
	type found struct {
		id   int64
		name string
	}
	instances, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (found, error) {
		var f found
		err := r.Scan(&f.id, &f.name)
		return f, err
	})
	switch {
	case err != nil:
		return 0, err
	case len(instances) == 0:
		return 0, ErrNoInstance
	case len(instances) > 1:
		names := make([]string, len(instances))
		for i, f := range instances {
			names[i] = f.name
		}
		return 0, fmt.Errorf("%w (%s)", ErrAmbiguousContext, strings.Join(names, ", "))
	}
	return instances[0].id, nil
}

// readInspection reads the instance id and its messages and explains the WAITING ones.
func readInspection(ctx context.Context, tx pgx.Tx, set *sequence.Set, id int64) (*Inspection, error) {
	in := &Inspection{Messages: []InspectedMessage{}}
	i := &in.Instance
	err := tx.QueryRow(ctx, inspectInstanceSQL, id).Scan(&i.Sequence, &i.ContextID, &i.State, &i.CreatedAt, &i.ClosedAt,
		&i.RetainUntil, &i.RemoveAfter, &i.PendingAction, &in.Now)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoInstance
	}
	if err != nil {
		return nil, fmt.Errorf("read instance: %w", err)
	}
	rows, err := tx.Query(ctx, inspectMessagesSQL, id)
	if err != nil {
		return nil, fmt.Errorf("read messages: %w", err)
	}
	type row struct {
		InspectedMessage
		id int64
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var m row
		err := r.Scan(&m.Type, &m.IdempotenceID, &m.State, &m.ArrivedAt, &m.StateSince, &m.PendingAction, &m.Rows,
			&m.MessageID, &m.Topic, &m.Partition, &m.Offset, &m.id, &m.Claimed)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("read messages: %w", err)
	}
	slices.SortFunc(msgs, func(a, b row) int { return cmp.Or(a.ArrivedAt.Compare(b.ArrivedAt), cmp.Compare(a.id, b.id)) })
	presence := map[string]sequence.Presence{}
	for _, m := range msgs {
		presence[m.Type] = advance(presence[m.Type], m.InspectedMessage)
	}
	seq, declared := set.Sequence(i.Sequence)
	i.Declared, i.Missing = declared, []string{}
	if declared {
		for _, t := range seq.Types {
			if presence[t.Qualified].State != sequence.Processed {
				i.Missing = append(i.Missing, t.Qualified)
			}
		}
	}
	for _, m := range msgs {
		if m.State == stateWaiting && declared {
			ex := seq.Explain(m.Type, presence)
			m.Waits = &ex
		}
		in.Messages = append(in.Messages, m.InspectedMessage)
	}
	return in, nil
}

// advance adds one logical message of a type to what the instance holds of the type: the most
// advanced state counts (PROCESSED before WAITING before FAILED, as a release condition sees
// it); the first arrival, and for PROCESSED the first processing, give the times.
func advance(p sequence.Presence, m InspectedMessage) sequence.Presence {
	state := map[string]sequence.PresenceState{stateProcessed: sequence.Processed, stateWaiting: sequence.Waiting, stateFailed: sequence.Failed}[m.State]
	if p.ArrivedAt.IsZero() || m.ArrivedAt.Before(p.ArrivedAt) {
		p.ArrivedAt = m.ArrivedAt
	}
	switch {
	case state > p.State:
		p.State, p.Since = state, m.StateSince
	case state == p.State && m.StateSince.Before(p.Since):
		p.Since = m.StateSince
	}
	return p
}
