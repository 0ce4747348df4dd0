package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HousekeepingConfig bounds one housekeeping run (docs/design.md#housekeeping).
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

// housekeepingLockKey is the PostgreSQL advisory lock (pg_try_advisory_lock(bigint)) by which
// consumers of earlier versions lead housekeeping, holding it on a session of their own: the
// ASCII bytes of "seqhouse". Every housekeeping batch takes it for its transaction, so that a
// batch never runs while such a consumer leads.
const housekeepingLockKey int64 = 0x7365_7168_6f75_7365

// HousekeepingLease is how long the housekeeping lead lasts after it was last taken or renewed
// (housekeeping_lease.expires_at, on the database's clock). The leader renews it with every
// housekeeping batch and every LeadHousekeeping call, which a consumer makes every third of it;
// a leader that stops renewing (crashed, cut off) loses the lead when it runs out, and another
// consumer takes it at its next call.
const HousekeepingLease = time.Minute

const (
	// takeLeaseSQL takes the lead when nobody holds it or its lease ran out, or renews the
	// holder's own; a row comes back when $1 leads. One statement, so that two consumers taking
	// it at once end with one holder (the row's unique key decides, the loser's update finds the
	// winner's unexpired lease).
	// The NOT EXISTS reads without a lock: a consumer that does not lead never waits for the
	// leader's batch, which holds the row locked (fenceLeaseSQL).
	takeLeaseSQL = `INSERT INTO housekeeping_lease AS l (holder, expires_at)
SELECT $1, now() + make_interval(secs => $2)
WHERE NOT EXISTS (SELECT 1 FROM housekeeping_lease WHERE holder <> $1 AND expires_at > now())
ON CONFLICT (only_row) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
RETURNING true`
	// fenceLeaseSQL begins every housekeeping batch: it renews the lease of $1 if it still holds
	// it, locking the row until the batch commits, so that nobody takes the lead during a batch,
	// and takes the earlier versions' advisory lock for the transaction. No row: the lead is lost;
	// false: a consumer of an earlier version leads.
	fenceLeaseSQL = `UPDATE housekeeping_lease SET expires_at = now() + make_interval(secs => $2)
WHERE holder = $1 AND expires_at > now()
RETURNING pg_try_advisory_xact_lock($3)`
	// resignLeaseSQL gives the lead of $1 up.
	resignLeaseSQL = `DELETE FROM housekeeping_lease WHERE holder = $1`
)

// housekeepingLead is this engine's part in the housekeeping lease. The consumer holding the lease
// is the housekeeping leader: it runs housekeeping and alone serves the database-wide gauges,
// until it resigns or its lease runs out; another consumer takes the lead at its next try.
type housekeepingLead struct {
	// mu serialises runs, taking and giving up the lead.
	mu sync.Mutex
	// holder names this engine in housekeeping_lease: its host (the pod) and a random suffix.
	holder string
	// leading is set while this engine holds the lease as far as it knows; the gauges check the
	// lease row itself too.
	leading atomic.Bool
}

// errLeadLost reports a housekeeping batch that found the lease held by someone else or run out.
var errLeadLost = errors.New("the housekeeping lease was lost to another consumer")

// DeadLetterReasonSequenceDeleted is the reason given for WAITING messages of instances that
// housekeeping deletes (docs/design.md#failures-and-dead-letters).
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
	conn, err := e.acquire(ctx, e.maint)
	if err != nil {
		return rep, fmt.Errorf("housekeeping: acquire maintenance connection: %w", err)
	}
	defer conn.Release()

	started := time.Now()
	defer func() { e.metrics.hkDuration.Observe(time.Since(started).Seconds()) }()
	deadline := e.clock.Now().Add(hc.MaxDuration)
	h := housekeeper{e: e, conn: conn, cfg: hc, dl: dl}
	rep.Leader = true
	steps := []struct {
		run   batchStep
		count *int
		// committed counts what a committed batch did in the metrics.
		committed func(n int)
	}{
		{h.windowClosedBatch, &rep.WindowedClosed, func(int) {}},
		{h.deleteClosedBatch, &rep.DeletedClosed, func(n int) { h.deleted(deletedClosed, n) }},
		{h.markExpiredBatch, &rep.MarkedExpired, func(n int) { e.metrics.hkMarked.Add(float64(n)) }},
		{h.deleteExpiredBatch, &rep.DeletedExpired, func(n int) { h.deleted(deletedExpired, n) }},
	}
	for _, s := range steps {
		for {
			if !e.clock.Now().Before(deadline) {
				rep.DeadLettered = h.deadLettered
				return rep, nil
			}
			var n int
			n, err = h.fenced(ctx, s.run)
			*s.count += n
			s.committed(n)
			if errors.Is(err, errOlderLeader) {
				// Not this run's fault: it did nothing, and an earlier version's consumer leads.
				return HousekeepingReport{}, nil
			}
			if err != nil {
				if errors.Is(err, errLeadLost) {
					e.lead.leading.Store(false)
				}
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

// LeadHousekeeping takes the housekeeping lease when nobody holds it or it ran out, or renews
// this engine's own; it reports whether this engine leads. Housekeep calls it too; a consumer
// calls it at start, so that the database-wide gauges are served before the first run, and then
// every third of HousekeepingLease, so that the lead lasts between runs.
func (e *Engine) LeadHousekeeping(ctx context.Context) (bool, error) {
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	return e.leadLocked(ctx)
}

// ResignHousekeeping gives the housekeeping lease back, so that another consumer takes the lead at
// its next try. A consumer calls it when it stops.
func (e *Engine) ResignHousekeeping() {
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	if !e.lead.leading.Swap(false) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.maint.Exec(ctx, resignLeaseSQL, e.lead.holder); err != nil {
		e.log.Info("giving the housekeeping lead up failed; it passes on when its lease runs out", "error", err.Error())
		return
	}
	e.log.Info("this consumer gave the housekeeping lead up")
}

// leadLocked is LeadHousekeeping under lead.mu.
func (e *Engine) leadLocked(ctx context.Context) (bool, error) {
	actx, cancel := context.WithTimeout(ctx, e.cfg.AcquireTimeout)
	defer cancel()
	var leader bool
	err := e.maint.QueryRow(actx, takeLeaseSQL, e.lead.holder, HousekeepingLease.Seconds()).Scan(&leader)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		e.lead.leading.Store(false)
		return false, fmt.Errorf("housekeeping: take the lease: %w", err)
	}
	if was := e.lead.leading.Swap(leader); leader && !was {
		e.log.Info("this consumer leads housekeeping and serves the database-wide gauges", "holder", e.lead.holder)
	} else if was && !leader {
		e.log.Info("another consumer took the housekeeping lead over", "holder", e.lead.holder)
	}
	return leader, nil
}

// leading reports whether this engine holds the housekeeping lease as far as it knows.
func (e *Engine) leading() bool { return e.lead.leading.Load() }

// newHolder names an engine in housekeeping_lease: the host (in Kubernetes the pod) and a random
// suffix, unique for every engine.
func newHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "consumer"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}

// errOlderLeader reports a housekeeping batch that did not run because a consumer of an earlier
// version holds the advisory lock by which it leads.
var errOlderLeader = errors.New("a consumer of an earlier version leads housekeeping")

// housekeeper runs the batches of one housekeeping run, each in a transaction fenced by the lease.
type housekeeper struct {
	e    *Engine
	conn *pgxpool.Conn
	cfg  HousekeepingConfig
	dl   DeadLetterer
	// deadLettered counts the dead letters of committed batches, uncommittedDeadLetters those of
	// the batch in progress.
	deadLettered, uncommittedDeadLetters int
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

// batchStep is one batch of a housekeeping step, in the fenced transaction tx; it returns how many
// instances it handled.
type batchStep func(ctx context.Context, tx pgx.Tx) (int, error)

// fenced runs one batch in a transaction that begins by renewing and locking this engine's lease
// (fenceLeaseSQL) and commits after the batch: nobody takes the lead while a batch runs, and a
// batch never runs after the lead was lost or while a consumer of an earlier version leads.
func (h *housekeeper) fenced(ctx context.Context, run batchStep) (int, error) {
	h.uncommittedDeadLetters = 0
	tx, err := h.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var free bool
	err = tx.QueryRow(ctx, fenceLeaseSQL, h.e.lead.holder, HousekeepingLease.Seconds(), housekeepingLockKey).Scan(&free)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, errLeadLost
	case err != nil:
		return 0, fmt.Errorf("renew the lease: %w", err)
	case !free:
		return 0, errOlderLeader
	}
	n, err := run(ctx, tx)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	h.deadLettered += h.uncommittedDeadLetters
	h.e.metrics.hkDeadLettered.Add(float64(h.uncommittedDeadLetters))
	return n, nil
}

// deleted counts n instances deleted by kind.
func (h *housekeeper) deleted(kind string, n int) {
	h.e.metrics.hkDeleted.WithLabelValues(kind).Add(float64(n))
}

func (h *housekeeper) windowClosedBatch(ctx context.Context, tx pgx.Tx) (int, error) {
	seqs := h.e.set.Sequences()
	names, secs := make([]string, len(seqs)), make([]float64, len(seqs))
	for i, seq := range seqs {
		names[i], secs[i] = seq.Name, seq.DuplicateProtection.Seconds()
	}
	tag, err := tx.Exec(ctx, windowClosedSQL, h.cfg.BatchSize, h.e.clock.Now(), names, secs)
	if err != nil {
		return 0, fmt.Errorf("window closed instances: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

func (h *housekeeper) deleteClosedBatch(ctx context.Context, tx pgx.Tx) (int, error) {
	return h.deleteBatch(ctx, tx, closedBatchSQL, h.cfg.BatchSize, h.e.clock.Now())
}

func (h *housekeeper) deleteExpiredBatch(ctx context.Context, tx pgx.Tx) (int, error) {
	return h.deleteBatch(ctx, tx, removableBatchSQL, h.cfg.BatchSize, h.e.clock.Now())
}

func (h *housekeeper) markExpiredBatch(ctx context.Context, tx pgx.Tx) (int, error) {
	tag, err := tx.Exec(ctx, markExpiredSQL, h.cfg.BatchSize, h.e.clock.Now(), h.cfg.ExpiryDelay.Seconds())
	if err != nil {
		return 0, fmt.Errorf("mark expired instances: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// deleteBatch deletes one batch of instances in the batch's transaction: lock them, dead-letter
// their WAITING messages, delete them (claims, messages and buffered records cascade). A
// dead-letter failure rolls the batch back, so no WAITING message is deleted without its dead
// letter.
func (h *housekeeper) deleteBatch(ctx context.Context, tx pgx.Tx, pickSQL string, args ...any) (int, error) {
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
	h.uncommittedDeadLetters = len(waiting)
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
