package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/inbox"
)

// processor is what a running consumer processes records with.
type processor struct {
	c         *Consumer
	engine    *inbox.Engine
	publisher *deadletter.Publisher
}

// topicPartition names one assigned partition.
type topicPartition struct {
	topic     string
	partition int32
}

// session is one membership in the consumer group: one franz-go client from join to leave.
type session struct {
	p *processor
	// client is set after the client started; the group callbacks, which may run before, use
	// the client they are given.
	client *kgo.Client

	mu      sync.Mutex
	workers map[topicPartition]*worker
	// marks are the offsets after the last processed record per partition, committed the ones
	// the broker has; both under mu.
	marks, committed map[topicPartition]kgo.EpochOffset

	// commitMu serialises commits, so that a periodic commit never lands after a revocation's
	// final commit of the same partition (which could rewind the next owner).
	commitMu sync.Mutex
}

// runSession joins the group, consumes until ctx ends, then leaves: Close revokes every
// partition, which finishes in-flight records and commits them (session.revoked).
func (p *processor) runSession(ctx context.Context) error {
	c := p.c
	spec := &c.cfg.Inbox.Spec
	s := &session{
		p: p, workers: map[topicPartition]*worker{},
		marks: map[topicPartition]kgo.EpochOffset{}, committed: map[topicPartition]kgo.EpochOffset{},
	}
	opts := append(c.connOpts[:len(c.connOpts):len(c.connOpts)],
		kgo.ConsumerGroup(spec.Kafka.ConsumerGroup),
		kgo.ConsumeTopics(spec.Kafka.Topics...),
		// A new group reads what the topics hold: records produced before the first consumer
		// joined belong to the inbox too.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		// Callbacks never run between a poll and its dispatch, so no record of a revoked
		// partition reaches a worker after the revocation.
		kgo.BlockRebalanceOnPoll(),
		kgo.RebalanceTimeout(c.cfg.maxPollInterval()),
		// A fetch waits at most this long for new records; partitions taken over from a
		// crashed member are fetched no later than that after their assignment.
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
	)
	opts = append(opts, groupTimes(&spec.Kafka)...)
	opts = append(opts, fetchOptions(c.backlog.limit)...)
	opts = append(opts, c.group.options(c.cfg.InstanceID)...)
	if len(c.cfg.hooks) > 0 {
		opts = append(opts, kgo.WithHooks(c.cfg.hooks...))
	}
	c.group.reset()
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	s.client = client
	c.setSessionActive(true)
	c.log.Info("consuming", "group", spec.Kafka.ConsumerGroup, "topics", spec.Kafka.Topics)

	background, stopBackground := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { s.commitPeriodically(background) })
	bg.Go(func() { p.housekeepPeriodically(background) })
	bg.Go(func() { p.runActionsPeriodically(background) })

	s.poll(ctx)

	c.setSessionActive(false)
	stopBackground()
	bg.Wait()
	c.log.Info("leaving the consumer group: finishing in-flight records and committing")
	client.AllowRebalance()
	client.Close()
	return nil
}

// poll fetches and hands records to the partition workers until ctx ends.
func (s *session) poll(ctx context.Context) {
	for {
		fetches := s.client.PollRecords(ctx, maxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			s.client.AllowRebalance()
			return
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			// Group errors (a refused join, a lost membership) are reported by s.p.c.group.
			var groupErr *kgo.ErrGroupSession
			if !errors.Is(err, context.Canceled) && !errors.As(err, &groupErr) {
				s.p.c.log.Error(err, "fetch failed", "topic", topic, "partition", partition)
			}
		})
		fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
			if len(fp.Records) > 0 {
				s.dispatch(fp)
			}
		})
		s.client.AllowRebalance()
	}
}

// dispatch queues a partition's records at its worker (which pauses fetching when it holds too
// much).
func (s *session) dispatch(fp kgo.FetchTopicPartition) {
	tp := topicPartition{fp.Topic, fp.Partition}
	s.mu.Lock()
	w := s.workers[tp]
	s.mu.Unlock()
	if w == nil {
		// Unreachable with BlockRebalanceOnPoll: records come only for assigned partitions. The
		// records are not processed and their offsets never committed; the next owner reads them.
		s.p.c.log.Error(nil, "records of a partition without worker dropped", "topic", fp.Topic, "partition", fp.Partition)
		return
	}
	w.enqueue(fp.Records, fp.HighWatermark)
}

// allWorkers are the workers of the assigned partitions.
func (s *session) allWorkers() []*worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	workers := make([]*worker, 0, len(s.workers))
	for _, w := range s.workers {
		workers = append(workers, w)
	}
	return workers
}

// assigned starts a worker per new partition.
func (s *session) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	s.p.c.group.joinedGroup()
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, partitions := range assigned {
		for _, partition := range partitions {
			tp := topicPartition{topic, partition}
			if s.workers[tp] != nil {
				continue
			}
			w := newWorker(s, cl, tp)
			s.workers[tp] = w
			// Every assigned partition has a lag series; the first fetch with records corrects it.
			s.p.c.metrics.setLag(topic, partition, 0)
			go w.run()
		}
	}
	// A partition paused in an earlier assignment must fetch again.
	cl.ResumeFetchPartitions(assigned)
	if len(assigned) > 0 {
		s.p.c.log.Info("partitions assigned", "partitions", assigned)
	}
}

// revoked finishes the in-flight records of the revoked partitions, commits what is done and
// gives the partitions up. It runs within the rebalance timeout: an in-flight record takes at
// most the record timeout.
func (s *session) revoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	s.release(cl, revoked, !s.p.c.killed.Load())
}

// lost gives partitions up after a fatal group error: another member may own them already, so
// nothing is committed. In-flight records finish (the claim engine keeps a concurrent delivery by
// the new owner from processing them twice).
func (s *session) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	s.release(cl, lost, false)
}

func (s *session) release(cl *kgo.Client, partitions map[string][]int32, commit bool) {
	var stopping []*worker
	s.mu.Lock()
	for topic, ps := range partitions {
		for _, partition := range ps {
			if w := s.workers[topicPartition{topic, partition}]; w != nil {
				stopping = append(stopping, w)
			}
		}
	}
	s.mu.Unlock()
	for _, w := range stopping {
		w.stop()
	}
	for _, w := range stopping {
		<-w.done
	}
	only := map[topicPartition]bool{}
	for _, w := range stopping {
		only[w.tp] = true
	}
	if commit {
		if err := s.commit(cl, only); err != nil {
			s.p.c.log.Error(err, "final commit of revoked partitions failed; their next owner re-reads the uncommitted records (the engine skips what was processed)")
		}
	}
	s.mu.Lock()
	for tp := range only {
		delete(s.workers, tp)
		delete(s.marks, tp)
		delete(s.committed, tp)
		s.p.c.metrics.dropLag(tp.topic, tp.partition)
	}
	s.mu.Unlock()
	cl.ResumeFetchPartitions(partitions)
	if len(stopping) > 0 {
		s.p.c.log.Info("partitions released", "partitions", partitions, "committed", commit)
	}
}

// mark records that everything before next in the partition is done.
func (s *session) mark(tp topicPartition, next kgo.EpochOffset) {
	s.mu.Lock()
	s.marks[tp] = next
	s.mu.Unlock()
}

// commit commits the marks that moved since the last commit (of the given partitions only, when
// only is not nil).
func (s *session) commit(cl *kgo.Client, only map[topicPartition]bool) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	pending := map[string]map[int32]kgo.EpochOffset{}
	s.mu.Lock()
	for tp, mark := range s.marks {
		if only != nil && !only[tp] || s.committed[tp] == mark {
			continue
		}
		if pending[tp.topic] == nil {
			pending[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		pending[tp.topic][tp.partition] = mark
	}
	s.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.p.c.work), commitTimeout)
	defer cancel()
	var commitErr error
	cl.CommitOffsetsSync(ctx, pending, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		commitErr = firstCommitError(resp, err)
	})
	if commitErr != nil {
		return fmt.Errorf("commit offsets %v: %w", pending, commitErr)
	}
	s.mu.Lock()
	for topic, ps := range pending {
		for partition, mark := range ps {
			s.committed[topicPartition{topic, partition}] = mark
		}
	}
	s.mu.Unlock()
	return nil
}

func firstCommitError(resp *kmsg.OffsetCommitResponse, err error) error {
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("%s[%d]: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}

// commitPeriodically commits processed offsets every CommitInterval, so that a crash repeats
// little; revocation and shutdown commit on their own.
func (s *session) commitPeriodically(ctx context.Context) {
	for s.p.c.sleep(ctx, s.p.c.cfg.CommitInterval) {
		if err := s.commit(s.client, nil); err != nil {
			s.p.c.log.Error(err, "periodic offset commit failed; retrying at the next interval")
		}
	}
}

// housekeepPeriodically runs housekeeping every spec.housekeeping.interval on the one consumer
// that holds the housekeeping lease (the leader, which alone serves the database-wide gauges). In
// between it takes or renews the lease at once and every third of its length, so that the leader
// keeps it between runs and another consumer takes it over within about a lease after the leader
// stopped renewing. A run in progress finishes after ctx ends, then the lead is given up; one
// goroutine does all of it, so that nothing takes the lead again after it was given up.
func (p *processor) housekeepPeriodically(ctx context.Context) {
	defer p.engine.ResignHousekeeping()
	spec := &p.c.cfg.Inbox.Spec
	hc := inbox.HousekeepingConfig{
		ExpiryDelay: spec.Housekeeping.ExpiryDelay.Duration,
		BatchSize:   int(spec.Housekeeping.BatchSize),
		MaxDuration: spec.Housekeeping.MaxDuration.Duration,
	}
	renew, untilRun := inbox.HousekeepingLease/3, spec.Housekeeping.Interval.Duration
	for {
		if _, err := p.engine.LeadHousekeeping(ctx); err != nil && ctx.Err() == nil {
			p.c.log.Error(err, "taking or renewing the housekeeping lead failed; trying again", "in", min(renew, untilRun).String())
		}
		step := min(renew, untilRun)
		if !p.c.sleep(ctx, step) {
			return
		}
		if untilRun -= step; untilRun > 0 {
			continue
		}
		untilRun = spec.Housekeeping.Interval.Duration
		rep, err := p.engine.Housekeep(p.c.work, hc, p.publisher)
		if err != nil {
			p.c.log.Error(err, "housekeeping failed")
			continue
		}
		if rep.Leader {
			p.c.log.Info("housekeeping done", "windowedClosed", rep.WindowedClosed, "deletedClosed", rep.DeletedClosed, "markedExpired", rep.MarkedExpired,
				"deletedExpired", rep.DeletedExpired, "deadLettered", rep.DeadLettered, "finished", rep.Finished)
		}
	}
}

// runActionsPeriodically executes the operator actions recorded as pending.
func (p *processor) runActionsPeriodically(ctx context.Context) {
	for p.c.sleep(ctx, p.c.cfg.ActionsInterval) {
		n, err := p.engine.RunPendingActions(p.c.work, p.publisher)
		if err != nil {
			p.c.log.Error(err, "operator actions failed")
			continue
		}
		if n > 0 {
			p.c.log.Info("operator actions executed", "count", n)
		}
	}
}
