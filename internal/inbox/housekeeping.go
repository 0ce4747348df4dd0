package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HousekeepingConfig bounds one housekeeping run (SPEC §6).
type HousekeepingConfig struct {
	// ExpiryDelay is how long an instance past its retain_until is kept before it is deleted.
	ExpiryDelay time.Duration
	// BatchSize is the number of instances handled per transaction.
	BatchSize int
	// MaxDuration bounds the run; it stops between batches, measured on the engine's clock.
	MaxDuration time.Duration
}

// HousekeepingReport says what one run did.
type HousekeepingReport struct {
	// Leader is false when another consumer held the housekeeping lock; nothing was done then.
	Leader bool
	// Finished is false when MaxDuration ended the run before all work was done.
	Finished bool
	// DeletedClosed counts closed instances deleted after their duplicate-protection window,
	// DeletedExpired open instances deleted past remove_after; MarkedExpired the open instances
	// found past retain_until and given a remove_after.
	DeletedClosed, MarkedExpired, DeletedExpired int
	// WindowedClosed counts closed instances found without a remove_after (closed before the
	// schema had duplicate-protection windows, or by an older consumer) and given one.
	WindowedClosed int
	// DeadLettered counts WAITING messages handed to the dead-letter callback before their
	// instance was deleted.
	DeadLettered int
}

// housekeepingLockKey is the PostgreSQL advisory lock (session level, pg_try_advisory_lock(bigint))
// that makes one consumer at a time run housekeeping: the ASCII bytes of "seqhouse".
const housekeepingLockKey int64 = 0x7365_7168_6f75_7365

const (
	tryHousekeepingLockSQL = `SELECT pg_try_advisory_lock($1)`
	housekeepingUnlockSQL  = `SELECT pg_advisory_unlock($1)`
)

// housekeepingLead is the session that holds the housekeeping lock between runs. The consumer
// holding it is the housekeeping leader: it runs housekeeping and alone serves the database-wide
// gauges, until it resigns or its session ends; another consumer takes the lead at its next try.
type housekeepingLead struct {
	// mu serialises runs, taking and giving up the lead.
	mu   sync.Mutex
	conn *pgxpool.Conn
	// pid is the backend process of conn while this engine leads, else 0; the metrics read it.
	pid atomic.Uint32
}

// DeadLetterReasonSequenceDeleted is the reason given for WAITING messages of instances that
// housekeeping deletes (SPEC §4).
const DeadLetterReasonSequenceDeleted = "sequence deleted"

// Housekeep runs housekeeping if no other consumer does: give closed instances without a
// remove_after the end of their duplicate-protection window, delete closed instances past it,
// mark open instances past retain_until with remove_after = retain_until + ExpiryDelay, delete
// open instances past remove_after. Every deleted instance's WAITING messages go to dl first;
// claims and messages go with their instance (cascade), which ends the duplicate protection of
// its messages: a closed instance is kept until closed_at + its sequence's DuplicateProtection.
func (e *Engine) Housekeep(ctx context.Context, hc HousekeepingConfig, dl DeadLetterer) (_ HousekeepingReport, err error) {
	var rep HousekeepingReport
	if hc.BatchSize <= 0 || hc.MaxDuration <= 0 || hc.ExpiryDelay < 0 {
		return rep, fmt.Errorf("housekeeping: invalid config %+v", hc)
	}
	if dl == nil {
		return rep, errors.New("housekeeping: no dead-letterer")
	}
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	leader, err := e.leadLocked(ctx)
	if err != nil || !leader {
		return rep, err
	}
	rep.Leader = true
	conn := e.lead.conn
	// A failed run gives the lead up: its session may be broken, and a session that lost its
	// lock must not go on as the leader.
	defer func() {
		if err != nil {
			e.resignLocked()
		}
	}()

	started := time.Now()
	defer func() { e.metrics.hkDuration.Observe(time.Since(started).Seconds()) }()
	deadline := e.clock.Now().Add(hc.MaxDuration)
	h := housekeeper{e: e, conn: conn, cfg: hc, dl: dl}
	steps := []struct {
		run   func(context.Context) (int, error)
		count *int
	}{
		{h.windowClosedBatch, &rep.WindowedClosed},
		{h.deleteClosedBatch, &rep.DeletedClosed},
		{h.markExpiredBatch, &rep.MarkedExpired},
		{h.deleteExpiredBatch, &rep.DeletedExpired},
	}
	for _, s := range steps {
		for {
			if !e.clock.Now().Before(deadline) {
				rep.DeadLettered = h.deadLettered
				return rep, nil
			}
			var n int
			n, err = s.run(ctx)
			*s.count += n
			if err != nil {
				rep.DeadLettered = h.deadLettered
				return rep, fmt.Errorf("housekeeping: %w", err)
			}
			if n < hc.BatchSize {
				break
			}
		}
	}
	rep.DeadLettered = h.deadLettered
	rep.Finished = true
	return rep, nil
}

// LeadHousekeeping takes the housekeeping lock when no consumer holds it and keeps it, on a
// maintenance connection of its own, until ResignHousekeeping, a failed run or the end of its
// session. It reports whether this engine leads. Housekeep calls it too; a consumer calls it at
// start, so that the database-wide gauges are served before the first run.
func (e *Engine) LeadHousekeeping(ctx context.Context) (bool, error) {
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	return e.leadLocked(ctx)
}

// ResignHousekeeping gives the housekeeping lock back, so that another consumer takes the lead at
// its next try. A consumer calls it when it stops.
func (e *Engine) ResignHousekeeping() {
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	e.resignLocked()
}

// leadLocked is LeadHousekeeping under lead.mu.
func (e *Engine) leadLocked(ctx context.Context) (bool, error) {
	if e.lead.conn != nil {
		return true, nil
	}
	conn, err := e.acquire(ctx, e.maint)
	if err != nil {
		return false, fmt.Errorf("housekeeping: acquire maintenance connection: %w", err)
	}
	var leader bool
	if err := conn.QueryRow(ctx, tryHousekeepingLockSQL, housekeepingLockKey).Scan(&leader); err != nil {
		conn.Release()
		return false, fmt.Errorf("housekeeping: lock: %w", err)
	}
	if !leader {
		conn.Release()
		return false, nil
	}
	e.lead.conn = conn
	e.lead.pid.Store(conn.Conn().PgConn().PID())
	e.log.Info("this consumer leads housekeeping and serves the database-wide gauges")
	return true, nil
}

// resignLocked is ResignHousekeeping under lead.mu.
func (e *Engine) resignLocked() {
	if e.lead.conn == nil {
		return
	}
	e.lead.pid.Store(0)
	unlockHousekeeping(e.lead.conn)
	e.lead.conn.Release()
	e.lead.conn = nil
	e.log.Info("this consumer gave the housekeeping lead up")
}

// leaderPID is the backend process holding this engine's housekeeping lock, 0 while it does not
// lead.
func (e *Engine) leaderPID() uint32 { return e.lead.pid.Load() }

// unlockHousekeeping releases the session lock; if that fails the connection is closed, which
// ends the session and its lock, instead of returning a locked session to the pool.
func unlockHousekeeping(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, housekeepingUnlockSQL, housekeepingLockKey); err != nil {
		_ = conn.Conn().Close(ctx)
	}
}

// housekeeper runs the batches of one housekeeping run on the connection holding the lock.
type housekeeper struct {
	e            *Engine
	conn         *pgxpool.Conn
	cfg          HousekeepingConfig
	dl           DeadLetterer
	deadLettered int
}

// windowClosedSQL gives closed instances without a remove_after (closed before the schema had
// duplicate-protection windows, or by an older consumer) the end of their window: closed_at plus
// the DuplicateProtection of their sequence ($3 names, $4 seconds; 0 for a sequence no longer
// declared).
const windowClosedSQL = `WITH due AS (
  SELECT id FROM sequence_instance WHERE state = 'CLOSED' AND remove_after IS NULL
  LIMIT $1 FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE sequence_instance i SET remove_after = coalesce(i.closed_at, $2) + make_interval(secs => coalesce(
  (SELECT w.secs FROM unnest($3::text[], $4::float8[]) AS w(name, secs) WHERE w.name = i.name), 0))
FROM due WHERE i.id = due.id`

// closedBatchSQL picks closed instances whose duplicate-protection window has passed. SKIP LOCKED
// leaves instances alone that a release or an in-flight claim (key-share lock of its foreign key)
// is using right now.
const closedBatchSQL = `SELECT id FROM sequence_instance WHERE state = 'CLOSED' AND remove_after <= $2
ORDER BY remove_after LIMIT $1 FOR UPDATE SKIP LOCKED`

// removableBatchSQL picks open instances past remove_after to delete.
const removableBatchSQL = `SELECT id FROM sequence_instance
WHERE state = 'OPEN' AND remove_after IS NOT NULL AND remove_after < $2
ORDER BY remove_after LIMIT $1 FOR UPDATE SKIP LOCKED`

// markExpiredSQL gives instances past retain_until their remove_after.
const markExpiredSQL = `WITH due AS (
  SELECT id FROM sequence_instance
  WHERE state = 'OPEN' AND remove_after IS NULL AND retain_until < $2
  ORDER BY retain_until LIMIT $1 FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE sequence_instance i SET remove_after = i.retain_until + make_interval(secs => $3)
FROM due WHERE i.id = due.id`

// waitingOfInstancesSQL loads the WAITING messages of instances about to be deleted, one row per
// logical message (a historical duplicate of a PROCESSED message is not dead-lettered).
const waitingOfInstancesSQL = `SELECT i.name, i.context_id, m.message_type, m.idempotence_id, coalesce(m.message_id, ''),
  coalesce(m.topic, ''), coalesce(m.partition, 0), coalesce(m."offset", 0), m.created_at,
  b.key, b.value, coalesce(b.headers, '[]')
FROM sequenced_message m
JOIN sequence_instance i ON i.id = m.sequence_instance_id
LEFT JOIN buffered_message b ON b.sequenced_message_id = m.id
WHERE m.sequence_instance_id = ANY($1) AND m.state = 'WAITING' AND ` + waitingStandsForItsMessage + `
ORDER BY m.id`

const deleteInstancesSQL = `DELETE FROM sequence_instance WHERE id = ANY($1)`

func (h *housekeeper) windowClosedBatch(ctx context.Context) (int, error) {
	seqs := h.e.set.Sequences()
	names, secs := make([]string, len(seqs)), make([]float64, len(seqs))
	for i, seq := range seqs {
		names[i], secs[i] = seq.Name, seq.DuplicateProtection.Seconds()
	}
	tag, err := h.conn.Exec(ctx, windowClosedSQL, h.cfg.BatchSize, h.e.clock.Now(), names, secs)
	if err != nil {
		return 0, fmt.Errorf("window closed instances: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

func (h *housekeeper) deleteClosedBatch(ctx context.Context) (int, error) {
	n, err := h.deleteBatchInTx(ctx, closedBatchSQL, h.cfg.BatchSize, h.e.clock.Now())
	h.e.metrics.hkDeleted.WithLabelValues(deletedClosed).Add(float64(n))
	return n, err
}

func (h *housekeeper) deleteExpiredBatch(ctx context.Context) (int, error) {
	n, err := h.deleteBatchInTx(ctx, removableBatchSQL, h.cfg.BatchSize, h.e.clock.Now())
	h.e.metrics.hkDeleted.WithLabelValues(deletedExpired).Add(float64(n))
	return n, err
}

func (h *housekeeper) markExpiredBatch(ctx context.Context) (int, error) {
	tag, err := h.conn.Exec(ctx, markExpiredSQL, h.cfg.BatchSize, h.e.clock.Now(), h.cfg.ExpiryDelay.Seconds())
	if err != nil {
		return 0, fmt.Errorf("mark expired instances: %w", err)
	}
	n := int(tag.RowsAffected())
	h.e.metrics.hkMarked.Add(float64(n))
	return n, nil
}

// deleteBatchInTx deletes one batch of instances in one transaction: lock them, dead-letter their
// WAITING messages, delete them (claims, messages and buffered records cascade). A dead-letter
// failure rolls the batch back, so no WAITING message is deleted without its dead letter.
func (h *housekeeper) deleteBatchInTx(ctx context.Context, pickSQL string, args ...any) (int, error) {
	tx, err := h.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("delete instances: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	// The dead-letter callbacks run while the batch's rows are locked; bound the idle time by the
	// run's own bound.
	if _, err := tx.Exec(ctx, setIdleTimeoutSQL, millis(max(h.cfg.MaxDuration, h.e.claimLease))); err != nil {
		return 0, fmt.Errorf("delete instances: set timeout: %w", err)
	}
	rows, err := tx.Query(ctx, pickSQL, args...)
	if err != nil {
		return 0, fmt.Errorf("delete instances: pick: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		if err != nil {
			return 0, fmt.Errorf("delete instances: pick: %w", err)
		}
		return 0, nil
	}
	waiting, err := h.loadWaiting(ctx, tx, ids)
	if err != nil {
		return 0, err
	}
	for _, m := range waiting {
		if err := h.dl.DeadLetter(ctx, m, DeadLetterReasonSequenceDeleted); err != nil {
			return 0, fmt.Errorf("delete instances: dead-letter %s/%s of %s/%s: %w",
				m.QualifiedType, m.Record.IdempotenceID, m.Sequence, m.ContextID, err)
		}
	}
	if _, err := tx.Exec(ctx, deleteInstancesSQL, ids); err != nil {
		return 0, fmt.Errorf("delete instances: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("delete instances: commit: %w", err)
	}
	h.deadLettered += len(waiting)
	h.e.metrics.hkDeadLettered.Add(float64(len(waiting)))
	return len(ids), nil
}

func (h *housekeeper) loadWaiting(ctx context.Context, tx pgx.Tx, ids []int64) ([]Message, error) {
	rows, err := tx.Query(ctx, waitingOfInstancesSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("delete instances: load waiting messages: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Message, error) {
		var (
			m       Message
			r       = &m.Record
			headers []byte
		)
		err := row.Scan(&m.Sequence, &m.ContextID, &m.QualifiedType, &r.IdempotenceID, &r.Origin.MessageID,
			&r.Origin.Topic, &r.Origin.Partition, &r.Origin.Offset, &r.ReceivedAt, &r.Key, &r.Value, &headers)
		if err != nil {
			return m, err
		}
		r.Type, r.Subtype = h.e.splitQualified(m.QualifiedType)
		r.ContextID, r.Sequenced = m.ContextID, true
		r.Headers, err = decodeHeaders(headers)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("delete instances: load waiting messages: %w", err)
	}
	return msgs, nil
}
