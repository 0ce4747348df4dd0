package consumer

import (
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// keyedWindow bounds the records of one partition taken from its queue and not yet finished:
// the ones in process and the ones held back by an earlier record of their key. Records beyond
// it stay in the worker's queue, whose length pauses fetching. The window's records count against
// the consumer's bound in bytes until they finish; a finished record behind an unfinished one keeps
// only its offset.
const keyedWindow = 256

// maxBatch bounds the records of a partition handed to the engine in one claim transaction.
const maxBatch = 16

// taken is a record of the partition between being taken from the queue and being finished.
type taken struct {
	r         *kgo.Record
	rec       inbox.Record
	decodeErr error
	// keys name the records that must go before this one: every earlier unfinished record with
	// one of these keys.
	keys              []string
	started, finished bool
	// size is what the record counts against the consumer's bound; next is the offset after it,
	// marked for commit once every record before it finished too.
	size int64
	next kgo.EpochOffset
}

// keyedRun processes the records of one partition concurrently by key, as Confluent's Parallel
// Consumer does: records of different sequence instances run at the same time; records of one
// instance, and records of one Kafka key, one after the other in offset order. The offset marked
// for commit is the one after the finished prefix of the partition, so that after a crash or a
// revocation everything from the lowest unfinished record on is read again and nothing is
// skipped (what had finished beyond it is found processed by the engine and skipped as a
// duplicate). A partition runs at most as many records, or batches of records, at once as the
// engine has in-flight tokens (each record or batch in the engine holds up to two connections);
// tokens are shared by all partitions. Records that wait for an earlier one of their key, or for
// a free place, go to the engine together as one batch (one claim transaction) when they can.
type keyedRun struct {
	w *worker
	// parallel is how many records or batches of the partition may be in process at once.
	parallel int

	mu sync.Mutex
	// window holds the taken records in offset order; its finished prefix is dropped as the
	// commit mark moves past it.
	window []*taken
	// unfinished counts the unfinished records of the window per key.
	unfinished map[string]int
	// running counts the records in process; deferred is set when a record that may start
	// waits for running to drop below parallel.
	running  int
	deferred bool
	// room is signalled when a record finished.
	room chan struct{}
	wg   sync.WaitGroup
}

// run takes records until the worker stops and starts each as soon as no earlier unfinished
// record shares a key with it, then waits for the records in process. A record abandoned
// (stopped while retrying, consumer killed) stops the worker: its offset and everything after it
// stay uncommitted, and no further record is started.
func (w *worker) run() {
	defer close(w.done)
	k := &keyedRun{w: w, parallel: cap(w.s.p.c.inFlight), unfinished: map[string]int{}, room: make(chan struct{}, 1)}
	for k.awaitRoom() {
		r, ok := w.next()
		if !ok {
			break
		}
		k.take(r)
	}
	k.wg.Wait()
	w.dropAll()
}

// awaitRoom waits until the window has room; false when the worker stops first. Records taken
// while the partition runs its share wait in the window, where the next free place takes them
// as one batch.
func (k *keyedRun) awaitRoom() bool {
	for {
		k.mu.Lock()
		full := len(k.window) >= keyedWindow
		k.mu.Unlock()
		if !full {
			return true
		}
		select {
		case <-k.room:
		case <-k.w.stopping:
			return false
		}
	}
}

// take decodes a record, which names its keys, appends it to the window and starts it when no
// unfinished record shares a key with it.
func (k *keyedRun) take(r *kgo.Record) {
	p := k.w.s.p
	rec, err := p.c.decoder.Decode(r, p.c.clock.Now())
	t := &taken{r: r, rec: rec, decodeErr: err, keys: orderKeys(p.c.set, r, rec, err),
		size: recordSize(r), next: kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}}
	if extra := decodedSize(r, rec); extra > 0 {
		t.size += extra
		k.w.hold(extra)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.window = append(k.window, t)
	// Every unfinished record is earlier than t.
	free := true
	for _, key := range t.keys {
		free = free && k.unfinished[key] == 0
		k.unfinished[key]++
	}
	if free {
		k.tryStart(t)
	}
}

// orderKeys name the records that must be processed in offset order: those of one Kafka key
// and those of one sequence instance.
func orderKeys(set *sequence.Set, r *kgo.Record, rec inbox.Record, decodeErr error) []string {
	keys := []string{"k\x00" + string(r.Key)}
	if decodeErr == nil && rec.Sequenced && rec.ContextID != "" {
		if mt, ok := set.Lookup(sequence.Qualify(rec.Type, rec.Subtype)); ok {
			keys = append(keys, "i\x00"+mt.Sequence.Name+"\x00"+rec.ContextID)
		}
	}
	return keys
}

// tryStart starts t, which no earlier unfinished record shares a key with, unless the worker
// stops or the partition runs its share already. The caller holds k.mu.
func (k *keyedRun) tryStart(t *taken) {
	select {
	case <-k.w.stopping:
		return
	default:
	}
	if k.running >= k.parallel {
		k.deferred = true
		return
	}
	k.startGroup([]*taken{t})
}

// startGroup starts records in one place of the partition: one record, or a batch for the
// engine. The caller holds k.mu.
func (k *keyedRun) startGroup(g []*taken) {
	for _, t := range g {
		t.started = true
	}
	k.running++
	k.wg.Go(func() { k.process(g) })
}

// startReady starts the records of the window that no earlier unfinished record shares a key
// with, in offset order, in groups that the engine processes as one batch (one claim
// transaction). A record joins the group before it when it shares a key only with records of
// that group (it would wait for them otherwise), or when the partition has no place left for a
// group of its own; only records that the engine can claim together join groups, at most
// maxBatch. The caller holds k.mu.
func (k *keyedRun) startReady() {
	k.deferred = false
	select {
	case <-k.w.stopping:
		return
	default:
	}
	var (
		// blocked are the keys of earlier unfinished records outside the open group.
		blocked   = map[string]bool{}
		group     []*taken
		groupKeys = map[string]bool{}
	)
	block := func(keys []string, into map[string]bool) {
		for _, key := range keys {
			into[key] = true
		}
	}
	closeGroup := func() {
		if len(group) > 0 {
			k.startGroup(group)
			for key := range groupKeys {
				blocked[key] = true
			}
			group, groupKeys = nil, map[string]bool{}
		}
	}
	for _, t := range k.window {
		if t.finished {
			continue
		}
		if t.started || slices.ContainsFunc(t.keys, func(key string) bool { return blocked[key] }) {
			block(t.keys, blocked)
			continue
		}
		behindGroup := slices.ContainsFunc(t.keys, func(key string) bool { return groupKeys[key] })
		if len(group) > 0 && (behindGroup || k.running+1 >= k.parallel) && k.joins(group, t) {
			group = append(group, t)
			block(t.keys, groupKeys)
			continue
		}
		if behindGroup {
			block(t.keys, blocked)
			continue
		}
		closeGroup()
		if k.running >= k.parallel {
			k.deferred = true
			block(t.keys, blocked)
			continue
		}
		group = []*taken{t}
		block(t.keys, groupKeys)
	}
	closeGroup()
}

// joins reports whether t may join group: both claimable together, the group not full.
func (k *keyedRun) joins(group []*taken, t *taken) bool {
	e := k.w.s.p.engine
	batchable := func(t *taken) bool { return t.decodeErr == nil && e.Batchable(t.rec) }
	return len(group) < maxBatch && batchable(group[0]) && batchable(t)
}

// process handles a group of records, finishing each when done; an abandoned record stops the
// worker and stays unfinished, with the records after it in the group.
func (k *keyedRun) process(g []*taken) {
	p := k.w.s.p
	last := g[len(g)-1]
	finish := func(t *taken) { k.finish(t, t == last) }
	var ok bool
	if len(g) == 1 {
		ok = p.handle(k.w, last.r, last.rec, last.decodeErr)
		if ok {
			finish(last)
		}
	} else {
		ok = p.handleBatch(k.w, g, finish)
	}
	if !ok {
		k.w.stop()
	}
}

// finish marks a record finished, gives up its bytes, moves the commit mark past the finished
// prefix and starts what may start now; freeing releases the group's place in the partition.
func (k *keyedRun) finish(t *taken, freeing bool) {
	defer k.w.release(t.size)
	k.mu.Lock()
	defer k.mu.Unlock()
	t.finished = true
	// The window keeps a finished record until every record before it finished; its bytes are
	// given up now.
	t.r, t.rec, t.decodeErr = nil, inbox.Record{}, nil
	if freeing {
		k.running--
	}
	waiting := k.deferred
	for _, key := range t.keys {
		if k.unfinished[key]--; k.unfinished[key] == 0 {
			delete(k.unfinished, key)
		} else {
			waiting = true
		}
	}
	n := 0
	for n < len(k.window) && k.window[n].finished {
		n++
	}
	if n > 0 {
		k.w.markDone(k.window[n-1].next)
		clear(k.window[:n])
		k.window = k.window[n:]
	}
	if waiting {
		// Records that shared a key with t, or waited for a free place, may start now.
		k.startReady()
	}
	select {
	case k.room <- struct{}{}:
	default:
	}
}

// markDone marks everything before next as done for the next commit and updates the lag.
func (w *worker) markDone(next kgo.EpochOffset) {
	w.s.mark(w.tp, next)
	w.mu.Lock()
	lag := w.hwm - next.Offset
	w.mu.Unlock()
	w.s.p.c.metrics.setLag(w.tp.topic, w.tp.partition, lag)
}
