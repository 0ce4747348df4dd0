package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MessageAction is an operator action on one logical message (SPEC §6).
type MessageAction string

const (
	// ActionConsume delivers the message now, whatever its state, then releases its dependents.
	ActionConsume MessageAction = "CONSUME"
	// ActionExpire marks the message PROCESSED without delivering it; dependents become releasable.
	ActionExpire MessageAction = "EXPIRE"
)

// InstanceAction is an operator action on one sequence instance (SPEC §6).
type InstanceAction string

const (
	// ActionConsumeAll delivers every buffered message of the instance, ignoring conditions.
	ActionConsumeAll InstanceAction = "CONSUME_ALL"
	// ActionClose closes the instance without delivering its buffered messages; they are set
	// FAILED (claims deleted, so a re-publish can retry them) and dead-lettered.
	ActionClose InstanceAction = "CLOSE"
)

// ErrNotFound reports that the message or instance an action names does not exist.
var ErrNotFound = errors.New("not found")

// Execer runs one statement; *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// requestMessageActionSQL records an action on the row that stands for the logical message, the
// same row the claim lookup picks among historical duplicates.
const requestMessageActionSQL = `UPDATE sequenced_message SET pending_action = $3
WHERE id = (` + lookupMessageIDSQL + `)`

const lookupMessageIDSQL = `SELECT id FROM sequenced_message
WHERE idempotence_id = $2 AND message_type = $1
ORDER BY CASE state WHEN 'PROCESSED' THEN 0 WHEN 'WAITING' THEN 1 ELSE 2 END, id DESC
LIMIT 1`

// RequestMessageAction records a pending action on the message (qualified type, idempotence
// ID); a consumer executes it in RunPendingActions.
func RequestMessageAction(ctx context.Context, db Execer, qualifiedType, idempotenceID string, a MessageAction) error {
	if a != ActionConsume && a != ActionExpire {
		return fmt.Errorf("request %s on %s/%s: unknown message action", a, qualifiedType, idempotenceID)
	}
	tag, err := db.Exec(ctx, requestMessageActionSQL, qualifiedType, idempotenceID, string(a))
	if err != nil {
		return fmt.Errorf("request %s on %s/%s: %w", a, qualifiedType, idempotenceID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("request %s on %s/%s: message %w", a, qualifiedType, idempotenceID, ErrNotFound)
	}
	return nil
}

const requestInstanceActionSQL = `UPDATE sequence_instance SET pending_action = $3 WHERE name = $1 AND context_id = $2`

// RequestInstanceAction records a pending action on the instance (sequence, context ID); a
// consumer executes it in RunPendingActions.
func RequestInstanceAction(ctx context.Context, db Execer, sequence, contextID string, a InstanceAction) error {
	if a != ActionConsumeAll && a != ActionClose {
		return fmt.Errorf("request %s on %s/%s: unknown instance action", a, sequence, contextID)
	}
	tag, err := db.Exec(ctx, requestInstanceActionSQL, sequence, contextID, string(a))
	if err != nil {
		return fmt.Errorf("request %s on %s/%s: %w", a, sequence, contextID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("request %s on %s/%s: instance %w", a, sequence, contextID, ErrNotFound)
	}
	return nil
}

// pendingInstancesSQL finds instances with a pending action on themselves or on a message.
const pendingInstancesSQL = `SELECT id FROM sequence_instance WHERE pending_action IS NOT NULL
UNION
SELECT sequence_instance_id FROM sequenced_message WHERE pending_action IS NOT NULL
ORDER BY 1
LIMIT $1`

// actionBatchSize bounds the instances one RunPendingActions call works on.
const actionBatchSize = 100

// RunPendingActions executes pending operator actions, each instance under its release lock;
// instances being released by someone else right now are left to the next run. Messages whose
// delivery fails, and buffered messages of a closed instance, go to dl. It returns the number of
// actions executed.
func (e *Engine) RunPendingActions(ctx context.Context, dl DeadLetterer) (int, error) {
	if dl == nil {
		return 0, errors.New("pending actions: no dead-letterer")
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("pending actions: acquire connection: %w", err)
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, pendingInstancesSQL, actionBatchSize)
	if err != nil {
		return 0, fmt.Errorf("pending actions: find: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("pending actions: find: %w", err)
	}
	done := 0
	for _, id := range ids {
		n, err := e.runActionsUnderInstanceLock(ctx, conn, id, dl)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// pendingMessageActionsSQL lists the message actions of an instance in message order.
const pendingMessageActionsSQL = `SELECT id, state, pending_action FROM sequenced_message
WHERE sequence_instance_id = $1 AND pending_action IS NOT NULL
ORDER BY id`

// claimForActionSQL takes the claim of a FAILED message before CONSUME delivers it, inside the
// action transaction: a resend in flight makes it wait and then find the claim taken.
const claimForActionSQL = `INSERT INTO sequential_inbox_idempotence (message_type, idempotence_id, sequence_instance_id, created_at)
SELECT message_type, idempotence_id, sequence_instance_id, now() FROM sequenced_message WHERE id = $1
ON CONFLICT (message_type, idempotence_id) DO NOTHING`

// expireSQL marks a message PROCESSED without delivery and drops its raw record.
const expireSQL = `WITH m AS (
  UPDATE sequenced_message
  SET state = 'PROCESSED', pending_action = NULL,
      state_changed_at = CASE WHEN state = 'PROCESSED' THEN state_changed_at ELSE now() END
  WHERE id = $1
  RETURNING id
)
DELETE FROM buffered_message b USING m WHERE b.sequenced_message_id = m.id`

const clearMessageActionSQL = `UPDATE sequenced_message SET pending_action = NULL WHERE id = $1`

const clearInstanceActionSQL = `UPDATE sequence_instance SET pending_action = NULL WHERE id = $1`

// runActionsUnderInstanceLock executes the pending actions of one instance in one transaction
// that holds the instance's release lock: message actions in message order, then the instance
// action, then the ordinary release of whatever became releasable.
func (e *Engine) runActionsUnderInstanceLock(ctx context.Context, conn *pgxpool.Conn, instanceID int64, dl DeadLetterer) (int, error) {
	li, err := e.lockInstance(ctx, conn, instanceID, lockInstanceSkipLockedSQL)
	if err != nil || li == nil {
		endQuietly(conn, rollbackSQL)
		if err != nil {
			return 0, fmt.Errorf("actions on instance %d: %w", instanceID, err)
		}
		return 0, nil
	}
	defer li.releaseStateConn()
	done, err := li.runActions(ctx)
	if err != nil {
		endQuietly(conn, rollbackSQL)
		return 0, fmt.Errorf("actions on instance %d (%s/%s): %w", instanceID, li.name, li.contextID, err)
	}
	if err := li.commit(ctx); err != nil {
		return 0, fmt.Errorf("actions on instance %d (%s/%s): %w", instanceID, li.name, li.contextID, err)
	}
	for _, f := range li.failures {
		if err := dl.DeadLetter(ctx, f.Message, "operator action: "+f.Err.Error()); err != nil {
			return done, fmt.Errorf("actions on instance %d: dead-letter %s/%s: %w",
				instanceID, f.Message.QualifiedType, f.Message.Record.IdempotenceID, err)
		}
	}
	return done, nil
}

// pendingMessageAction is one row of pendingMessageActionsSQL.
type pendingMessageAction struct {
	id     int64
	state  string
	action MessageAction
}

func (li *lockedInstance) runActions(ctx context.Context) (int, error) {
	rows, err := li.conn.Query(ctx, pendingMessageActionsSQL, li.id)
	if err != nil {
		return 0, fmt.Errorf("list message actions: %w", err)
	}
	actions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pendingMessageAction, error) {
		var a pendingMessageAction
		err := r.Scan(&a.id, &a.state, &a.action)
		return a, err
	})
	if err != nil {
		return 0, fmt.Errorf("list message actions: %w", err)
	}
	done := 0
	for _, a := range actions {
		if err := li.runMessageAction(ctx, a); err != nil {
			return done, err
		}
		li.e.metrics.actions.WithLabelValues(string(a.action)).Inc()
		done++
	}
	if li.action != nil {
		if err := li.runInstanceAction(ctx, InstanceAction(*li.action)); err != nil {
			return done, err
		}
		li.e.metrics.actions.WithLabelValues(*li.action).Inc()
		done++
	}
	if seq, ok := li.e.set.Sequence(li.name); ok {
		if err := li.readState(ctx); err != nil {
			return done, err
		}
		if err := li.releaseReady(ctx, seq); err != nil {
			return done, err
		}
	}
	return done, nil
}

func (li *lockedInstance) runMessageAction(ctx context.Context, a pendingMessageAction) error {
	stateConn, err := li.acquireStateConn(ctx)
	if err != nil {
		return err
	}
	switch {
	case a.action == ActionExpire:
		if _, err := stateConn.Exec(ctx, expireSQL, a.id); err != nil {
			return fmt.Errorf("expire message %d: %w", a.id, err)
		}
		return nil
	case a.action == ActionConsume && a.state == stateWaiting:
		return li.deliverStored(ctx, a.id, stateWaiting)
	case a.action == ActionConsume && a.state == stateFailed:
		tag, err := li.conn.Exec(ctx, claimForActionSQL, a.id)
		if err != nil {
			return fmt.Errorf("claim message %d: %w", a.id, err)
		}
		if tag.RowsAffected() == 1 {
			return li.deliverStored(ctx, a.id, stateFailed)
		}
		li.e.log.Info("CONSUME skipped: a redelivery holds the message's claim", "messageId", a.id,
			"sequence", li.name, "context", li.contextID)
	default:
		li.e.log.Info("action has nothing to do", "action", a.action, "state", a.state, "messageId", a.id,
			"sequence", li.name, "context", li.contextID)
	}
	if _, err := stateConn.Exec(ctx, clearMessageActionSQL, a.id); err != nil {
		return fmt.Errorf("clear action of message %d: %w", a.id, err)
	}
	return nil
}

func (li *lockedInstance) runInstanceAction(ctx context.Context, a InstanceAction) error {
	if err := li.readState(ctx); err != nil {
		return err
	}
	st := li.state
	switch a {
	case ActionConsumeAll:
		for _, w := range st.waiting {
			if err := li.deliverStored(ctx, w.id, stateWaiting); err != nil {
				return err
			}
		}
		if _, err := li.conn.Exec(ctx, clearInstanceActionSQL, li.id); err != nil {
			return fmt.Errorf("clear instance action: %w", err)
		}
		return nil
	case ActionClose:
		stateConn, err := li.acquireStateConn(ctx)
		if err != nil {
			return err
		}
		for _, w := range st.waiting {
			s, err := li.load(ctx, w.id)
			if err != nil {
				return err
			}
			if _, err := stateConn.Exec(ctx, markReleaseFailedSQL, w.id); err != nil {
				return fmt.Errorf("fail message %d: %w", w.id, err)
			}
			li.failures = append(li.failures, Failure{Message: s.msg, Origin: s.msg.Record.Origin,
				Err: errors.New("sequence closed without delivery")})
		}
		li.close()
		return nil
	default:
		li.e.log.Info("unknown instance action cleared", "action", a, "sequence", li.name, "context", li.contextID)
		if _, err := li.conn.Exec(ctx, clearInstanceActionSQL, li.id); err != nil {
			return fmt.Errorf("clear instance action: %w", err)
		}
		return nil
	}
}
