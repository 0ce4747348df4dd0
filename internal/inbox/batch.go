package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// A batch is several sequenced records processed as Process would process them one after the
// other, under one claim transaction T1: one claim statement for all of them as T1's first
// statement, the listener called for each in order while T1 holds the claims (each call after
// the first proves T1 alive, lease.go), the states of the batch in one transaction committed
// before T1, one T1 commit. Two commits, one of them flushed,
// serve the whole batch instead of two per record (see docs/performance.md).

// claimBatchSQL is a batch's T1 first statement (docs/design.md#batches): one claim per record,
// inserted in the order of the arrays, which the engine sorts by (message type, idempotence ID).
// Every batch takes its claims in that one order, so two batches never wait for each other in a
// cycle. Against an in-flight claim it waits inside PostgreSQL like a single claim; RETURNING names
// the claims won and sets T1's lease, as long as a single record's: it restarts before every call.
const claimBatchSQL = `INSERT INTO sequential_inbox_idempotence (message_type, idempotence_id, sequence_instance_id, created_at)
SELECT c.message_type, c.idempotence_id, c.sequence_instance_id, now()
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS c(message_type, idempotence_id, sequence_instance_id)
ON CONFLICT (message_type, idempotence_id) DO NOTHING
RETURNING message_type, idempotence_id, set_config('idle_in_transaction_session_timeout', $4, true)`

// lookupMessagesSQL is lookupMessageSQL for the claims of a batch: one row per stored logical
// message, picked by the same rule. A statement of its own after the claim insert, for the same
// reason. Each key is looked up on its own (a lateral subquery with LIMIT), so that the plan
// probes the index for every key whatever the table's statistics say; a join would be planned as
// a hash join over the whole table when the statistics are missing or stale.
const lookupMessagesSQL = `SELECT k.message_type, k.idempotence_id, m.id, m.state
FROM unnest($1::text[], $2::text[]) AS k(message_type, idempotence_id)
CROSS JOIN LATERAL (SELECT id, state FROM sequenced_message
  WHERE idempotence_id = k.idempotence_id AND message_type = k.message_type
  ` + standingRowFirst + `) m`

// insertStatesSQL is insertStateSQL for the messages of a batch that had no row, in one statement;
// a message's raw record is written when its keep_record is set (keepsRecord). Its transaction
// commits without waiting for its WAL flush, as a single message's does: the batch's T1 commits
// after it in every case (a failed message's claim is deleted inside T1, not rolled back), and T1's
// flush covers the states. A message stored meanwhile by someone else is left out (and reported by
// the row count); that check probes the index per message, as lookupMessagesSQL does.
const insertStatesSQL = `WITH s AS (
  SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[], $7::int8[], $8::text[],
                       $9::text[], $10::bytea[], $11::bytea[], $12::text[], $13::bool[])
    AS s(instance_id, message_type, idempotence_id, message_id, topic, partition, "offset", state, trace_context, key, value, headers, keep_record)
), m AS (
  INSERT INTO sequenced_message
    (sequence_instance_id, message_type, idempotence_id, message_id, topic, partition, "offset", state, trace_context)
  SELECT s.instance_id, s.message_type, s.idempotence_id, s.message_id, s.topic, s.partition, s."offset", s.state, s.trace_context
  FROM s LEFT JOIN LATERAL (SELECT 1 AS stored FROM sequenced_message d
    WHERE d.idempotence_id = s.idempotence_id AND d.message_type = s.message_type LIMIT 1) d ON true
  WHERE d.stored IS NULL
  RETURNING id, sequence_instance_id, message_type, idempotence_id
), r AS (
  INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value, headers)
  SELECT m.sequence_instance_id, m.id, s.key, s.value, s.headers::jsonb
  FROM m JOIN s ON s.message_type = m.message_type AND s.idempotence_id = m.idempotence_id
  WHERE s.keep_record
)
SELECT ` + skipOwnFlushSQL + ` FROM m`

// unclaimSQL deletes, inside T1, the claims of the batch's messages whose listener failed and of
// those the batch did not get to: they commit with T1 as if they had been rolled back, so that a
// waiting duplicate or a resend takes over once T1 ends.
const unclaimSQL = `DELETE FROM sequential_inbox_idempotence
WHERE (message_type, idempotence_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`

// deadlockDetected is SQLSTATE 40P01.
const deadlockDetected = "40P01"

// maxBatchAttempts bounds the retries of a batch's claim after a deadlock or after housekeeping
// deleted one of its instances.
const maxBatchAttempts = 5

// errNotBatchable reports a record that ProcessBatch cannot take; Batchable says which can.
var errNotBatchable = errors.New("record is not sequenced; process it on its own")

// Batchable reports whether ProcessBatch takes the record: a sequenced record of a declared type
// with context and idempotence ID. Everything else goes through Process.
func (e *Engine) Batchable(rec Record) bool {
	_, ok := e.set.Lookup(sequence.Qualify(rec.Type, rec.Subtype))
	return ok && rec.Sequenced && rec.ContextID != "" && rec.IdempotenceID != ""
}

// ProcessBatch processes batchable records (see Batchable) as Process would process them one
// after the other, in one claim transaction. Messages of one instance see each other's outcomes:
// a successor released by an earlier record of the batch is delivered, not buffered.
//
// On success the results cover a prefix of recs, at least one record: the batch ends before a
// record whose claim key repeats an earlier one (so that a copy behaves as it would after its
// original), and before a listener call that would not start within one ListenerDeadline of the
// claims or not end before the caller's deadline. The caller passes the rest again. After an
// error no record of the batch may have its offset committed, and the caller processes them
// again, on their own: a batch that lost T1 (errLeaseLost) stores what its listener calls did and
// stops. The results then still carry the buffered messages whose release failed, which are
// FAILED already.
func (e *Engine) ProcessBatch(ctx context.Context, recs []Record) ([]Result, error) {
	return e.processBatchUnderProtocol(ctx, recs)
}

// processBatchInOneClaimTx is ProcessBatch under this build's claim protocol.
func (e *Engine) processBatchInOneClaimTx(ctx context.Context, recs []Record) ([]Result, error) {
	checked, err := e.batchItems(recs)
	if err != nil {
		return nil, err
	}
	conn, stateConn, err := e.acquirePair(ctx, e.pool)
	if err != nil {
		return nil, fmt.Errorf("claim batch: %w", err)
	}
	defer conn.Release()
	defer stateConn.release()
	for attempt := 1; ; attempt++ {
		// Each attempt starts from a clean slate: what a rolled-back attempt learnt and decided
		// does not hold any more.
		items := freshItems(checked)
		if err := e.getOrCreateInstances(ctx, conn, items); err != nil {
			return nil, err
		}
		b := &batchRun{e: e, conn: conn, stateConn: stateConn, items: items, recording: e.recording()}
		err = b.claimAndProcess(ctx)
		var pgErr *pgconn.PgError
		retry := errors.Is(err, errInstanceGone) || (errors.As(err, &pgErr) && pgErr.Code == deadlockDetected)
		if retry && attempt < maxBatchAttempts {
			if errors.Is(err, errInstanceGone) {
				for _, it := range items {
					e.instances.evict(instanceKey{it.mt.Sequence.Name, it.msg.ContextID})
				}
			}
			e.log.V(1).Info("batch claim retried", "attempt", attempt, "error", err.Error())
			continue
		}
		if err != nil {
			return nil, err
		}
		return b.results, b.releaseAfterCommit(ctx)
	}
}

// batchItem is a record of a batch and what T1 learnt and decided about it.
type batchItem struct {
	msg        Message
	mt         *sequence.MessageType
	instanceID int64
	won        bool
	existing   storedMessage
	// write is the state to store for a message the listener was called for ("" for none).
	write string
}

// freshItems copies the records of checked items, without what an attempt learnt about them.
func freshItems(checked []*batchItem) []*batchItem {
	items := make([]*batchItem, len(checked))
	for i, it := range checked {
		items[i] = &batchItem{msg: it.msg, mt: it.mt}
	}
	return items
}

// batchItems checks the records and cuts the batch before the first repeated claim key.
func (e *Engine) batchItems(recs []Record) ([]*batchItem, error) {
	if len(recs) == 0 {
		return nil, errors.New("process batch: no records")
	}
	seen := make(map[[2]string]bool, len(recs))
	items := make([]*batchItem, 0, len(recs))
	for i, rec := range recs {
		qualified := sequence.Qualify(rec.Type, rec.Subtype)
		if !e.Batchable(rec) {
			return nil, fmt.Errorf("process batch: record %d (%s/%s): %w", i, qualified, rec.IdempotenceID, errNotBatchable)
		}
		key := [2]string{qualified, rec.IdempotenceID}
		if seen[key] {
			break
		}
		seen[key] = true
		mt, _ := e.set.Lookup(qualified)
		items = append(items, &batchItem{mt: mt, msg: Message{Sequence: mt.Sequence.Name, ContextID: rec.ContextID, QualifiedType: qualified, Record: rec}})
	}
	return items, nil
}

// batchRun is one attempt at a batch's T1 on conn.
type batchRun struct {
	e     *Engine
	conn  *pgxpool.Conn
	items []*batchItem
	// done is how many items the batch got to; the others are passed again by the caller.
	done int
	// states are the instance states read in T1's first round trip, updated in memory by the
	// batch's own deliveries; after are the ones read after T1's commit.
	states, after map[int64]instanceState
	// lease is T1 from the claim statement's answer on; claimedAt is when that came.
	lease     *lease
	claimedAt time.Time
	// stateConn serves the state transaction and, after T1, T2's state writes.
	stateConn *stateConn
	results   []Result
	// recording is the engine's recording mode when the batch began
	// (docs/design.md#recording-mode).
	recording bool
}

// claimAndProcess is the batch's T1: claim all, deliver or buffer in order, store the states,
// commit. It ends T1 on every path.
func (b *batchRun) claimAndProcess(ctx context.Context) error {
	if err := b.claim(ctx); err != nil {
		endQuietly(b.conn, rollbackSQL)
		return err
	}
	abandoned := b.deliverInOrder(ctx)
	if err := b.storeStates(ctx); err != nil {
		endQuietly(b.conn, rollbackSQL)
		return errors.Join(abandoned, err)
	}
	if errors.Is(abandoned, errLeaseLost) {
		// T1 and its claims are gone; what the listener calls did is stored. The records are
		// processed again on their own, which finds the delivered ones processed.
		endQuietly(b.conn, rollbackSQL)
		return abandoned
	}
	if err := b.buffer(ctx); err != nil {
		endQuietly(b.conn, rollbackSQL)
		return err
	}
	b.lease.answered()
	if err := b.commit(ctx); err != nil {
		return err
	}
	if abandoned != nil {
		return abandoned
	}
	for _, it := range b.items[:b.done] {
		if it.won {
			b.e.metrics.claims.WithLabelValues(claimWon).Inc()
		} else {
			b.e.metrics.claims.WithLabelValues(claimLost).Inc()
		}
	}
	return nil
}

// claim begins T1 and runs, in one round trip, the claim insert of every record (first
// statement), the lookup of their stored states and the read of their instances.
func (b *batchRun) claim(ctx context.Context) error {
	sorted := slices.Clone(b.items)
	slices.SortFunc(sorted, func(x, y *batchItem) int {
		return cmp.Or(cmp.Compare(x.msg.QualifiedType, y.msg.QualifiedType), cmp.Compare(x.msg.Record.IdempotenceID, y.msg.Record.IdempotenceID))
	})
	types, ids, instances := make([]string, len(sorted)), make([]string, len(sorted)), make([]int64, len(sorted))
	for i, it := range sorted {
		types[i], ids[i], instances[i] = it.msg.QualifiedType, it.msg.Record.IdempotenceID, it.instanceID
	}
	q := &pgx.Batch{}
	q.Queue(beginReadCommittedSQL)
	q.Queue(claimBatchSQL, types, ids, instances, millis(b.e.claimLease))
	q.Queue(lookupMessagesSQL, types, ids)
	evaluated := b.instancesToEvaluate()
	queueInstanceStates(q, evaluated)
	br := b.conn.SendBatch(ctx, q)
	err := b.readClaim(br, evaluated)
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == foreignKeyViolation {
			return fmt.Errorf("claim batch of %d: %w", len(b.items), errInstanceGone)
		}
		return fmt.Errorf("claim batch of %d: %w", len(b.items), err)
	}
	b.lease = &lease{conn: b.conn, length: b.e.claimLease}
	b.lease.answered()
	b.claimedAt = b.lease.answeredAt
	return nil
}

func (b *batchRun) readClaim(br pgx.BatchResults, evaluated []int64) error {
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	byKey := make(map[[2]string]*batchItem, len(b.items))
	for _, it := range b.items {
		byKey[[2]string{it.msg.QualifiedType, it.msg.Record.IdempotenceID}] = it
	}
	var typ, id, lease string
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("insert claims: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&typ, &id, &lease}, func() error {
		byKey[[2]string{typ, id}].won = true
		return nil
	}); err != nil {
		return fmt.Errorf("insert claims: %w", err)
	}
	var stored storedMessage
	if rows, err = br.Query(); err != nil {
		return fmt.Errorf("look up stored messages: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&typ, &id, &stored.id, &stored.state}, func() error {
		byKey[[2]string{typ, id}].existing = stored
		return nil
	}); err != nil {
		return fmt.Errorf("look up stored messages: %w", err)
	}
	b.states, err = readInstanceStates(br, evaluated)
	return err
}

// queueInstanceStates reads the state of each instance with instanceStateSQL, one statement each
// in the same round trip: a statement over an array of instances would be planned anew for every
// call (its plan for the actual number of instances always looks cheaper than the one prepared
// for any number), and planning costs more than the reads.
func queueInstanceStates(q *pgx.Batch, instanceIDs []int64) {
	for _, id := range instanceIDs {
		q.Queue(instanceStateSQL, id)
	}
}

// readInstanceStates reads the results of queueInstanceStates; a missing instance reads as closed
// and empty (scanInstanceState).
func readInstanceStates(br pgx.BatchResults, instanceIDs []int64) (map[int64]instanceState, error) {
	states := make(map[int64]instanceState, len(instanceIDs))
	for _, id := range instanceIDs {
		st, err := scanInstanceState(br.QueryRow())
		if err != nil {
			return nil, fmt.Errorf("read instance %d: %w", id, err)
		}
		states[id] = st
	}
	return states, nil
}

// stateOf returns the state of an instance as the batch knows it.
func (b *batchRun) stateOf(states map[int64]instanceState, instanceID int64) instanceState {
	if st, ok := states[instanceID]; ok {
		return st
	}
	return instanceState{processed: map[string]bool{}}
}

// instancesToEvaluate lists the instances whose processed types decide about a record of the
// batch: those of records with a release condition, outside recording mode.
func (b *batchRun) instancesToEvaluate() []int64 {
	if b.recording {
		return []int64{}
	}
	return distinctInstances(slices.DeleteFunc(slices.Clone(b.items), func(it *batchItem) bool { return it.mt.Condition == nil }))
}

// distinctInstances lists the instances of items once each.
func distinctInstances(items []*batchItem) []int64 {
	ids := make([]int64, 0, len(items))
	for _, it := range items {
		if !slices.Contains(ids, it.instanceID) {
			ids = append(ids, it.instanceID)
		}
	}
	return ids
}

// deliverInOrder decides about each record in order, as claimAndProcess does for one, and calls
// the listener for those to deliver (callUnderLease). A delivered message counts as PROCESSED for
// the records after it. It stops before a listener call that would not fit (fits), before one
// for which T1 did not prove alive (errLeaseLost, returned), and when ctx ends during a listener
// call (returned); the batch ends before that record.
func (b *batchRun) deliverInOrder(ctx context.Context) error {
	for i, it := range b.items {
		b.done = i
		res := Result{Outcome: Duplicate}
		st := b.stateOf(b.states, it.instanceID)
		switch {
		case !it.won, it.existing.settled():
		case it.mt.Condition != nil && !b.recording && !it.mt.Condition.Holds(st.processed):
			res.Outcome = Buffered
		default:
			if i > 0 && !b.fits(ctx) {
				return nil
			}
			listenerErr, err := b.e.callUnderLease(ctx, b.lease, b.stateConn, it.msg)
			if err != nil {
				return fmt.Errorf("claim batch: %w", err)
			}
			if listenerErr != nil && ctx.Err() != nil {
				// The caller abandoned the batch: not the listener's failure.
				return fmt.Errorf("claim batch: %s/%s: %w", it.msg.QualifiedType, it.msg.Record.IdempotenceID, ctx.Err())
			}
			if listenerErr != nil {
				res, it.write = Result{Outcome: Failed, ListenerErr: listenerErr}, stateFailed
				break
			}
			res.Outcome, it.write = Delivered, stateProcessed
			st.processed[it.msg.QualifiedType] = true
			b.states[it.instanceID] = st
		}
		b.results = append(b.results, res)
	}
	b.done = len(b.items)
	return nil
}

// fits reports whether one more listener call starts within one ListenerDeadline of the claims
// and, with its whole deadline, ends before ctx's deadline. The first bound keeps the claims of
// the batch's later records, and the duplicates waiting for them, held for at most about two
// deadlines; the lease restarts before every call (callUnderLease) and needs no bound here. The
// state write and the commit after the calls ignore ctx's end (the outcomes are known), as a
// single record's do.
func (b *batchRun) fits(ctx context.Context) bool {
	now := time.Now()
	if now.After(b.claimedAt.Add(b.e.cfg.ListenerDeadline)) {
		return false
	}
	deadline, ok := ctx.Deadline()
	return !ok || !now.Add(b.e.cfg.ListenerDeadline).After(deadline)
}

// storeStates writes the states of the messages the listener was called for in one transaction
// that commits before T1 (storeBatchStatesInNewTx). Like a single message's state it ignores the
// caller's cancellation (the outcomes are known) and is tried again on a new connection while the
// lease holds the claims.
func (b *batchRun) storeStates(ctx context.Context) error {
	var writes []*batchItem
	for _, it := range b.items[:b.done] {
		if it.write != "" {
			writes = append(writes, it)
		}
	}
	if len(writes) == 0 {
		return nil
	}
	wctx, cancel := b.lease.writeContext(ctx)
	defer cancel()
	complete, err := b.e.storeBatchStatesInNewTx(wctx, b.stateConn, writes)
	for backoff := stateWriteBackoff; err != nil && retryableStateWrite(err); backoff *= 2 {
		b.e.log.Info("batch state write failed; retrying on a new connection within the claims' lease",
			"messages", len(writes), "error", err.Error())
		select {
		case <-wctx.Done():
			return fmt.Errorf("claim batch: store states: %w (lease ended: %w)", err, wctx.Err())
		case <-time.After(backoff):
		}
		complete, err = b.e.storeBatchStatesOnNewConn(wctx, writes)
	}
	if err != nil {
		return fmt.Errorf("claim batch: store states: %w", err)
	}
	if !complete {
		return fmt.Errorf("claim batch: store states: %w", errStateChanged)
	}
	return nil
}

// storeBatchStatesInNewTx writes the states of a batch in one transaction, in one round trip:
// new rows in one statement, redelivered FAILED rows each on their own. It reports false when a
// message was recorded by someone else meanwhile.
func (e *Engine) storeBatchStatesInNewTx(ctx context.Context, conn *stateConn, writes []*batchItem) (bool, error) {
	var (
		cols    insertStatesColumns
		updates []*batchItem
		q       = &pgx.Batch{}
	)
	for _, it := range writes {
		if it.existing.state == stateFailed {
			updates = append(updates, it)
			continue
		}
		if err := cols.add(it, e.keepsRecord(it.msg.Sequence, it.write)); err != nil {
			return false, err
		}
	}
	// The held transaction (stateConn.hold) is open already; this write commits it.
	begun := conn.open
	conn.open = false
	if !begun {
		q.Queue(beginReadCommittedSQL)
	}
	if len(cols.instanceIDs) > 0 {
		q.Queue(insertStatesSQL, cols.args()...)
	}
	for _, it := range updates {
		r, o := it.msg.Record, it.msg.Record.Origin
		headers, err := encodeHeaders(r.Headers)
		if err != nil {
			return false, err
		}
		q.Queue(updateFailedStateSQL, it.existing.id, it.write, it.instanceID,
			o.MessageID, o.Topic, o.Partition, o.Offset, traceContext(r.Headers), r.Key, r.Value, headers,
			e.keepsRecord(it.msg.Sequence, it.write))
	}
	q.Queue(commitSQL)
	br := conn.conn.SendBatch(ctx, q)
	first := 1
	if begun {
		first = 0
	}
	stored, err := func() (int64, error) {
		var n int64
		for i := range q.Len() {
			tag, err := br.Exec()
			if err != nil {
				return n, err
			}
			if tag.String() == "ROLLBACK" {
				return n, errors.New("commit: transaction was rolled back")
			}
			// Between BEGIN and COMMIT, each statement's rows are messages stored.
			if i >= first && i < q.Len()-1 {
				n += tag.RowsAffected()
			}
		}
		return n, nil
	}()
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return false, err
	}
	return stored == int64(len(writes)), nil
}

// storeBatchStatesOnNewConn is one retry of storeStates. Rows an earlier attempt wrote before its
// answer was lost are not written again; the batch is stored when every message is found in the
// state it was to get.
func (e *Engine) storeBatchStatesOnNewConn(ctx context.Context, writes []*batchItem) (bool, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire state connection: %w", err)
	}
	defer conn.Release()
	stored, err := e.storeBatchStatesInNewTx(ctx, &stateConn{conn: conn}, writes)
	if err != nil || stored {
		return stored, err
	}
	types, ids := make([]string, len(writes)), make([]string, len(writes))
	for i, it := range writes {
		types[i], ids[i] = it.msg.QualifiedType, it.msg.Record.IdempotenceID
	}
	rows, err := conn.Query(ctx, lookupMessagesSQL, types, ids)
	if err != nil {
		return false, fmt.Errorf("look up states after a retried write: %w", err)
	}
	now := map[[2]string]string{}
	var typ, id, state string
	var rowID int64
	if _, err := pgx.ForEachRow(rows, []any{&typ, &id, &rowID, &state}, func() error {
		now[[2]string{typ, id}] = state
		return nil
	}); err != nil {
		return false, fmt.Errorf("look up states after a retried write: %w", err)
	}
	for _, it := range writes {
		if now[[2]string{it.msg.QualifiedType, it.msg.Record.IdempotenceID}] != it.write {
			return false, nil
		}
	}
	return true, nil
}

// insertStatesColumns are the arrays of insertStatesSQL.
type insertStatesColumns struct {
	instanceIDs                                 []int64
	types, ids, messageIDs, topics, states, hdr []string
	partitions                                  []int32
	offsets                                     []int64
	traces                                      []*string
	keys, values                                [][]byte
	keepRecords                                 []bool
}

// add appends a message; its key and value go to the server only when its record is kept.
func (c *insertStatesColumns) add(it *batchItem, keepRecord bool) error {
	r, o := it.msg.Record, it.msg.Record.Origin
	headers, err := encodeHeaders(r.Headers)
	if err != nil {
		return fmt.Errorf("%s/%s: %w", it.msg.QualifiedType, r.IdempotenceID, err)
	}
	c.instanceIDs = append(c.instanceIDs, it.instanceID)
	c.types = append(c.types, it.msg.QualifiedType)
	c.ids = append(c.ids, r.IdempotenceID)
	c.messageIDs = append(c.messageIDs, o.MessageID)
	c.topics = append(c.topics, o.Topic)
	c.partitions = append(c.partitions, o.Partition)
	c.offsets = append(c.offsets, o.Offset)
	c.states = append(c.states, it.write)
	c.traces = append(c.traces, traceContext(r.Headers))
	if keepRecord {
		c.keys, c.values = append(c.keys, r.Key), append(c.values, r.Value)
	} else {
		c.keys, c.values = append(c.keys, nil), append(c.values, nil)
	}
	c.hdr = append(c.hdr, string(headers))
	c.keepRecords = append(c.keepRecords, keepRecord)
	return nil
}

func (c *insertStatesColumns) args() []any {
	return []any{c.instanceIDs, c.types, c.ids, c.messageIDs, c.topics, c.partitions, c.offsets, c.states,
		c.traces, c.keys, c.values, c.hdr, c.keepRecords}
}

// buffer writes, inside T1, the WAITING rows of the batch's messages whose condition did not
// hold, in one round trip, each with bufferUnderClaim's statement.
func (b *batchRun) buffer(ctx context.Context) error {
	q := &pgx.Batch{}
	var buffered []*batchItem
	for i, it := range b.items[:b.done] {
		if b.results[i].Outcome != Buffered {
			continue
		}
		args, sql, err := bufferArgs(it.instanceID, it.existing, it.msg)
		if err != nil {
			return err
		}
		q.Queue(sql, args...)
		buffered = append(buffered, it)
	}
	if len(buffered) == 0 {
		return nil
	}
	br := b.conn.SendBatch(ctx, q)
	err := func() error {
		for _, it := range buffered {
			tag, err := br.Exec()
			if err != nil {
				return fmt.Errorf("buffer %s/%s: %w", it.msg.QualifiedType, it.msg.Record.IdempotenceID, err)
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("buffer %s/%s: %w", it.msg.QualifiedType, it.msg.Record.IdempotenceID, errStateChanged)
			}
		}
		return nil
	}()
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return err
	}
	for _, it := range buffered {
		b.e.metrics.buffered.WithLabelValues(it.msg.Sequence, it.msg.QualifiedType).Inc()
	}
	return nil
}

// commit deletes the claims of failed messages and of the records the batch did not get to,
// commits T1 and reads the instances of the batch after the commit, in one round trip. Like the
// state write it ignores the caller's cancellation while the lease holds.
func (b *batchRun) commit(ctx context.Context) error {
	cctx, cancel := b.lease.writeContext(ctx)
	defer cancel()
	var types, ids []string
	for i, it := range b.items {
		if it.won && (i >= b.done || it.write == stateFailed) {
			types, ids = append(types, it.msg.QualifiedType), append(ids, it.msg.Record.IdempotenceID)
		}
	}
	q := &pgx.Batch{}
	if len(types) > 0 {
		q.Queue(unclaimSQL, types, ids)
	}
	q.Queue(commitSQL)
	instances := distinctInstances(b.items[:b.done])
	queueInstanceStates(q, instances)
	br := b.conn.SendBatch(cctx, q)
	err := func() error {
		if len(types) > 0 {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("delete claims: %w", err)
			}
		}
		tag, err := br.Exec()
		if err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		if tag.String() != commitSQL {
			return fmt.Errorf("commit: transaction was rolled back (%s)", tag)
		}
		b.after, err = readInstanceStates(br, instances)
		return err
	}()
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		endQuietly(b.conn, rollbackSQL)
		return fmt.Errorf("claim batch: %w", err)
	}
	return nil
}

// releaseAfterCommit runs T2 for every instance of the batch that needs it after T1's commit
// (Engine.Process does the same for one record); the releases go to the result of the
// instance's last record in the batch.
func (b *batchRun) releaseAfterCommit(ctx context.Context) error {
	last := map[int64]int{}
	for i, it := range b.items[:b.done] {
		last[it.instanceID] = i
	}
	for i, it := range b.items[:b.done] {
		if last[it.instanceID] != i {
			continue
		}
		if !b.stateOf(b.after, it.instanceID).needsRelease(it.mt.Sequence) {
			b.e.metrics.releases.WithLabelValues(releaseSkipped).Inc()
			continue
		}
		b.e.metrics.releases.WithLabelValues(releaseRun).Inc()
		released, failures, err := b.e.releaseUnderInstanceLock(ctx, b.conn, b.stateConn, it.instanceID, it.mt.Sequence)
		b.results[i].Released, b.results[i].ReleaseFailures = released, failures
		if err != nil {
			return err
		}
	}
	return nil
}
