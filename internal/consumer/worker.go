package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// worker processes the records of one assigned partition: concurrently by key (keyed.go).
type worker struct {
	s      *session
	client *kgo.Client
	tp     topicPartition

	mu    sync.Mutex
	queue []*kgo.Record
	// held is the bytes of the records handed to the worker and not finished (queued, or taken
	// into the keyed window), counted in the consumer's backlog too.
	held   int64
	hwm    int64
	paused bool

	wake     chan struct{} // a record was queued
	stopping chan struct{} // closed by stop: take no further record, stop retrying
	stopOnce sync.Once
	done     chan struct{} // closed when run returned
}

func newWorker(s *session, client *kgo.Client, tp topicPartition) *worker {
	return &worker{s: s, client: client, tp: tp, wake: make(chan struct{}, 1), stopping: make(chan struct{}), done: make(chan struct{})}
}

// enqueue adds polled records and pauses fetching the partition when its queue is long or the
// consumer holds more bytes than its bound.
func (w *worker) enqueue(records []*kgo.Record, hwm int64) {
	var size int64
	for _, r := range records {
		size += recordSize(r)
	}
	backlog := w.s.p.c.backlog
	backlog.add(size)
	w.mu.Lock()
	w.queue = append(w.queue, records...)
	w.held += size
	w.hwm = max(w.hwm, hwm)
	if !w.paused && (len(w.queue) >= pauseBacklog || backlog.over()) {
		// Under w.mu, so that a concurrent maybeResume cannot resume before this pause.
		w.paused = true
		w.client.PauseFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
	next := w.queue[0].Offset
	w.mu.Unlock()
	w.s.p.c.metrics.setLag(w.tp.topic, w.tp.partition, hwm-next)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// hold counts size more bytes for records the worker holds already (what decoding added).
func (w *worker) hold(size int64) {
	w.s.p.c.backlog.add(size)
	w.mu.Lock()
	w.held += size
	w.mu.Unlock()
}

// release stops counting size bytes of records that finished or were dropped, and lets paused
// partitions fetch again when they may.
func (w *worker) release(size int64) {
	w.mu.Lock()
	w.held -= size
	w.mu.Unlock()
	if !w.s.p.c.backlog.release(size) {
		w.maybeResume()
		return
	}
	// Down to the low-water mark: every paused partition may fetch again.
	for _, o := range w.s.allWorkers() {
		o.maybeResume()
	}
}

// maybeResume resumes fetching the partition when its queue is short and either the consumer is
// down to its low-water mark or the partition holds nothing.
func (w *worker) maybeResume() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.paused && len(w.queue) <= resumeBacklog && (w.held == 0 || w.s.p.c.backlog.drained()) {
		w.paused = false
		w.client.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
}

// dropAll stops counting the records the worker still holds; it runs when the worker stopped and
// its records not finished will not be.
func (w *worker) dropAll() {
	w.mu.Lock()
	held := w.held
	clear(w.queue)
	w.queue = nil
	w.mu.Unlock()
	w.release(held)
}

// next takes the next record; false once the worker is stopping.
func (w *worker) next() (*kgo.Record, bool) {
	for {
		select {
		case <-w.stopping:
			return nil, false
		default:
		}
		w.mu.Lock()
		if len(w.queue) > 0 {
			r := w.queue[0]
			w.queue[0] = nil
			w.queue = w.queue[1:]
			w.mu.Unlock()
			w.maybeResume()
			return r, true
		}
		w.mu.Unlock()
		select {
		case <-w.wake:
		case <-w.stopping:
			return nil, false
		}
	}
}

func (w *worker) stop() { w.stopOnce.Do(func() { close(w.stopping) }) }

// wait sleeps d unless the worker stops or the consumer is killed first.
func (w *worker) wait(d time.Duration) bool {
	select {
	case <-w.stopping:
		return false
	case <-w.s.p.c.work.Done():
		return false
	case <-w.s.p.c.clock.After(d):
		return true
	}
}

// errAbandoned reports a record given up because its worker stopped or the consumer was killed;
// its offset is not committed.
var errAbandoned = errors.New("record abandoned: partition revoked or consumer stopping")

// handle decides about one decoded record (err is the decoder's): process or dead-letter. It
// returns true when the record is finished, false when it was abandoned.
func (p *processor) handle(w *worker, r *kgo.Record, rec inbox.Record, err error) bool {
	c := p.c
	ev := Event{Origin: rec.Origin, Type: rec.Type, Subtype: rec.Subtype, ContextID: rec.ContextID, IdempotenceID: rec.IdempotenceID}
	if err != nil {
		class, cause := decode.ClassInvalidCloudEvent, err
		var de *decode.Error
		if errors.As(err, &de) {
			// The class is the reason header; the message need not repeat it.
			class, cause = de.Class, de.Err
		}
		return p.deadLetterRecord(w, r, rec, class, cause, ev)
	}
	defer c.blocked.ended(r)
	backoff := retryBackoff()
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !w.wait(backoff.Step()) {
			return false
		}
		res, listenerCut, err := p.process(w, rec)
		if errors.Is(err, errAbandoned) {
			return false
		}
		if err != nil {
			// Buffered messages whose release failed before the error are FAILED already; a
			// retry of this record would not find them again.
			if !p.publishAll(w, releaseLetters(res)) || c.work.Err() != nil {
				return false
			}
			if reason, cause, ok := recordFault(err, listenerCut, c.recordTimeout, c.listenerDeadline()); ok {
				return p.deadLetterRecord(w, r, rec, reason, cause, ev)
			}
			c.metrics.retries.WithLabelValues(causeInfrastructure).Inc()
			c.blocked.retrying(r, err)
			c.log.Error(err, "processing failed; retrying the record", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "attempt", attempt+1)
			continue
		}
		return p.settle(w, r, rec, res)
	}
}

// settle dead-letters what the engine's result asks for and reports the record; false when
// abandoned.
func (p *processor) settle(w *worker, r *kgo.Record, rec inbox.Record, res inbox.Result) bool {
	var letters []deadletter.Letter
	if res.Outcome == inbox.Failed {
		l := deadletter.FromKafka(r, deadletter.ReasonListenerFailed, res.ListenerErr)
		l.Sequence, l.ContextID = p.sequenceOf(rec), rec.ContextID
		letters = append(letters, l)
	}
	if !p.publishAll(w, append(letters, releaseLetters(res)...)) {
		return false
	}
	ev := Event{Origin: rec.Origin, Type: rec.Type, Subtype: rec.Subtype, ContextID: rec.ContextID, IdempotenceID: rec.IdempotenceID}
	ev.Outcome, ev.Released, ev.ReleaseFailures = res.Outcome.String(), len(res.Released), len(res.ReleaseFailures)
	p.report(ev)
	return true
}

// handleBatch processes records that the engine claims together (inbox.Engine.Batchable) in
// batches, in order, and finishes each record as soon as its batch committed. When a batch
// fails, its records go through handle one by one, which retries and classifies errors per
// record; what the failed batch delivered is found processed then. False when abandoned.
func (p *processor) handleBatch(w *worker, group []*taken, finish func(*taken)) bool {
	for len(group) > 0 {
		recs := make([]inbox.Record, len(group))
		for i, t := range group {
			recs[i] = t.rec
		}
		var (
			results []inbox.Result
			err     error
		)
		if abandoned := p.inEngine(w, func(ctx context.Context) { results, err = p.engine.ProcessBatch(ctx, recs) }); abandoned {
			return false
		}
		if err != nil {
			var letters []deadletter.Letter
			for _, res := range results {
				letters = append(letters, releaseLetters(res)...)
			}
			if !p.publishAll(w, letters) || p.c.work.Err() != nil {
				return false
			}
			p.c.log.Info("batch failed; processing its records one by one", "topic", w.tp.topic, "partition", w.tp.partition,
				"offset", group[0].r.Offset, "records", len(group), "error", err.Error())
			for _, t := range group {
				if !p.handle(w, t.r, t.rec, nil) {
					return false
				}
				finish(t)
			}
			return true
		}
		for i, res := range results {
			if !p.settle(w, group[i].r, group[i].rec, res) {
				return false
			}
			finish(group[i])
		}
		group = group[len(results):]
	}
	return true
}

// releaseLetters are the dead letters of the buffered messages whose release failed.
func releaseLetters(res inbox.Result) []deadletter.Letter {
	letters := make([]deadletter.Letter, 0, len(res.ReleaseFailures))
	for _, f := range res.ReleaseFailures {
		l := deadletter.FromRecord(f.Message.Record, deadletter.ReasonReleaseFailed, f.Err)
		l.Origin, l.Sequence, l.ContextID = f.Origin, f.Message.Sequence, f.Message.ContextID
		letters = append(letters, l)
	}
	return letters
}

// publishAll publishes letters in order; false when abandoned.
func (p *processor) publishAll(w *worker, letters []deadletter.Letter) bool {
	for _, l := range letters {
		if !p.publish(w, l) {
			return false
		}
	}
	return true
}

// process runs the engine on one record within the record timeout, holding an in-flight token.
// listenerCut reports that the record timeout ended while the sink was being called.
func (p *processor) process(w *worker, rec inbox.Record) (res inbox.Result, listenerCut bool, err error) {
	var cut atomic.Bool
	if abandoned := p.inEngine(w, func(ctx context.Context) {
		res, err = p.engine.Process(context.WithValue(ctx, cutKey{}, &cut), rec)
	}); abandoned {
		return inbox.Result{}, false, errAbandoned
	}
	return res, cut.Load(), err
}

// inEngine runs a record or a batch in the engine within the record timeout, holding one in-flight
// token (a batch holds two connections, as a record does); true when abandoned before it started.
func (p *processor) inEngine(w *worker, run func(ctx context.Context)) (abandoned bool) {
	c := p.c
	select {
	case c.inFlight <- struct{}{}:
	case <-w.stopping:
		return true
	case <-c.work.Done():
		return true
	}
	c.metrics.inFlight.Inc()
	defer func() {
		c.metrics.inFlight.Dec()
		<-c.inFlight
	}()
	ctx, cancel := context.WithTimeoutCause(c.work, c.recordTimeout, errRecordDeadline)
	defer cancel()
	run(ctx)
	return false
}

// deadLetterRecord sends a record the engine did not decide about to the dead-letter topic.
func (p *processor) deadLetterRecord(w *worker, r *kgo.Record, rec inbox.Record, reason string, err error, ev Event) bool {
	l := deadletter.FromKafka(r, reason, err)
	l.Sequence, l.ContextID = p.sequenceOf(rec), rec.ContextID
	if !p.publish(w, l) {
		return false
	}
	ev.Outcome, ev.Reason = OutcomeDeadLettered, reason
	p.report(ev)
	return true
}

// publish produces a dead letter, retrying until the broker has it; false when abandoned (then
// the record's offset must not be committed: the letter may be lost otherwise).
func (p *processor) publish(w *worker, l deadletter.Letter) bool {
	backoff := retryBackoff()
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !w.wait(backoff.Step()) {
			return false
		}
		ctx, cancel := context.WithTimeout(p.c.work, min(publishTimeout, p.c.recordTimeout))
		err := p.publisher.Publish(ctx, l)
		cancel()
		p.c.setDeadLetterTopicMissing(errors.Is(err, kerr.UnknownTopicOrPartition))
		if err == nil {
			p.c.log.Info("dead-lettered", "topic", l.Origin.Topic, "partition", l.Origin.Partition, "offset", l.Origin.Offset,
				"reason", l.Reason, "message", l.Message, "sequence", l.Sequence, "context", l.ContextID)
			return true
		}
		if p.c.work.Err() != nil {
			return false
		}
		p.c.metrics.retries.WithLabelValues(causeDeadLetter).Inc()
		p.c.log.Error(err, "dead-letter produce failed; retrying, the record's offset stays uncommitted", "attempt", attempt+1)
	}
}

func (p *processor) sequenceOf(rec inbox.Record) string {
	if mt, ok := p.c.set.Lookup(sequence.Qualify(rec.Type, rec.Subtype)); ok {
		return mt.Sequence.Name
	}
	return ""
}

func (p *processor) report(ev Event) {
	p.c.metrics.records.WithLabelValues(ev.Outcome).Inc()
	p.c.log.V(1).Info("record processed", "topic", ev.Origin.Topic, "partition", ev.Origin.Partition, "offset", ev.Origin.Offset,
		"type", sequence.Qualify(ev.Type, ev.Subtype), "context", ev.ContextID, "outcome", ev.Outcome)
	if p.c.cfg.OnRecord != nil {
		p.c.cfg.OnRecord(ev)
	}
}
