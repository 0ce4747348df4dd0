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
// duplicate). A partition runs at most as many records at once as the engine has in-flight
// tokens (each record in the engine holds up to two connections); tokens are shared by all
// partitions.
type keyedRun struct {
	w *worker
	// parallel is how many records of the partition may be in process at once.
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

// awaitRoom waits until the partition may run another record and the window has room; false
// when the worker stops first.
func (k *keyedRun) awaitRoom() bool {
	for {
		k.mu.Lock()
		full := k.running >= k.parallel || len(k.window) >= keyedWindow
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
	t.started = true
	k.running++
	k.wg.Go(func() { k.process(t) })
}

// startReady starts the records of the window that no earlier unfinished record shares a key
// with, in offset order. The caller holds k.mu.
func (k *keyedRun) startReady() {
	k.deferred = false
	ahead := map[string]bool{}
	for _, t := range k.window {
		if t.finished {
			continue
		}
		if !t.started && !slices.ContainsFunc(t.keys, func(key string) bool { return ahead[key] }) {
			k.tryStart(t)
		}
		for _, key := range t.keys {
			ahead[key] = true
		}
	}
}

// process handles one record and finishes it; an abandoned record stops the worker and stays
// unfinished.
func (k *keyedRun) process(t *taken) {
	if !k.w.s.p.handle(k.w, t.r, t.rec, t.decodeErr) {
		k.w.stop()
		return
	}
	defer k.w.release(t.size)
	k.mu.Lock()
	defer k.mu.Unlock()
	t.finished = true
	// The window keeps a finished record until every record before it finished; its bytes are
	// given up now.
	t.r, t.rec, t.decodeErr = nil, inbox.Record{}, nil
	k.running--
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
