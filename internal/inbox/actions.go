package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MessageAction is an operator action on one logical message (docs/design.md#operator-actions).
type MessageAction string

const (
	// ActionConsume delivers the message now, whatever its state, then releases its dependents.
	ActionConsume MessageAction = "CONSUME"
	// ActionExpire marks the message PROCESSED without delivering it; dependents become releasable.
	ActionExpire MessageAction = "EXPIRE"
)

// InstanceAction is an operator action on one sequence instance (docs/design.md#operator-actions).
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

// DB runs single statements; *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Outcomes of an executed request, as operator_action.outcome stores them.
const (
	// OutcomeExecuted says the action ran and did its work (Detail says what).
	OutcomeExecuted = "Executed"
	// OutcomeFailed says the action ran and could not do its work (Detail says why).
	OutcomeFailed = "Failed"
	// OutcomeSuperseded says another request replaced it on the same target before it ran.
	OutcomeSuperseded = "Superseded"
)

// requestActionSQL records an action on the one row of table that pick selects (message or
// instance, the noun of the superseded request's detail). With a request id ($4) it also records
// the request ($5 names the target), and marks a request it replaces as superseded.
func requestActionSQL(table, pick, noun string) string {
	return `WITH target AS (
  SELECT id, pending_action_id FROM ` + table + ` WHERE ` + pick + ` FOR NO KEY UPDATE
), superseded AS (
  UPDATE operator_action o SET outcome = 'Superseded', executed_at = now(),
    detail = 'replaced by request ' || $4 || ' on the same ` + noun + ` before a consumer ran it'
  FROM target WHERE o.request_id = target.pending_action_id AND o.outcome IS NULL AND target.pending_action_id <> $4
), t AS (
  UPDATE ` + table + ` s SET pending_action = $3, pending_action_id = nullif($4, '')
  FROM target WHERE s.id = target.id
  RETURNING s.id
), request AS (
  INSERT INTO operator_action (request_id, action, target) SELECT $4, $3, $5 FROM t WHERE $4 <> ''
)
SELECT count(*) FROM t`
}

// requestMessageActionSQL records an action on the row that stands for the logical message, the
// same row the claim lookup picks among historical duplicates.
var requestMessageActionSQL = requestActionSQL("sequenced_message", "id = ("+lookupMessageIDSQL+")", "message")

const lookupMessageIDSQL = `SELECT id FROM sequenced_message
WHERE idempotence_id = $2 AND message_type = $1
` + standingRowFirst

// knownRequestSQL tells whether a request was recorded already (a rerun of its Job).
const knownRequestSQL = `SELECT EXISTS (SELECT 1 FROM operator_action WHERE request_id = $1)`

// RequestMessageAction records a pending action on the message (qualified type, idempotence
// ID); a consumer executes it in RunPendingActions. requestID, when not empty, names the request
// for ActionResultOf; recording the same request twice records it once.
func RequestMessageAction(ctx context.Context, db DB, requestID, qualifiedType, idempotenceID string, a MessageAction) error {
	if a != ActionConsume && a != ActionExpire {
		return fmt.Errorf("request %s on %s/%s: unknown message action", actionLabel(string(a)), qualifiedType, idempotenceID)
	}
	if known, err := requestKnown(ctx, db, requestID); err != nil || known {
		return err
	}
	var n int
	err := db.QueryRow(ctx, requestMessageActionSQL, qualifiedType, idempotenceID, string(a), requestID,
		"message "+qualifiedType+"/"+idempotenceID).Scan(&n)
	if err != nil {
		return fmt.Errorf("request %s on %s/%s: %w", actionLabel(string(a)), qualifiedType, idempotenceID, err)
	}
	if n == 0 {
		return fmt.Errorf("request %s on %s/%s: message %w", actionLabel(string(a)), qualifiedType, idempotenceID, ErrNotFound)
	}
	return nil
}

func requestKnown(ctx context.Context, db DB, requestID string) (bool, error) {
	if requestID == "" {
		return false, nil
	}
	var known bool
	if err := db.QueryRow(ctx, knownRequestSQL, requestID).Scan(&known); err != nil {
		return false, fmt.Errorf("request %s: %w", requestID, err)
	}
	return known, nil
}

// requestInstanceActionSQL records an action on the instance (sequence $1, context ID $2).
var requestInstanceActionSQL = requestActionSQL("sequence_instance", "name = $1 AND context_id = $2", "instance")

// RequestInstanceAction records a pending action on the instance (sequence, context ID); a
// consumer executes it in RunPendingActions. requestID is as for RequestMessageAction.
func RequestInstanceAction(ctx context.Context, db DB, requestID, sequence, contextID string, a InstanceAction) error {
	if a != ActionConsumeAll && a != ActionClose {
		return fmt.Errorf("request %s on %s/%s: unknown instance action", actionLabel(string(a)), sequence, contextID)
	}
	if known, err := requestKnown(ctx, db, requestID); err != nil || known {
		return err
	}
	var n int
	err := db.QueryRow(ctx, requestInstanceActionSQL, sequence, contextID, string(a), requestID,
		"instance "+sequence+"/"+contextID).Scan(&n)
	if err != nil {
		return fmt.Errorf("request %s on %s/%s: %w", actionLabel(string(a)), sequence, contextID, err)
	}
	if n == 0 {
		return fmt.Errorf("request %s on %s/%s: instance %w", actionLabel(string(a)), sequence, contextID, ErrNotFound)
	}
	return nil
}

// ActionResult is what became of a recorded request.
type ActionResult struct {
	// Done is false while the request waits for a consumer.
	Done bool
	// Outcome is OutcomeExecuted, OutcomeFailed or OutcomeSuperseded once Done.
	Outcome string
	// Detail says, for a person, what the action did or why it could not.
	Detail string
}

const actionResultSQL = `SELECT outcome IS NOT NULL, coalesce(outcome, ''), coalesce(detail, '')
FROM operator_action WHERE request_id = $1`

// ActionResultOf reads what became of the request; ErrNotFound when it was never recorded.
func ActionResultOf(ctx context.Context, db DB, requestID string) (ActionResult, error) {
	var r ActionResult
	err := db.QueryRow(ctx, actionResultSQL, requestID).Scan(&r.Done, &r.Outcome, &r.Detail)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("request %s: %w", requestID, ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("request %s: %w", requestID, err)
	}
	return r, nil
}

// pendingInstancesSQL finds instances with a pending action on themselves or on a message. Each
// side reads its partial index of pending actions in id order up to the limit, so that the
// planner never prefers to scan the table (it did with the statistics missing, taking every
// message for one with an action); the instances of the first messages by id are as good a
// batch as any, and the next run finds the rest.
const pendingInstancesSQL = `SELECT id FROM (
  (SELECT id FROM sequence_instance WHERE pending_action IS NOT NULL ORDER BY id LIMIT $1)
  UNION
  (SELECT sequence_instance_id FROM sequenced_message WHERE pending_action IS NOT NULL ORDER BY id LIMIT $1)
) p
ORDER BY 1
LIMIT $1`

// actionBatchSize bounds the instances one RunPendingActions call works on.
const actionBatchSize = 100

// RunPendingActions executes pending operator actions, each instance under its release lock;
// instances being released by someone else right now are left to the next run. It runs on the
// maintenance pool. Messages whose delivery fails, and buffered messages of a closed instance, go
// to dl. It returns the number of actions executed.
func (e *Engine) RunPendingActions(ctx context.Context, dl DeadLetterer) (int, error) {
	if dl == nil {
		return 0, errors.New("pending actions: no dead-letterer")
	}
	actx, cancel := context.WithTimeout(ctx, e.cfg.AcquireTimeout)
	conn, stateConn, err := e.acquirePair(actx, e.maint)
	cancel()
	if err != nil {
		return 0, fmt.Errorf("pending actions: maintenance pool: %w", err)
	}
	defer conn.Release()
	defer stateConn.release()
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
		n, err := e.runActionsUnderInstanceLock(ctx, conn, stateConn, id, dl)
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// pendingMessageActionsSQL lists the message actions of an instance in message order.
const pendingMessageActionsSQL = `SELECT id, message_type, idempotence_id, pending_action, coalesce(pending_action_id, '')
FROM sequenced_message
WHERE sequence_instance_id = $1 AND pending_action IS NOT NULL
ORDER BY id`

// Savepoint statements around one message action's claim inside the action transaction.
const (
	savepointSQL        = `SAVEPOINT message_action`
	rollbackToSavepoint = `ROLLBACK TO SAVEPOINT message_action`
	releaseSavepointSQL = `RELEASE SAVEPOINT message_action`
)

// claimForActionSQL is the first statement of a message action, behind a savepoint in the action
// transaction: the claim insert of a delivery's T1. Like T1 it waits for a delivery of the
// message in flight and then finds the claim taken (0 rows) or free (1 row, held until the
// action transaction ends). A failed action rolls back to the savepoint, so that its claim goes
// exactly as a failed delivery's does.
const claimForActionSQL = `INSERT INTO sequential_inbox_idempotence (message_type, idempotence_id, sequence_instance_id, created_at)
SELECT message_type, idempotence_id, sequence_instance_id, now() FROM sequenced_message WHERE id = $1
ON CONFLICT (message_type, idempotence_id) DO NOTHING`

// expectStateSQL writes a message state when the row is still in the state the action found
// ($2); PROCESSED to PROCESSED keeps its state_changed_at. A message that becomes PROCESSED loses
// its raw record unless its sequence keeps the records of delivered messages ($4, keepsRecord).
const expectStateSQL = `WITH m AS (
  UPDATE sequenced_message
  SET state = $3, state_changed_at = CASE WHEN state = $3 THEN state_changed_at ELSE now() END
  WHERE id = $1 AND state = $2
  RETURNING id
), d AS (
  DELETE FROM buffered_message b USING m WHERE b.sequenced_message_id = m.id AND NOT $4
)
SELECT 1 FROM m`

// dropClaimSQL deletes the claim of a message that an action leaves FAILED, so that a resend can
// claim and retry it.
const dropClaimSQL = `DELETE FROM sequential_inbox_idempotence c USING sequenced_message m
WHERE m.id = $1 AND c.message_type = m.message_type AND c.idempotence_id = m.idempotence_id`

// clearMessageActionSQL clears an executed action, unless another one was recorded meanwhile.
const clearMessageActionSQL = `UPDATE sequenced_message SET pending_action = NULL, pending_action_id = NULL
WHERE id = $1 AND pending_action = $2 AND coalesce(pending_action_id, '') = $3`

// clearInstanceActionSQL is clearMessageActionSQL for an instance.
const clearInstanceActionSQL = `UPDATE sequence_instance SET pending_action = NULL, pending_action_id = NULL
WHERE id = $1 AND coalesce(pending_action_id, '') = $2`

// reportActionSQL writes the outcome of an executed request.
const reportActionSQL = `UPDATE operator_action SET outcome = $2, detail = $3, executed_at = now()
WHERE request_id = $1 AND outcome IS NULL`

// deadLetterTimeout bounds publishing the dead letters an action run decided; they go out even
// when the run's context has ended.
const deadLetterTimeout = 30 * time.Second

// runActionsUnderInstanceLock executes the pending actions of one instance in one transaction
// that holds the instance's release lock: message actions in message order, then the instance
// action, then the ordinary release of whatever became releasable. The dead letters it decided
// are published whatever becomes of the rest of the run: each failure's state (FAILED, claim
// deleted) committed on the state connection before it was collected, so nothing else would ever
// retry it.
func (e *Engine) runActionsUnderInstanceLock(ctx context.Context, conn *pgxpool.Conn, stateConn *stateConn, instanceID int64, dl DeadLetterer) (int, error) {
	li, err := e.lockInstance(ctx, conn, stateConn, instanceID, lockInstanceSkipLockedSQL)
	if err != nil || li == nil {
		endQuietly(conn, rollbackSQL)
		if err != nil {
			return 0, fmt.Errorf("actions on instance %d: %w", instanceID, err)
		}
		return 0, nil
	}
	done, err := li.runActions(ctx)
	if err != nil {
		endQuietly(conn, rollbackSQL)
	} else {
		err = li.commit(ctx)
	}
	if err != nil {
		err = fmt.Errorf("actions on instance %d (%s/%s): %w", instanceID, li.name, li.contextID, err)
	}
	return done, errors.Join(err, publishFailures(ctx, dl, li.failures))
}

// publishFailures dead-letters the failures of an action run, each tried once; the error names
// those that could not be published.
func publishFailures(ctx context.Context, dl DeadLetterer, failures []Failure) error {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deadLetterTimeout)
	defer cancel()
	var errs []error
	for _, f := range failures {
		if err := dl.DeadLetter(pctx, f.Message, "operator action: "+f.Err.Error()); err != nil {
			errs = append(errs, fmt.Errorf("dead-letter %s/%s: %w", f.Message.QualifiedType, f.Message.Record.IdempotenceID, err))
		}
	}
	return errors.Join(errs...)
}

// pendingMessageAction is one row of pendingMessageActionsSQL: the row that carries the action
// and the logical message it names.
type pendingMessageAction struct {
	id                           int64
	qualifiedType, idempotenceID string
	action                       MessageAction
	requestID                    string
}

// actionOutcome is what an executed action reports (operator_action.outcome and detail).
type actionOutcome struct{ outcome, detail string }

func executed(format string, args ...any) actionOutcome {
	return actionOutcome{OutcomeExecuted, fmt.Sprintf(format, args...)}
}

func failed(format string, args ...any) actionOutcome {
	return actionOutcome{OutcomeFailed, fmt.Sprintf(format, args...)}
}

func (li *lockedInstance) runActions(ctx context.Context) (int, error) {
	rows, err := li.conn.Query(ctx, pendingMessageActionsSQL, li.id)
	if err != nil {
		return 0, fmt.Errorf("list message actions: %w", err)
	}
	actions, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pendingMessageAction, error) {
		var a pendingMessageAction
		err := r.Scan(&a.id, &a.qualifiedType, &a.idempotenceID, &a.action, &a.requestID)
		return a, err
	})
	if err != nil {
		return 0, fmt.Errorf("list message actions: %w", err)
	}
	done := 0
	for _, a := range actions {
		if err := li.runMessageAction(ctx, a); err != nil {
			return done, fmt.Errorf("%s %s/%s: %w", actionLabel(string(a.action)), a.qualifiedType, a.idempotenceID, err)
		}
		li.e.metrics.actions.WithLabelValues(actionLabel(string(a.action))).Inc()
		done++
	}
	if li.action != nil {
		if err := li.runInstanceAction(ctx, InstanceAction(*li.action)); err != nil {
			return done, err
		}
		li.e.metrics.actions.WithLabelValues(actionLabel(*li.action)).Inc()
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

// claimForAction runs, in one round trip, the savepoint, the claim insert and the lookup of the row
// that stands for the message (docs/design.md#claim-transaction-t1, after the claim insert). found
// is false when the message has no row any more.
func (li *lockedInstance) claimForAction(ctx context.Context, a pendingMessageAction) (storedMessage, bool, error) {
	b := &pgx.Batch{}
	b.Queue(savepointSQL)
	b.Queue(claimForActionSQL, a.id)
	b.Queue(lookupMessageSQL, a.qualifiedType, a.idempotenceID)
	br := li.conn.SendBatch(ctx, b)
	var stored storedMessage
	found, err := func() (bool, error) {
		if _, err := br.Exec(); err != nil {
			return false, fmt.Errorf("savepoint: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return false, fmt.Errorf("claim: %w", err)
		}
		err := br.QueryRow().Scan(&stored.id, &stored.state)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("look up stored message: %w", err)
		}
		return true, nil
	}()
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	li.lease.answered()
	return stored, found, err
}

// runMessageAction executes one message action through the claim path of a delivery
// (docs/design.md#operator-actions): it takes the message's claim, then
//   - EXPIRE marks a WAITING or FAILED message PROCESSED without delivery (a PROCESSED one stays);
//   - CONSUME delivers the message's stored raw record, whatever its state: PROCESSED after a
//     success (a PROCESSED message is delivered again on request), FAILED with no claim after a
//     failure, as a failed delivery leaves it — except that PROCESSED is final and stays.
//
// Every state write expects the state the lookup found and clears the action in the same
// transaction, which commits before the claim does.
func (li *lockedInstance) runMessageAction(ctx context.Context, a pendingMessageAction) error {
	stored, found, err := li.claimForAction(ctx, a)
	if err != nil {
		return err
	}
	var (
		w   stateWrite
		out actionOutcome
	)
	switch {
	case !found:
		out = failed("the message no longer exists")
	case a.action == ActionExpire && stored.state != stateProcessed:
		w = stateWrite{id: stored.id, from: stored.state, to: stateProcessed}
		out = executed("marked PROCESSED without delivery (it was %s); its dependents are releasable", stored.state)
	case a.action == ActionExpire:
		out = executed("the message was PROCESSED already; nothing to do")
	case a.action == ActionConsume:
		return li.consume(ctx, a, stored)
	default:
		out = failed("unknown message action %q", a.action)
	}
	li.e.log.Info("message action executed", "action", actionLabel(string(a.action)), "messageId", a.id, "sequence", li.name,
		"context", li.contextID, "outcome", out.outcome, "detail", out.detail)
	if err := li.finishMessageAction(ctx, w, a, out); err != nil {
		return err
	}
	return li.endSavepoint(ctx, releaseSavepointSQL)
}

// consume is CONSUME on the message's stored row, under the claim taken by claimForAction.
func (li *lockedInstance) consume(ctx context.Context, a pendingMessageAction, stored storedMessage) error {
	d, err := li.deliverRecord(ctx, stored.id)
	if err != nil {
		return err
	}
	switch {
	case d.listenerErr == nil:
		out := executed("delivered; the message is PROCESSED (it was %s)", stored.state)
		if err := li.finishMessageAction(ctx, stateWrite{id: stored.id, from: stored.state, to: stateProcessed}, a, out); err != nil {
			return err
		}
		return li.endSavepoint(ctx, releaseSavepointSQL)
	case stored.state == stateProcessed:
		out := failed("delivery failed: %v; the message stays PROCESSED", d.listenerErr)
		if errors.Is(d.listenerErr, errNoStoredRecord) {
			out = failed("the message was delivered and its record was not kept, so it cannot be delivered again; "+
				"set spec.sequences[].keepDeliveredRecords on sequence %q to keep the records of messages delivered from then on", li.name)
		}
		li.e.log.Info("CONSUME of a PROCESSED message failed; it stays PROCESSED", "messageId", stored.id,
			"sequence", li.name, "context", li.contextID, "detail", out.detail)
		if err := li.finishMessageAction(ctx, stateWrite{}, a, out); err != nil {
			return err
		}
		return li.endSavepoint(ctx, releaseSavepointSQL)
	default:
		w := stateWrite{id: stored.id, from: stored.state, to: stateFailed, dropClaim: true}
		out := failed("delivery failed: %v; the message is FAILED without claim and goes to the dead-letter topic, so that a resend can retry it", d.listenerErr)
		if err := li.finishMessageAction(ctx, w, a, out); err != nil {
			return err
		}
		li.failures = append(li.failures, Failure{Message: d.stored.msg, Origin: d.stored.msg.Record.Origin, Err: d.listenerErr})
		if err := li.endSavepoint(ctx, rollbackToSavepoint); err != nil {
			return err
		}
		return li.endSavepoint(ctx, releaseSavepointSQL)
	}
}

// endSavepoint rolls back to or releases the savepoint of a message action.
func (li *lockedInstance) endSavepoint(ctx context.Context, sql string) error {
	if _, err := li.conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	li.lease.answered()
	return nil
}

// stateWrite is the state change of a message action: row id from one state to another, and
// whether the claim goes. A zero stateWrite writes no state.
type stateWrite struct {
	id        int64
	from, to  string
	dropClaim bool
}

// finishMessageAction writes the action's state change and clears the action, in one
// transaction on the state connection, which commits before the action transaction (and its
// claim). A row no longer in the expected state fails the whole action run: nothing is written,
// the action stays pending, and the next run sees the new state.
func (li *lockedInstance) finishMessageAction(ctx context.Context, w stateWrite, a pendingMessageAction, out actionOutcome) error {
	return li.stateConn.inTx(ctx, func(tx execer) error {
		if w.id != 0 {
			tag, err := tx.Exec(ctx, expectStateSQL, w.id, w.from, w.to, li.e.keepsRecord(li.name, w.to))
			if err != nil {
				return fmt.Errorf("write %s: %w", w.to, err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("write %s over %s: %w", w.to, w.from, errStateChanged)
			}
			if w.dropClaim {
				if _, err := tx.Exec(ctx, dropClaimSQL, w.id); err != nil {
					return fmt.Errorf("drop claim: %w", err)
				}
			}
		}
		if _, err := tx.Exec(ctx, clearMessageActionSQL, a.id, string(a.action), a.requestID); err != nil {
			return fmt.Errorf("clear action: %w", err)
		}
		if _, err := tx.Exec(ctx, reportActionSQL, a.requestID, out.outcome, out.detail); err != nil {
			return fmt.Errorf("report action: %w", err)
		}
		return nil
	})
}

func (li *lockedInstance) runInstanceAction(ctx context.Context, a InstanceAction) error {
	if err := li.readState(ctx); err != nil {
		return err
	}
	st := li.state
	var out actionOutcome
	switch a {
	case ActionConsumeAll:
		failuresBefore := len(li.failures)
		for _, w := range st.waiting {
			if err := li.deliverStored(ctx, w.id); err != nil {
				return err
			}
		}
		out = executed("%d buffered message(s) delivered, %d failed (dead-lettered, retryable by a resend)",
			len(st.waiting)-(len(li.failures)-failuresBefore), len(li.failures)-failuresBefore)
	case ActionClose:
		n := 0
		for _, w := range st.waiting {
			s, err := li.load(ctx, w.id)
			if err != nil {
				return err
			}
			var failed int
			if err := li.stateConn.queryRow(ctx, []any{&failed}, markReleaseFailedSQL, w.id, stateWaiting); err != nil {
				return fmt.Errorf("fail message %d: %w", w.id, err)
			}
			if failed == 1 {
				n++
				li.failures = append(li.failures, Failure{Message: s.msg, Origin: s.msg.Record.Origin,
					Err: errors.New("sequence closed without delivery")})
			}
		}
		li.close()
		out = executed("instance closed; %d buffered message(s) FAILED and dead-lettered without delivery", n)
	default:
		out = failed("unknown instance action %q", a)
	}
	li.e.log.Info("instance action executed", "action", actionLabel(string(a)), "sequence", li.name, "context", li.contextID,
		"outcome", out.outcome, "detail", out.detail)
	b := &pgx.Batch{}
	b.Queue(clearInstanceActionSQL, li.id, li.actionID)
	b.Queue(reportActionSQL, li.actionID, out.outcome, out.detail)
	if err := li.conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("clear instance action: %w", err)
	}
	li.lease.answered()
	return nil
}
