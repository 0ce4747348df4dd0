package inbox

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/sequence"
)

// insertInstanceSQL creates an instance. Against an existing or concurrently created row it
// returns no row; the re-read in the next statement (a new snapshot at READ COMMITTED) finds it.
//
// A new instance commits without waiting for its WAL flush (synchronous_commit off for its own
// transaction, set in the same statement; the second column is that setting). Nothing durable
// depends on the row before a claim references it, and the claim transaction that does commits
// later and waits for its own flush, which covers every earlier WAL record. A server crash that
// loses the row loses nothing that refers to it: the engine's cached id then fails the next
// claim's foreign key and the instance is created again (errInstanceGone).
const insertInstanceSQL = `INSERT INTO sequence_instance (name, context_id, retain_until)
VALUES ($1, $2, $3)
ON CONFLICT (name, context_id) DO NOTHING
RETURNING id, ` + skipOwnFlushSQL

// skipOwnFlushSQL, in a statement of a transaction, lets that transaction commit without waiting
// for its WAL flush, and only that one (is_local); it evaluates to "off".
const skipOwnFlushSQL = `set_config('synchronous_commit', 'off', true)`

// selectInstanceSQL re-reads an instance that the insert found existing.
const selectInstanceSQL = `SELECT id FROM sequence_instance WHERE name = $1 AND context_id = $2`

// getOrCreateInstance returns the id of the instance of (sequence, contextID), creating it in its
// own single-statement transaction (docs/design.md#the-sequence-instance). It runs outside T1 so
// that the new instance row is committed before any claim references it and no claim holder blocks
// other creators. Known ids come from the cache, so the insert is tried first: an instance this
// engine does not know yet is usually a new one. A cached id whose instance housekeeping deleted
// fails the claim insert's foreign key, and Process evicts it and asks again.
func (e *Engine) getOrCreateInstance(ctx context.Context, q querier, seq *sequence.Sequence, contextID string) (int64, error) {
	key := instanceKey{seq.Name, contextID}
	if id, ok := e.instances.get(key); ok {
		return id, nil
	}
	// The re-read misses only when housekeeping deleted the row between insert and re-read.
	for range maxInstanceAttempts {
		var id int64
		retainUntil := e.clock.Now().Add(seq.Retention)
		err := q.QueryRow(ctx, insertInstanceSQL, seq.Name, contextID, retainUntil).Scan(&id, nil)
		if errors.Is(err, pgx.ErrNoRows) {
			err = q.QueryRow(ctx, selectInstanceSQL, seq.Name, contextID).Scan(&id)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("instance %s/%s: %w", seq.Name, contextID, err)
		}
		e.instances.put(key, id)
		return id, nil
	}
	return 0, fmt.Errorf("instance %s/%s: created and deleted concurrently %d times", seq.Name, contextID, maxInstanceAttempts)
}

// insertInstancesSQL is insertInstanceSQL for the instances of a batch that the cache does not
// know, inserted in the order of the arrays, which are sorted by (sequence, context ID): two
// batches creating the same instances wait for each other but never in a cycle. Its transaction
// commits without waiting for its WAL flush, for the reason insertInstanceSQL gives.
const insertInstancesSQL = `WITH i AS (
  INSERT INTO sequence_instance (name, context_id, retain_until)
  SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[])
  ON CONFLICT (name, context_id) DO NOTHING
)
SELECT ` + skipOwnFlushSQL

// getOrCreateInstances sets the instance of every item of a batch, as getOrCreateInstance does
// for one record: known ids from the cache, all others created or found in one round trip, in
// one short transaction of their own that commits before any claim references them. A batch of
// new orders thus costs one instance transaction instead of one per record.
func (e *Engine) getOrCreateInstances(ctx context.Context, conn *pgxpool.Conn, items []*batchItem) error {
	ids := map[instanceKey]int64{}
	missing := map[instanceKey]*sequence.Sequence{}
	for _, it := range items {
		key := instanceKey{it.mt.Sequence.Name, it.msg.ContextID}
		if id, ok := e.instances.get(key); ok {
			ids[key] = id
		} else {
			missing[key] = it.mt.Sequence
		}
	}
	// A key stays missing only when housekeeping deleted its row between insert and re-read.
	for attempt := 0; len(missing) > 0; attempt++ {
		if attempt == maxInstanceAttempts {
			return fmt.Errorf("instances of a batch: %d created and deleted concurrently %d times", len(missing), maxInstanceAttempts)
		}
		keys := slices.SortedFunc(maps.Keys(missing), func(x, y instanceKey) int {
			return cmp.Or(cmp.Compare(x.sequence, y.sequence), cmp.Compare(x.contextID, y.contextID))
		})
		names, contexts, retain := make([]string, len(keys)), make([]string, len(keys)), make([]time.Time, len(keys))
		for i, k := range keys {
			names[i], contexts[i], retain[i] = k.sequence, k.contextID, e.clock.Now().Add(missing[k].Retention)
		}
		// The re-reads run after the insert, each in a new snapshot: they find the instances
		// it created and those it found existing (committed by others, for whom it waited).
		q := &pgx.Batch{}
		q.Queue(insertInstancesSQL, names, contexts, retain)
		for _, k := range keys {
			q.Queue(selectInstanceSQL, k.sequence, k.contextID)
		}
		br := conn.SendBatch(ctx, q)
		err := func() error {
			if _, err := br.Exec(); err != nil {
				return err
			}
			for _, k := range keys {
				var id int64
				err := br.QueryRow().Scan(&id)
				if errors.Is(err, pgx.ErrNoRows) {
					continue
				}
				if err != nil {
					return err
				}
				ids[k] = id
				e.instances.put(k, id)
				delete(missing, k)
			}
			return nil
		}()
		if closeErr := br.Close(); err == nil {
			err = closeErr
		}
		if err != nil {
			return fmt.Errorf("instances of a batch (%s/%s and %d more): %w", keys[0].sequence, keys[0].contextID, len(keys)-1, err)
		}
	}
	for _, it := range items {
		it.instanceID = ids[instanceKey{it.mt.Sequence.Name, it.msg.ContextID}]
	}
	return nil
}

// instanceKey identifies an instance.
type instanceKey struct{ sequence, contextID string }

// instanceCache remembers the ids of recently used instances (least recently used out), which
// saves the lookup round trip for every further message of an instance.
type instanceCache struct {
	mu      sync.Mutex
	size    int
	order   *list.List // of instanceCacheEntry, most recent first
	entries map[instanceKey]*list.Element
}

type instanceCacheEntry struct {
	key instanceKey
	id  int64
}

func newInstanceCache(size int) *instanceCache {
	return &instanceCache{size: size, order: list.New(), entries: make(map[instanceKey]*list.Element, size)}
}

func (c *instanceCache) get(k instanceKey) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return 0, false
	}
	c.order.MoveToFront(el)
	return el.Value.(instanceCacheEntry).id, true
}

func (c *instanceCache) put(k instanceKey, id int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		el.Value = instanceCacheEntry{k, id}
		c.order.MoveToFront(el)
		return
	}
	c.entries[k] = c.order.PushFront(instanceCacheEntry{k, id})
	if c.order.Len() > c.size {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.entries, oldest.Value.(instanceCacheEntry).key)
	}
}

// evict forgets an instance whose id turned out stale.
func (c *instanceCache) evict(k instanceKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[k]; ok {
		c.order.Remove(el)
		delete(c.entries, k)
	}
}

// instanceStateSQL reads what decides whether and what to release: the instance's state, the
// qualified types PROCESSED in it, and its WAITING messages in release order (by id), one row per
// logical message: a historical duplicate of a WAITING or PROCESSED message is never released.
const instanceStateSQL = `SELECT i.state = 'OPEN', p.types, w.ids, w.types
FROM sequence_instance i,
  LATERAL (SELECT coalesce(array_agg(DISTINCT m.message_type), '{}') AS types
           FROM sequenced_message m WHERE m.sequence_instance_id = i.id AND m.state = 'PROCESSED') p,
  LATERAL (SELECT coalesce(array_agg(m.id ORDER BY m.id), '{}') AS ids,
                  coalesce(array_agg(m.message_type ORDER BY m.id), '{}') AS types
           FROM sequenced_message m WHERE m.sequence_instance_id = i.id AND m.state = 'WAITING'
             AND ` + waitingStandsForItsMessage + `) w
WHERE i.id = $1`

// instanceState is one read of instanceStateSQL. A missing instance (deleted by housekeeping)
// reads as closed and empty.
type instanceState struct {
	open      bool
	processed map[string]bool
	waiting   []waitingMessage
}

// waitingMessage is a WAITING message of an instance.
type waitingMessage struct {
	id            int64
	qualifiedType string
}

// scanInstanceState reads the result of instanceStateSQL.
func scanInstanceState(row pgx.Row) (instanceState, error) {
	var (
		st           instanceState
		processed    []string
		waitingIDs   []int64
		waitingTypes []string
	)
	err := row.Scan(&st.open, &processed, &waitingIDs, &waitingTypes)
	if errors.Is(err, pgx.ErrNoRows) {
		return instanceState{processed: map[string]bool{}}, nil
	}
	if err != nil {
		return instanceState{}, err
	}
	return newInstanceState(st.open, processed, waitingIDs, waitingTypes), nil
}

// newInstanceState builds an instanceState from the columns of instanceStateSQL.
func newInstanceState(open bool, processed []string, waitingIDs []int64, waitingTypes []string) instanceState {
	st := instanceState{open: open, processed: make(map[string]bool, len(processed)), waiting: make([]waitingMessage, len(waitingIDs))}
	for _, t := range processed {
		st.processed[t] = true
	}
	for i := range waitingIDs {
		st.waiting[i] = waitingMessage{id: waitingIDs[i], qualifiedType: waitingTypes[i]}
	}
	return st
}

// nextReleasable returns the oldest WAITING message whose release condition holds.
func (st instanceState) nextReleasable(seq *sequence.Sequence) (waitingMessage, bool) {
	for _, w := range st.waiting {
		if releasable(seq, w.qualifiedType, st.processed) {
			return w, true
		}
	}
	return waitingMessage{}, false
}

// releasable reports whether a message of the qualified type may be released given the
// processed types. A type the sequence no longer declares has no condition left to wait for.
func releasable(seq *sequence.Sequence, qualified string, processed map[string]bool) bool {
	for _, t := range seq.Types {
		if t.Qualified == qualified {
			return t.Condition == nil || t.Condition.Holds(processed)
		}
	}
	return true
}

// needsRelease decides whether a release transaction T2 has anything to do
// (docs/design.md#skipping-t2): a WAITING message whose condition holds, or an open instance whose
// types are all PROCESSED and which must be closed. A closed instance still releases: a message
// buffered while T2 closed the instance would otherwise wait forever.
//
// Skipping T2 when this is false is safe because the state is read after the record's own state
// commit, and every state change that could make a release necessary runs this check after its
// own commit: a message buffered later sees our PROCESSED state in its own check; a message
// processed later sees every WAITING message committed before it. Of two commits, the later
// one's check always sees the earlier one, so no releasable message and no complete instance is
// left unnoticed. PROCESSED never reverts, so a condition that held stays true.
func (st instanceState) needsRelease(seq *sequence.Sequence) bool {
	if st.open && seq.Complete(st.processed) {
		return true
	}
	_, ok := st.nextReleasable(seq)
	return ok
}
