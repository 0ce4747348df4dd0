package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// T1 and T2 are written as explicit BEGIN/COMMIT statements on a pooled connection so that they
// can be pipelined with their first and last statements (one network round trip each). A
// connection returned to the pool inside a transaction is closed by pgxpool, so an error path
// can never leak an open transaction into the pool.
const (
	beginReadCommittedSQL = `BEGIN ISOLATION LEVEL READ COMMITTED`
	commitSQL             = `COMMIT`
	rollbackSQL           = `ROLLBACK`
)

// claimSQL is T1's first statement (docs/design.md#claim-transaction-t1). Against an in-flight
// claim of the same key it waits inside PostgreSQL until that transaction ends: 0 rows after a
// commit, 1 after a rollback. RETURNING sets T1's lease (idle_in_transaction_session_timeout, for
// this transaction only) in the same statement, and only for a won claim: a loser's T1 ends at
// once.
const claimSQL = `INSERT INTO sequential_inbox_idempotence (message_type, idempotence_id, sequence_instance_id, created_at)
VALUES ($1, $2, $3, now())
ON CONFLICT (message_type, idempotence_id) DO NOTHING
RETURNING set_config('idle_in_transaction_session_timeout', $4, true)`

// setIdleTimeoutSQL bounds the idle time of the current transaction only (is_local = true).
const setIdleTimeoutSQL = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`

// lookupMessageSQL finds the row that stands for a logical message. Databases may hold historical
// duplicates (no unique constraint, docs/design.md#historical-duplicates), so it picks the most
// advanced state deterministically: PROCESSED before WAITING before FAILED, then the newest row.
// Every read that picks a message applies the same rule (waitingStandsForItsMessage for WAITING
// rows), so one logical message is never handled as two. It must be a statement of its own after
// the claim insert: at READ COMMITTED each statement reads a new snapshot, and only one taken after
// the insert returned sees the state that a winner, for whom the insert waited, committed before it
// ended.
const lookupMessageSQL = `SELECT id, state FROM sequenced_message
WHERE idempotence_id = $2 AND message_type = $1
` + standingRowFirst

// standingRowFirst ends a read of the rows of one logical message with the row that stands for
// it: PROCESSED before WAITING before FAILED, then the newest row.
const standingRowFirst = `ORDER BY CASE state WHEN 'PROCESSED' THEN 0 WHEN 'WAITING' THEN 1 ELSE 2 END, id DESC
LIMIT 1`

// waitingStandsForItsMessage holds for a WAITING row m that stands for its logical message under
// the rule of lookupMessageSQL (no PROCESSED row and no newer WAITING row of the same message): m
// is the row that rule picks. A scalar subquery, so that every row is checked by an index probe
// whatever the table's statistics say; as NOT EXISTS it was planned as a hash anti join over the
// whole table when the statistics were stale.
const waitingStandsForItsMessage = `m.id = (SELECT id FROM sequenced_message d
  WHERE d.idempotence_id = m.idempotence_id AND d.message_type = m.message_type
  ` + standingRowFirst + `)`

// Message states as stored in sequenced_message.state.
const (
	stateWaiting   = "WAITING"
	stateProcessed = "PROCESSED"
	stateFailed    = "FAILED"
)

// errInstanceGone reports that housekeeping deleted the instance between its lookup and the
// claim insert (a foreign key violation); Process looks the instance up again.
var errInstanceGone = errors.New("sequence instance deleted concurrently")

// errStateChanged reports that a state write did not find the message in the state it expected:
// while we held the claim, someone else recorded it, so our T1 must have been ended by the server
// (connection killed). Nothing was written; the caller retries the record, which then finds the
// stored state.
var errStateChanged = errors.New("message state changed concurrently; the claim was lost")

// querier is what single statements need; pool, pooled connection and transaction all have it.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// storedMessage is the row lookupMessageSQL found, if any.
type storedMessage struct {
	id    int64
	state string
}

// settled reports whether the message needs no further processing by a new delivery.
func (s storedMessage) settled() bool { return s.state == stateWaiting || s.state == stateProcessed }

// claim is what T1's first round trip learnt.
type claim struct {
	won      bool
	existing storedMessage
	state    instanceState
	// lease is T1, holding the claim from the claim statement's answer on.
	lease *lease
}

// claimAndProcess is T1 (docs/design.md#claim-transaction-t1): claim the message, then skip, buffer
// or deliver it while the claim is held. It returns the instance state read after the outcome was
// committed, which decides whether T2 is needed.
func (e *Engine) claimAndProcess(ctx context.Context, conn *pgxpool.Conn, stateConn *stateConn, instanceID int64, mt *sequence.MessageType, msg Message) (Result, instanceState, error) {
	// The processed types matter only for a condition to evaluate.
	evaluate := mt.Condition != nil && !e.recording()
	c, err := e.claim(ctx, conn, instanceID, msg, evaluate)
	if err != nil {
		endQuietly(conn, rollbackSQL)
		return Result{}, instanceState{}, err
	}
	var (
		res Result
		end = commitSQL
	)
	switch {
	case !c.won:
		e.metrics.claims.WithLabelValues(claimLost).Inc()
		res.Outcome, end = Duplicate, rollbackSQL
	case c.existing.settled():
		// The claim was free although the message is stored: a T1 ended after its state commit,
		// or the row predates the claim table. Committing restores the claim, so that later
		// duplicates lose at the claim insert.
		e.metrics.claims.WithLabelValues(claimWon).Inc()
		res.Outcome = Duplicate
	case evaluate && !mt.Condition.Holds(c.state.processed):
		e.metrics.claims.WithLabelValues(claimWon).Inc()
		res.Outcome = Buffered
		err = bufferUnderClaim(ctx, conn, instanceID, c.existing, msg)
	default:
		e.metrics.claims.WithLabelValues(claimWon).Inc()
		res, end, err = e.deliverUnderClaim(ctx, stateConn, instanceID, c, msg)
	}
	if err != nil {
		endQuietly(conn, rollbackSQL)
		return res, instanceState{}, err
	}
	after, err := endClaimTx(ctx, conn, end, instanceID)
	if err != nil {
		return res, instanceState{}, fmt.Errorf("claim %s/%s: %w", msg.QualifiedType, msg.Record.IdempotenceID, err)
	}
	if res.Outcome == Buffered {
		e.metrics.buffered.WithLabelValues(msg.Sequence, msg.QualifiedType).Inc()
	}
	return res, after, nil
}

// claim begins T1 and runs, in one round trip, the claim insert (first statement, which also
// sets the lease), the lookup of a stored state and, when the release condition must be
// evaluated, the read of the processed types.
func (e *Engine) claim(ctx context.Context, conn *pgxpool.Conn, instanceID int64, msg Message, needState bool) (claim, error) {
	typ, id := msg.QualifiedType, msg.Record.IdempotenceID
	b := &pgx.Batch{}
	b.Queue(beginReadCommittedSQL)
	b.Queue(claimSQL, typ, id, instanceID, millis(e.claimLease))
	b.Queue(lookupMessageSQL, typ, id)
	if needState {
		b.Queue(instanceStateSQL, instanceID)
	}
	br := conn.SendBatch(ctx, b)
	c, err := readClaim(br, needState)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == foreignKeyViolation {
			return claim{}, fmt.Errorf("claim %s/%s: %w", typ, id, errInstanceGone)
		}
		return claim{}, fmt.Errorf("claim %s/%s: %w", typ, id, err)
	}
	c.lease = &lease{conn: conn, length: e.claimLease}
	c.lease.answered()
	return c, nil
}

// foreignKeyViolation is SQLSTATE 23503.
const foreignKeyViolation = "23503"

func readClaim(br pgx.BatchResults, needState bool) (claim, error) {
	var c claim
	if _, err := br.Exec(); err != nil {
		return c, fmt.Errorf("begin: %w", err)
	}
	tag, err := br.Exec()
	if err != nil {
		return c, fmt.Errorf("insert claim: %w", err)
	}
	c.won = tag.RowsAffected() == 1
	err = br.QueryRow().Scan(&c.existing.id, &c.existing.state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("look up stored message: %w", err)
	}
	c.state = instanceState{processed: map[string]bool{}}
	if needState {
		if c.state, err = scanInstanceState(br.QueryRow()); err != nil {
			return c, fmt.Errorf("read instance: %w", err)
		}
	}
	return c, nil
}

// deliverUnderClaim invokes the listener while T1 holds the claim idle (callUnderLease), then
// stores the resulting state on stateConn in a separate transaction that commits before T1
// (docs/design.md#claim-transaction-t1). It says how T1 must end.
func (e *Engine) deliverUnderClaim(ctx context.Context, stateConn *stateConn, instanceID int64, c claim, msg Message) (Result, string, error) {
	key := msg.QualifiedType + "/" + msg.Record.IdempotenceID
	listenerErr, err := e.callUnderLease(ctx, c.lease, stateConn, msg)
	if err != nil {
		return Result{}, rollbackSQL, fmt.Errorf("claim %s: %w", key, err)
	}
	if listenerErr != nil && ctx.Err() != nil {
		// The caller abandoned the record (shutdown, revocation): not the listener's failure.
		return Result{}, rollbackSQL, fmt.Errorf("claim %s: %w", key, ctx.Err())
	}
	state, end := stateProcessed, commitSQL
	if listenerErr != nil {
		state, end = stateFailed, rollbackSQL
	}
	stored, err := e.storeStateUnderLease(ctx, stateConn, c.lease, instanceID, c.existing, state, msg)
	if err != nil {
		return Result{}, rollbackSQL, fmt.Errorf("claim %s: store %s: %w", key, state, err)
	}
	if !stored {
		return Result{}, rollbackSQL, fmt.Errorf("claim %s: %w", key, errStateChanged)
	}
	if listenerErr != nil {
		return Result{Outcome: Failed, ListenerErr: listenerErr}, end, nil
	}
	return Result{Outcome: Delivered}, end, nil
}

// insertStateSQL stores the state of a delivered message that had no row, with the raw record
// of this delivery when it is to be kept ($13, keepsRecord): a FAILED message's, for the resend
// or action that settles it, and a PROCESSED one's only when its sequence keeps the records of
// delivered messages for replay. The guard finds a row only when someone else recorded the
// message after T1's lookup, which means our claim was lost.
//
// A PROCESSED state commits without waiting for its WAL flush (synchronous_commit off for this
// transaction only, set in the same statement): T1 commits after it and waits for its own flush,
// which covers every earlier WAL record, so the state is durable before the record's offset may
// be committed, at one WAL flush per message instead of two (see docs/performance.md). A server
// crash between the two commits loses both, and the record is delivered again, as after a crash
// before the state write.
const insertStateSQL = `WITH m AS (
  INSERT INTO sequenced_message
    (sequence_instance_id, message_type, idempotence_id, message_id, topic, partition, "offset", state, trace_context)
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
  WHERE NOT EXISTS (SELECT 1 FROM sequenced_message WHERE idempotence_id = $3 AND message_type = $2)
  RETURNING id, sequence_instance_id
), r AS (
  INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
  SELECT sequence_instance_id, id, $10, $11, $12 FROM m WHERE $13
)
SELECT set_config('synchronous_commit', CASE WHEN $8 = 'PROCESSED' THEN 'off' ELSE current_setting('synchronous_commit') END, true) FROM m`

// updateFailedStateSQL stores the new state of a redelivered FAILED message on its row, with the
// raw record of this delivery when it is to be kept ($12, keepsRecord), else without the record
// the failure had kept; it writes nothing unless the row is still FAILED.
const updateFailedStateSQL = `WITH m AS (
  UPDATE sequenced_message
  SET state = $2, state_changed_at = now(), sequence_instance_id = $3, message_id = $4, topic = $5,
      partition = $6, "offset" = $7, trace_context = $8
  WHERE id = $1 AND state = 'FAILED'
  RETURNING id, sequence_instance_id
), r AS (
  INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
  SELECT sequence_instance_id, id, $9, $10, $11 FROM m WHERE $12
  ON CONFLICT (sequenced_message_id) DO UPDATE
  SET sequence_instance_id = EXCLUDED.sequence_instance_id, key = EXCLUDED.key, value = EXCLUDED.value, headers = EXCLUDED.headers
), d AS (
  DELETE FROM buffered_message b USING m WHERE b.sequenced_message_id = m.id AND NOT $12
)
SELECT 1 FROM m`

// storeStateInNewTx writes the state of a message delivered under a claim in its own
// single-statement transaction (the held one, stateConn.exec), on a connection other than T1's.
// It reports false when the message was recorded by someone else meanwhile.
func (e *Engine) storeStateInNewTx(ctx context.Context, conn *stateConn, instanceID int64, existing storedMessage, state string, msg Message) (bool, error) {
	r, o := msg.Record, msg.Record.Origin
	headers, err := encodeHeaders(r.Headers)
	if err != nil {
		return false, err
	}
	keep := e.keepsRecord(msg.Sequence, state)
	if existing.state == stateFailed {
		tag, err := conn.exec(ctx, updateFailedStateSQL, existing.id, state, instanceID,
			o.MessageID, o.Topic, o.Partition, o.Offset, traceContext(r.Headers), r.Key, r.Value, headers, keep)
		return tag.RowsAffected() == 1, err
	}
	tag, err := conn.exec(ctx, insertStateSQL, instanceID, msg.QualifiedType, r.IdempotenceID,
		o.MessageID, o.Topic, o.Partition, o.Offset, state, traceContext(r.Headers), r.Key, r.Value, headers, keep)
	return tag.RowsAffected() == 1, err
}

// keepsRecord reports whether a message of the sequence that goes into state keeps its raw
// record: one the engine may still have to deliver (WAITING, FAILED) always, a PROCESSED one only
// when the sequence keeps the records of delivered messages for replay.
func (e *Engine) keepsRecord(sequenceName, state string) bool {
	if state != stateProcessed {
		return true
	}
	seq, ok := e.set.Sequence(sequenceName)
	return ok && seq.KeepDeliveredRecords
}

// stateWriteBackoff is the first wait before a state write is tried again; it doubles.
const stateWriteBackoff = 50 * time.Millisecond

// storeStateUnderLease writes the state after the listener returned. An outcome the listener
// reported is known and must not be thrown away: the write ignores the cancellation of the record
// (revocation, shutdown) and, when its connection fails, is tried again on a new one while T1's
// lease holds the claim (lease.writeContext). The sink then sees a second call only when the
// outcome could not be recorded at all. As the claim is held, a retry that finds the message
// already in the wanted state finds the write of an attempt whose answer was lost.
func (e *Engine) storeStateUnderLease(ctx context.Context, conn *stateConn, l *lease, instanceID int64, existing storedMessage, state string, msg Message) (bool, error) {
	wctx, cancel := l.writeContext(ctx)
	defer cancel()
	stored, err := e.storeStateInNewTx(wctx, conn, instanceID, existing, state, msg)
	for backoff := stateWriteBackoff; err != nil && retryableStateWrite(err); backoff *= 2 {
		e.log.Info("state write failed; retrying on a new connection within the claim's lease",
			"type", msg.QualifiedType, "idempotenceId", msg.Record.IdempotenceID, "state", state, "error", err.Error())
		select {
		case <-wctx.Done():
			return false, fmt.Errorf("%w (lease ended: %w)", err, wctx.Err())
		case <-time.After(backoff):
		}
		stored, err = e.storeStateOnNewConn(wctx, instanceID, existing, state, msg)
	}
	return stored, err
}

// storeStateOnNewConn is one retry of storeStateUnderLease.
func (e *Engine) storeStateOnNewConn(ctx context.Context, instanceID int64, existing storedMessage, state string, msg Message) (bool, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire state connection: %w", err)
	}
	defer conn.Release()
	stored, err := e.storeStateInNewTx(ctx, &stateConn{conn: conn}, instanceID, existing, state, msg)
	if err != nil || stored {
		return stored, err
	}
	var now storedMessage
	err = conn.QueryRow(ctx, lookupMessageSQL, msg.QualifiedType, msg.Record.IdempotenceID).Scan(&now.id, &now.state)
	if err != nil {
		return false, fmt.Errorf("look up state after a retried write: %w", err)
	}
	return now.state == state, nil
}

// retryableStateWrite reports whether a failed state write may succeed on a new connection: the
// connection failed (no answer from the server, SQLSTATE class 08) or the server ended the
// session (class 57P, e.g. pg_terminate_backend or a restart).
func retryableStateWrite(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return !errors.Is(err, context.DeadlineExceeded)
	}
	return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
}

// bufferNewSQL stores a message that waits for its predecessors: its WAITING row and its raw
// record, inside T1 (no listener runs, so nothing needs to survive a rollback of T1, and the
// claim and the buffered message commit together).
const bufferNewSQL = `WITH m AS (
  INSERT INTO sequenced_message
    (sequence_instance_id, message_type, idempotence_id, message_id, topic, partition, "offset", state, trace_context)
  VALUES ($1, $2, $3, $4, $5, $6, $7, 'WAITING', $8)
  RETURNING id, sequence_instance_id
)
INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
SELECT sequence_instance_id, id, $9, $10, $11 FROM m`

// bufferFailedSQL buffers a redelivered FAILED message on its row, replacing an older record. It
// writes nothing unless the row is still FAILED: an operator's EXPIRE, for one, is final.
const bufferFailedSQL = `WITH m AS (
  UPDATE sequenced_message
  SET state = 'WAITING', state_changed_at = now(), sequence_instance_id = $1, message_id = $4, topic = $5,
      partition = $6, "offset" = $7, trace_context = $8
  WHERE id = $12 AND message_type = $2 AND idempotence_id = $3 AND state = 'FAILED'
  RETURNING id, sequence_instance_id
)
INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
SELECT sequence_instance_id, id, $9, $10, $11 FROM m
ON CONFLICT (sequenced_message_id) DO UPDATE
SET sequence_instance_id = EXCLUDED.sequence_instance_id, key = EXCLUDED.key, value = EXCLUDED.value, headers = EXCLUDED.headers`

// bufferUnderClaim writes the WAITING row and the raw record inside T1.
func bufferUnderClaim(ctx context.Context, conn *pgxpool.Conn, instanceID int64, existing storedMessage, msg Message) error {
	r := msg.Record
	args, sql, err := bufferArgs(instanceID, existing, msg)
	if err != nil {
		return err
	}
	tag, err := conn.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("buffer %s/%s: %w", msg.QualifiedType, r.IdempotenceID, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("buffer %s/%s: %w", msg.QualifiedType, r.IdempotenceID, errStateChanged)
	}
	return nil
}

// bufferArgs chooses the statement that buffers a message (bufferNewSQL, or bufferFailedSQL on
// a FAILED row) and its arguments.
func bufferArgs(instanceID int64, existing storedMessage, msg Message) ([]any, string, error) {
	r, o := msg.Record, msg.Record.Origin
	headers, err := encodeHeaders(r.Headers)
	if err != nil {
		return nil, "", fmt.Errorf("buffer %s/%s: %w", msg.QualifiedType, r.IdempotenceID, err)
	}
	args := []any{instanceID, msg.QualifiedType, r.IdempotenceID, o.MessageID, o.Topic, o.Partition, o.Offset,
		traceContext(r.Headers), r.Key, r.Value, headers}
	if existing.state == stateFailed {
		return append(args, existing.id), bufferFailedSQL, nil
	}
	return args, bufferNewSQL, nil
}

// endClaimTx commits or rolls back T1 and, in the same round trip, reads the instance state that
// decides about T2; the read runs after the end of T1, so it sees T1's and the state
// transaction's writes.
func endClaimTx(ctx context.Context, conn *pgxpool.Conn, end string, instanceID int64) (instanceState, error) {
	b := &pgx.Batch{}
	b.Queue(end)
	b.Queue(instanceStateSQL, instanceID)
	br := conn.SendBatch(ctx, b)
	st, err := readEnd(br, end)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return st, err
}

func readEnd(br pgx.BatchResults, end string) (instanceState, error) {
	tag, err := br.Exec()
	if err != nil {
		return instanceState{}, fmt.Errorf("%s: %w", end, err)
	}
	// COMMIT of a failed transaction answers ROLLBACK without an error.
	if end == commitSQL && tag.String() != commitSQL {
		return instanceState{}, fmt.Errorf("commit: transaction was rolled back (%s)", tag)
	}
	st, err := scanInstanceState(br.QueryRow())
	if err != nil {
		return instanceState{}, fmt.Errorf("read instance after %s: %w", end, err)
	}
	return st, nil
}

// endQuietly ends a transaction on an error path. When that fails too, the connection stays in
// its transaction and pgxpool closes it on release, which makes the server roll back.
func endQuietly(conn *pgxpool.Conn, end string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = conn.Exec(ctx, end)
}
