//go:build legacy

package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// ClaimProtocol of the legacy engine: claim protocol 0, check-then-insert without a claim, the
// way applications processed records before claims existed. Only the end-to-end tests build it
// (`go build -tags legacy`, the legacy image of `make image`): it shows the double deliveries
// that claims prevent and is the old version of the upgrade test. Never in a release.
const ClaimProtocol = "check-then-insert-v0"

// legacyInsertStateSQL stores a delivered message without any guard: two consumers that both found
// no row both deliver and both insert (the historical duplicate rows of
// docs/design.md#historical-duplicates).
const legacyInsertStateSQL = `INSERT INTO sequenced_message
  (sequence_instance_id, message_type, idempotence_id, message_id, topic, partition, "offset", state, trace_context)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`

// processBatchUnderProtocol has no batch claim in the legacy protocol: it processes the first
// record on its own, a prefix of one, and the caller passes the rest again.
func (e *Engine) processBatchUnderProtocol(ctx context.Context, recs []Record) ([]Result, error) {
	if len(recs) == 0 {
		return nil, errors.New("process batch: no records")
	}
	res, err := e.Process(ctx, recs[0])
	return []Result{res}, err
}

// processUnderProtocol is check-then-insert: look the message up, deliver or buffer it when no
// row exists, then store its state. Nothing is held between the check and the insert, so
// concurrent duplicates are all delivered.
func (e *Engine) processUnderProtocol(ctx context.Context, conn *pgxpool.Conn, _ *stateConn, instanceID int64, mt *sequence.MessageType, msg Message) (Result, instanceState, error) {
	typ, id := msg.QualifiedType, msg.Record.IdempotenceID
	var existing storedMessage
	err := conn.QueryRow(ctx, lookupMessageSQL, typ, id).Scan(&existing.id, &existing.state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Result{}, instanceState{}, fmt.Errorf("check %s/%s: %w", typ, id, err)
	}
	before, err := scanInstanceState(conn.QueryRow(ctx, instanceStateSQL, instanceID))
	if err != nil {
		return Result{}, instanceState{}, fmt.Errorf("check %s/%s: read instance: %w", typ, id, err)
	}
	res := Result{Outcome: Duplicate}
	switch {
	case existing.settled():
	case mt.Condition != nil && !e.recording() && !mt.Condition.Holds(before.processed):
		res.Outcome = Buffered
		err = bufferUnderClaim(ctx, conn, instanceID, existing, msg)
	default:
		res, err = e.deliverThenInsert(ctx, conn, instanceID, existing, msg)
	}
	if err != nil {
		return res, instanceState{}, err
	}
	after, err := scanInstanceState(conn.QueryRow(ctx, instanceStateSQL, instanceID))
	if err != nil {
		return res, instanceState{}, fmt.Errorf("insert %s/%s: read instance: %w", typ, id, err)
	}
	return res, after, nil
}

// deliverThenInsert invokes the listener, then stores the message's state.
func (e *Engine) deliverThenInsert(ctx context.Context, conn *pgxpool.Conn, instanceID int64, existing storedMessage, msg Message) (Result, error) {
	lctx, cancel := context.WithTimeout(ctx, e.cfg.ListenerDeadline)
	defer cancel()
	listenerErr := e.invokeListener(lctx, msg)
	if ctx.Err() != nil {
		return Result{}, fmt.Errorf("deliver %s/%s: %w", msg.QualifiedType, msg.Record.IdempotenceID, ctx.Err())
	}
	state, res := stateProcessed, Result{Outcome: Delivered}
	if listenerErr != nil {
		state, res = stateFailed, Result{Outcome: Failed, ListenerErr: listenerErr}
	}
	r, o := msg.Record, msg.Record.Origin
	var err error
	if existing.state == stateFailed {
		_, err = e.storeStateInNewTx(ctx, &stateConn{conn: conn}, instanceID, existing, state, msg)
	} else {
		_, err = conn.Exec(ctx, legacyInsertStateSQL, instanceID, msg.QualifiedType, r.IdempotenceID,
			o.MessageID, o.Topic, o.Partition, o.Offset, state, traceContext(r.Headers))
	}
	if err != nil {
		return Result{}, fmt.Errorf("insert %s/%s %s: %w", msg.QualifiedType, r.IdempotenceID, state, err)
	}
	return res, nil
}
