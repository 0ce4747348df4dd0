package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// lockInstanceSQL takes the release lock of an instance. FOR NO KEY UPDATE, not FOR UPDATE: the
// foreign keys of every claim and message insert take FOR KEY SHARE locks on the instance row,
// which FOR UPDATE would conflict with, so a release would wait for every in-flight T1 of the
// instance and buffering would stall behind a release (docs/design.md#release-transaction-t2). FOR
// NO KEY UPDATE only conflicts with itself and stronger locks, which is what serializes releases
// and actions.
const lockInstanceSQL = `SELECT name, context_id, state = 'OPEN', pending_action, coalesce(pending_action_id, '')
FROM sequence_instance WHERE id = $1
FOR NO KEY UPDATE`

// lockInstanceSkipLockedSQL is lockInstanceSQL for action runs: an instance that someone is
// releasing right now is left to the next run.
const lockInstanceSkipLockedSQL = lockInstanceSQL + ` SKIP LOCKED`

// closeInstanceSQL closes a complete instance (or one closed by an operator action) at $2 and
// starts its duplicate-protection window: housekeeping deletes the instance and its claims once
// remove_after ($3) has passed. A pending instance action survives it: only the action's own
// execution clears it.
const closeInstanceSQL = `UPDATE sequence_instance SET state = 'CLOSED', closed_at = $2, remove_after = $3
WHERE id = $1 AND state = 'OPEN'`

// loadBufferedSQL reads a stored message with its raw record, if it has one, and how long it has
// been waiting (measured by the database, like created_at).
const loadBufferedSQL = `SELECT m.message_type, m.idempotence_id, m.state, coalesce(m.message_id, ''),
  coalesce(m.topic, ''), coalesce(m.partition, 0), coalesce(m."offset", 0), m.created_at,
  b.id IS NOT NULL, b.key, b.value, coalesce(b.headers, '[]'),
  extract(epoch FROM clock_timestamp() - m.created_at)::float8
FROM sequenced_message m LEFT JOIN buffered_message b ON b.sequenced_message_id = m.id
WHERE m.id = $1`

// markReleasedSQL records a released message as PROCESSED and, in the same statement, deletes its
// raw record unless its sequence keeps the records of delivered messages ($3, keepsRecord). The
// write happens only when the row is still in the expected state ($2).
const markReleasedSQL = `WITH m AS (
  UPDATE sequenced_message SET state = 'PROCESSED', state_changed_at = now()
  WHERE id = $1 AND state = $2
  RETURNING id
), d AS (
  DELETE FROM buffered_message b USING m WHERE b.sequenced_message_id = m.id AND NOT $3
)
SELECT 1 FROM m`

// markReleaseFailedSQL sets a message FAILED and deletes its claim in one transaction
// (docs/design.md#a-failed-release), so that a resend can claim and retry it; only when the row
// is still in the expected state ($2). The raw record stays for a CONSUME action.
const markReleaseFailedSQL = `WITH f AS (
  UPDATE sequenced_message SET state = 'FAILED', state_changed_at = now()
  WHERE id = $1 AND state = $2
  RETURNING message_type, idempotence_id
), c AS (
  DELETE FROM sequential_inbox_idempotence c USING f
  WHERE c.message_type = f.message_type AND c.idempotence_id = f.idempotence_id
)
SELECT count(*) FROM f`

// lockedInstance is an instance row locked FOR NO KEY UPDATE by an open transaction on conn (T2
// or an action transaction), a lease (lease.go). While it is held, nobody else releases or acts
// on the instance's messages. Message states are written in separate transactions on stateConn,
// taken before the lock, each committed right after its listener call, so that a lost lock
// transaction loses no recorded delivery.
type lockedInstance struct {
	e         *Engine
	conn      *pgxpool.Conn
	stateConn *stateConn
	id        int64
	name      string
	contextID string
	open      bool
	action    *string
	// actionID is the request id of the pending instance action ('' without one).
	actionID string
	// closing is set when the instance is to be closed; the update goes with the commit.
	closing bool
	// state is the instance state read last inside the lock transaction.
	state instanceState
	// lease is the lock transaction; every statement on conn restarts it.
	lease    *lease
	released []Message
	failures []Failure
}

// releaseUnderInstanceLock is T2 (docs/design.md#release-transaction-t2): lock the instance,
// release the oldest WAITING message whose condition holds until none is left, close the instance
// when every type is PROCESSED. It also runs for duplicates, so that a crashed winner's buffered
// successors are released by the next delivery. stateConn is for the state writes (lockedInstance).
func (e *Engine) releaseUnderInstanceLock(ctx context.Context, conn *pgxpool.Conn, stateConn *stateConn, instanceID int64, seq *sequence.Sequence) ([]Message, []Failure, error) {
	li, err := e.lockInstance(ctx, conn, stateConn, instanceID, lockInstanceSQL)
	if err != nil {
		endQuietly(conn, rollbackSQL)
		return nil, nil, fmt.Errorf("release instance %d: %w", instanceID, err)
	}
	if li == nil {
		endQuietly(conn, rollbackSQL)
		return nil, nil, nil
	}
	if err := li.releaseReady(ctx, seq); err != nil {
		endQuietly(conn, rollbackSQL)
		return li.released, li.failures, fmt.Errorf("release instance %d: %w", instanceID, err)
	}
	if err := li.commit(ctx); err != nil {
		return li.released, li.failures, fmt.Errorf("release instance %d: %w", instanceID, err)
	}
	return li.released, li.failures, nil
}

// lockInstance begins a transaction with the lock lease, locks the instance row and reads its
// state, in one round trip. It returns nil when the row is gone (or skipped as locked); the
// transaction is then still open.
func (e *Engine) lockInstance(ctx context.Context, conn *pgxpool.Conn, stateConn *stateConn, instanceID int64, lockSQL string) (*lockedInstance, error) {
	li := &lockedInstance{e: e, conn: conn, stateConn: stateConn, id: instanceID, lease: &lease{conn: conn, length: e.lockLease}}
	b := &pgx.Batch{}
	b.Queue(beginReadCommittedSQL)
	b.Queue(setIdleTimeoutSQL, millis(e.lockLease))
	b.Queue(lockSQL, instanceID)
	b.Queue(instanceStateSQL, instanceID)
	br := conn.SendBatch(ctx, b)
	found, err := func() (bool, error) {
		if _, err := br.Exec(); err != nil {
			return false, fmt.Errorf("begin: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return false, fmt.Errorf("set lock lease: %w", err)
		}
		err := br.QueryRow().Scan(&li.name, &li.contextID, &li.open, &li.action, &li.actionID)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("lock: %w", err)
		}
		// Read after the lock was granted: its snapshot sees every release committed before.
		if li.state, err = scanInstanceState(br.QueryRow()); err != nil {
			return false, fmt.Errorf("read state: %w", err)
		}
		return true, nil
	}()
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil || !found {
		return nil, err
	}
	li.lease.answered()
	return li, nil
}

// readState reads the instance state inside the lock transaction; it also restarts the lease.
func (li *lockedInstance) readState(ctx context.Context) error {
	st, err := scanInstanceState(li.conn.QueryRow(ctx, instanceStateSQL, li.id))
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	li.state = st
	li.lease.answered()
	return nil
}

// releaseReady releases WAITING messages whose condition holds, oldest first, re-reading the
// state after each one (the release may satisfy another condition, and messages committed in
// the meantime become visible), then marks the instance for closing if it is complete.
func (li *lockedInstance) releaseReady(ctx context.Context, seq *sequence.Sequence) error {
	for {
		w, ok := li.state.nextReleasable(seq)
		if !ok {
			if li.open && seq.Complete(li.state.processed) {
				li.close()
			}
			return nil
		}
		if err := li.deliverStored(ctx, w.id); err != nil {
			return err
		}
		if err := li.readState(ctx); err != nil {
			return err
		}
	}
}

// duplicateProtection is how long a closed instance of the sequence is kept for its duplicates;
// one of a sequence that is no longer declared is not kept.
func (e *Engine) duplicateProtection(sequenceName string) time.Duration {
	if seq, ok := e.set.Sequence(sequenceName); ok {
		return seq.DuplicateProtection
	}
	return 0
}

// close marks the instance for closing; commit writes it.
func (li *lockedInstance) close() {
	li.open, li.closing = false, true
}

// storedRecord is a stored message with its raw record.
type storedRecord struct {
	msg       Message
	state     string
	hasRecord bool
	waited    float64
}

// load reads a stored message of the instance inside the lock transaction.
func (li *lockedInstance) load(ctx context.Context, messageID int64) (storedRecord, error) {
	var (
		s         storedRecord
		r         = &s.msg.Record
		qualified string
		headers   []byte
	)
	err := li.conn.QueryRow(ctx, loadBufferedSQL, messageID).Scan(&qualified, &r.IdempotenceID, &s.state,
		&r.Origin.MessageID, &r.Origin.Topic, &r.Origin.Partition, &r.Origin.Offset, &r.ReceivedAt,
		&s.hasRecord, &r.Key, &r.Value, &headers, &s.waited)
	if err != nil {
		return s, fmt.Errorf("load message %d: %w", messageID, err)
	}
	li.lease.answered()
	if r.Headers, err = decodeHeaders(headers); err != nil {
		return s, fmt.Errorf("load message %d: %w", messageID, err)
	}
	r.Type, r.Subtype = li.e.splitQualified(qualified)
	r.ContextID, r.Sequenced = li.contextID, true
	s.msg.Sequence, s.msg.ContextID, s.msg.QualifiedType = li.name, li.contextID, qualified
	return s, nil
}

// deliverStored hands a WAITING message's raw record to the listener and records the outcome in
// a separate transaction: PROCESSED, or FAILED with its claim deleted (reported in failures).
// Both writes happen only when the row is still WAITING.
func (li *lockedInstance) deliverStored(ctx context.Context, messageID int64) error {
	d, err := li.deliverRecord(ctx, messageID)
	if err != nil {
		return err
	}
	s, listenerErr := d.stored, d.listenerErr
	var n int
	if listenerErr != nil {
		if err := li.stateConn.queryRow(ctx, []any{&n}, markReleaseFailedSQL, messageID, stateWaiting); err != nil {
			return fmt.Errorf("mark message %d failed: %w", messageID, err)
		}
		li.failures = append(li.failures, Failure{Message: s.msg, Origin: s.msg.Record.Origin, Err: listenerErr})
	} else {
		tag, err := li.stateConn.exec(ctx, markReleasedSQL, messageID, stateWaiting, li.e.keepsRecord(li.name, stateProcessed))
		if err != nil {
			return fmt.Errorf("mark message %d processed: %w", messageID, err)
		}
		n = int(tag.RowsAffected())
		li.e.metrics.waitingDelay.WithLabelValues(s.msg.Sequence, s.msg.QualifiedType).Observe(s.waited)
		li.released = append(li.released, s.msg)
	}
	if n == 0 {
		li.e.log.Info("delivered message changed state during its delivery; its state is left as found", "messageId", messageID,
			"sequence", li.name, "context", li.contextID, "expected", stateWaiting)
	}
	return nil
}

// errNoStoredRecord is the listener error of a message that has no raw record to deliver: a
// delivered one whose sequence does not keep the records of delivered messages.
var errNoStoredRecord = errors.New("no stored record to deliver")

// delivery is what deliverRecord did: the loaded message and the listener's error.
type delivery struct {
	stored      storedRecord
	listenerErr error
}

// deliverRecord loads a stored message and hands its raw record to the listener under the lock's
// lease (callUnderLease: the load is the answer the call follows). Its error is for everything
// but the listener's failure.
func (li *lockedInstance) deliverRecord(ctx context.Context, messageID int64) (delivery, error) {
	s, err := li.load(ctx, messageID)
	if err != nil {
		return delivery{}, err
	}
	listenerErr := errNoStoredRecord
	if s.hasRecord {
		if listenerErr, err = li.e.callUnderLease(ctx, li.lease, li.stateConn, s.msg); err != nil {
			return delivery{}, err
		}
	}
	if ctx.Err() != nil {
		return delivery{}, ctx.Err()
	}
	return delivery{stored: s, listenerErr: listenerErr}, nil
}

// commit ends the lock transaction, closing the instance in the same round trip if marked.
func (li *lockedInstance) commit(ctx context.Context) error {
	b := &pgx.Batch{}
	if li.closing {
		closedAt := li.e.clock.Now()
		b.Queue(closeInstanceSQL, li.id, closedAt, closedAt.Add(li.e.duplicateProtection(li.name)))
	}
	b.Queue(commitSQL)
	br := li.conn.SendBatch(ctx, b)
	err := func() error {
		if li.closing {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("close: %w", err)
			}
		}
		tag, err := br.Exec()
		if err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		if tag.String() != commitSQL {
			return fmt.Errorf("commit: transaction was rolled back (%s)", tag)
		}
		return nil
	}()
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return err
}
