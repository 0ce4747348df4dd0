// Package consumer is the consumer runtime of one SequentialInbox
// (docs/design.md#consumer-runtime): a franz-go group consumer that decodes CloudEvents records,
// hands them to the claim engine, dead-letters what cannot be processed and commits an offset only
// after the engine decided about its record. It keeps the database schema and the version fence in
// view (it fetches only while both pass), runs housekeeping and operator actions, and serves
// health, readiness and metrics.
//
// Records of one sequence instance, and records of one Kafka key, are processed in offset order;
// everything else runs in parallel, within a partition too (keyed.go), at most poolSize/2 records
// at a time (each holds up to two connections). The offset committed for a partition is the one
// of its lowest unfinished record. On revocation and on shutdown the in-flight records finish,
// records not started are dropped, and the offsets of what is done are committed before the
// partitions are given up.
package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/api/v1alpha1"
	"github.com/seqinbox/seqinbox/internal/consumerstate"
	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/sequence"
	"github.com/seqinbox/seqinbox/internal/sink"
	"github.com/seqinbox/seqinbox/internal/version"
)

// ErrKilled is what Run returns after Kill.
var ErrKilled = errors.New("consumer killed")

// Event says what became of one record; the offset after it may be committed.
type Event struct {
	// Origin is where the record was read.
	Origin inbox.Origin
	// Type, Subtype, ContextID and IdempotenceID are what the decoder read (as far as it got).
	Type, Subtype, ContextID, IdempotenceID string
	// Outcome is the engine's outcome (Delivered, Buffered, Duplicate, Bypassed, Failed) or
	// DeadLettered for a record the engine never took (undecodable, undeclared type, ...).
	Outcome string
	// Reason is the dead-letter reason of the record itself, empty when it was not dead-lettered.
	Reason string
	// Released and ReleaseFailures count the buffered messages this record's release handled.
	Released, ReleaseFailures int
}

// OutcomeDeadLettered is the Event outcome of a record that never reached the engine's decision.
const OutcomeDeadLettered = "DeadLettered"

// Consumer runs one SequentialInbox consumer. Build it with New, run it with Run.
type Consumer struct {
	cfg           Config
	log           logr.Logger
	clock         clock.Clock
	set           *sequence.Set
	decoder       *decode.Decoder
	sink          *sink.Sink
	connOpts      []kgo.Opt
	dlqTopic      string
	recordTimeout time.Duration
	// inFlight holds a token per record in the engine: at most poolSize/2.
	inFlight chan struct{}
	// backlog counts the bytes of the records held by the partition workers.
	backlog *backlog

	registry      *prometheus.Registry
	metrics       *metrics
	blocked       *blockage
	engineMetrics *inbox.Metrics
	dlqMetrics    *deadletter.Metrics
	// deadLetters counts the dead letters of the last hour for State.
	deadLetters *hourlyCount
	// deadLettersByReason counts them by reason (deadLettersOf).
	deadLettersMu       sync.Mutex
	deadLettersByReason map[string]*hourlyCount
	// build is what this consumer speaks; group is its membership in the Kafka consumer group.
	build build
	group *groupMembership

	// work is the context of all processing; Kill cancels it (a graceful stop does not).
	work   context.Context
	kill   context.CancelFunc
	killed atomic.Bool

	mu            sync.Mutex
	fenceReady    bool
	fenceReason   string
	fenceChanged  chan struct{} // closed and replaced on every fence report
	sessionActive bool
	// dlqMissing is set while dead-letter produces fail because the topic does not exist.
	dlqMissing bool
}

// New compiles the declaration and checks the configuration; it opens no connection.
func New(cfg Config) (*Consumer, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	spec := &cfg.Inbox.Spec
	set, errs := declaration.Compile(spec)
	if len(errs) > 0 {
		return nil, fmt.Errorf("consumer: invalid SequentialInbox %s: %w", cfg.Inbox.Name, errs.ToAggregate())
	}
	dec, err := decode.New(set)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	connOpts, err := ConnectionOptions(&spec.Kafka, cfg.Kafka)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ActionsInterval <= 0 {
		cfg.ActionsInterval = defaultActionsInterval
	}
	if cfg.CommitInterval <= 0 {
		cfg.CommitInterval = defaultCommitInterval
	}
	log := cfg.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	log = log.WithValues("inbox", cfg.Inbox.Name, "instance", cfg.InstanceID)
	connOpts = append(connOpts, kgo.WithLogger(kafkaLogger{log.WithName("kafka")}))

	c := &Consumer{
		cfg: cfg, log: log, clock: cfg.Clock, set: set, decoder: dec, connOpts: connOpts,
		dlqTopic:            manifest.DeadLetterTopic(spec),
		recordTimeout:       RecordTimeout(cfg.maxPollInterval()),
		inFlight:            make(chan struct{}, cfg.inFlightLimit()),
		backlog:             newBacklog(cfg.maxBufferedBytes()),
		registry:            prometheus.NewRegistry(),
		metrics:             newMetrics(),
		blocked:             newBlockage(cfg.Clock),
		engineMetrics:       inbox.NewMetrics(),
		dlqMetrics:          deadletter.NewMetrics(),
		deadLetters:         newHourlyCount(cfg.Clock),
		deadLettersByReason: map[string]*hourlyCount{},
		fenceReason:         "starting: schema check and version fence not done yet",
		fenceChanged:        make(chan struct{}),
	}
	c.build = thisBuild()
	if cfg.build != (build{}) {
		c.build = cfg.build
	}
	c.group = newGroupMembership(&spec.Kafka, manifest.GroupProtocol(c.build.claimProtocol, &spec.Kafka), c.clock, log.WithName("group"))
	c.group.changed = c.updateReadyMetric
	sinkMetrics := sink.NewMetrics()
	sinkCfg := sink.ConfigFor(&spec.Sink)
	sinkCfg.URL, sinkCfg.Auth, sinkCfg.Log = manifest.SinkURL(cfg.Inbox), cfg.SinkAuth, log.WithName("sink")
	c.sink, err = sink.New(sinkCfg, sinkMetrics)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c.work, c.kill = context.WithCancel(context.Background())
	c.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		version.BuildInfo(c.build.engineVersion, c.build.claimProtocol), c.blocked)
	for _, cs := range [][]prometheus.Collector{c.metrics.collectors(), c.engineMetrics.Collectors(), sinkMetrics.Collectors(), c.dlqMetrics.Collectors(), c.group.collectors(), c.backlog.collectors()} {
		c.registry.MustRegister(cs...)
	}
	return c, nil
}

// listenerDeadline bounds one listener call: every sink attempt and backoff.
func (c *Consumer) listenerDeadline() time.Duration {
	return sink.ConfigFor(&c.cfg.Inbox.Spec.Sink).Deadline()
}

// Run consumes until ctx ends, then stops fetching, finishes the in-flight records, commits,
// leaves the group, deregisters and returns nil. It returns ErrKilled after Kill, and an error
// when it cannot start (database, brokers, listen addresses).
func (c *Consumer) Run(ctx context.Context) error {
	defer c.sink.Close()
	stopServers, err := c.serve()
	if err != nil {
		return err
	}
	defer stopServers()

	spec := &c.cfg.Inbox.Spec
	pool, err := newPool(ctx, c.cfg.DatabaseURL, spec.Database.PoolSize, c.log.WithName("database"))
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	defer pool.Close()
	// Housekeeping, operator actions, metrics reads and the fence never take a record's connection.
	maintenance, err := newPool(ctx, c.cfg.DatabaseURL, v1alpha1.MaintenanceConnections, logr.Discard())
	if err != nil {
		return fmt.Errorf("consumer: maintenance %w", err)
	}
	defer maintenance.Close()
	defer func() { c.log.Info("consumer stopped", "killed", c.killed.Load()) }()
	// Kill closes the pool at once, as a crash would drop the connections.
	stopKillWatch := context.AfterFunc(c.work, func() { pool.Close(); maintenance.Close() })
	defer stopKillWatch()

	producer, err := kgo.NewClient(append(c.connOpts[:len(c.connOpts):len(c.connOpts)], deadletter.ProducerLimit())...)
	if err != nil {
		return fmt.Errorf("consumer: dead-letter producer: %w", err)
	}
	defer producer.Close()
	publisher := deadletter.NewPublisher(producer, c.dlqTopic, c.clock, c.dlqMetrics)
	c.group.admin = kadm.NewClient(producer)

	deadline := c.listenerDeadline()
	if deadline >= c.recordTimeout {
		c.log.Info("the sink's timeout and retries take longer than a record may take; raise spec.kafka.maxPollIntervalMs or lower the sink's timeout or retries",
			"listenerDeadline", deadline, "recordTimeout", c.recordTimeout)
	}
	engineCfg := engineConfig(spec, deadline, c.clock, c.log)
	engineCfg.Maintenance = maintenance
	engine, err := inbox.New(pool, c.set, listenerWatch{c.sink}, engineCfg, c.engineMetrics)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	fenceCfg := c.cfg.Fence
	fenceCfg.Clock = c.clock
	fenceCfg.Log = c.log.WithName("fence")
	fenceCfg.Blocked = c.blocked.longest
	f, err := fence.New(maintenance, fence.Identity{
		InstanceID: c.cfg.InstanceID, ConsumerGroup: spec.Kafka.ConsumerGroup,
		EngineVersion: c.build.engineVersion, ClaimProtocol: c.build.claimProtocol, Inbox: manifest.InboxName(c.cfg.Inbox),
		Schema: spec.Database.Schema,
	}, fenceCfg)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	// The fence outlives the last session: it deregisters only after the drain, so that no
	// consumer of another claim protocol starts while this one still processes.
	fenceCtx, stopFence := context.WithCancel(c.work)
	fenceDone := make(chan struct{})
	go func() {
		defer close(fenceDone)
		if err := f.Run(fenceCtx, c.onFence); err != nil {
			c.log.Error(err, "version fence stopped")
		}
	}()
	defer func() {
		stopFence()
		<-fenceDone
	}()

	c.log.Info("consumer started", "group", spec.Kafka.ConsumerGroup, "topics", spec.Kafka.Topics,
		"deadLetterTopic", c.dlqTopic, "poolSize", spec.Database.PoolSize, "inFlight", cap(c.inFlight),
		"recordTimeout", c.recordTimeout, "listenerDeadline", deadline, "maxBufferedBytes", c.backlog.limit, "engine", c.build.engineVersion, "claimProtocol", c.build.claimProtocol,
		"groupProtocol", c.group.protocol)
	p := &processor{c: c, engine: engine, publisher: publisher}
	backoff := retryBackoff()
	for c.awaitFence(ctx) {
		sctx, cancel := context.WithCancel(ctx)
		stopOnKill := context.AfterFunc(c.work, cancel)
		go c.cancelWhenFenceCloses(sctx, cancel)
		err := p.runSession(sctx)
		stopOnKill()
		cancel()
		if c.killed.Load() || ctx.Err() != nil {
			break
		}
		if err != nil {
			c.log.Error(err, "consumer group session failed; starting a new one")
			if !c.sleep(ctx, backoff.Step()) {
				break
			}
			continue
		}
		backoff = retryBackoff()
	}
	if c.killed.Load() {
		return ErrKilled
	}
	return nil
}

// Kill stops the consumer as a crash would, as far as one process can: in-flight records are
// cancelled (their claims roll back as their connections close), no further offset is committed,
// the database pool closes. Run returns ErrKilled.
func (c *Consumer) Kill() {
	c.killed.Store(true)
	c.kill()
}

// Ready reports whether the consumer fetches, or why not (schema, version fence, stopping, not
// in the consumer group: for example refused while members of another group protocol hold it).
func (c *Consumer) Ready() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.killed.Load():
		return false, "consumer was killed"
	case !c.fenceReady:
		return false, c.fenceReason
	case !c.sessionActive:
		return false, "not consuming: joining or leaving the consumer group"
	case c.dlqMissing:
		return false, fmt.Sprintf("dead-letter topic %s is missing: the records that need it wait; create the topic", c.dlqTopic)
	}
	return c.group.ready()
}

// setDeadLetterTopicMissing records whether the last dead-letter produce found no topic.
func (c *Consumer) setDeadLetterTopicMissing(missing bool) {
	c.mu.Lock()
	changed := c.dlqMissing != missing
	c.dlqMissing = missing
	c.mu.Unlock()
	if changed {
		c.updateReadyMetric()
	}
}

// Registry holds every collector of this consumer (runtime, engine, sink, dead letters, Go).
func (c *Consumer) Registry() *prometheus.Registry { return c.registry }

// Handler serves /healthz, /readyz and /metrics, for running a consumer inside another process.
func (c *Consumer) Handler() http.Handler {
	mux := http.NewServeMux()
	c.healthRoutes(mux)
	mux.Handle("/metrics", promhttp.HandlerFor(c.registry, promhttp.HandlerOpts{}))
	return mux
}

func (c *Consumer) healthRoutes(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if c.killed.Load() {
			http.Error(w, "consumer was killed", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready, reason := c.Ready(); !ready {
			http.Error(w, reason, http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ready")
	})
}

// serve starts the health and metrics listeners; the returned function shuts them down.
func (c *Consumer) serve() (func(), error) {
	var servers []*http.Server
	stop := func() {
		for _, s := range servers {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.Shutdown(ctx)
			cancel()
		}
	}
	health := http.NewServeMux()
	c.healthRoutes(health)
	metricsMux := http.NewServeMux()
	metricsMux.Handle("/metrics", promhttp.HandlerFor(c.registry, promhttp.HandlerOpts{}))
	stateFiles := consumerstate.Files{Dir: c.cfg.StateCredentialsDir}
	for _, s := range []struct {
		addr, paths string
		handler     http.Handler
		tls         *tls.Config
	}{
		{c.cfg.HealthAddr, "/healthz /readyz", health, nil},
		{c.cfg.MetricsAddr, "/metrics", metricsMux, nil},
		{c.cfg.StateAddr, consumerstate.Path + " (HTTPS, the operator's token)", stateFiles.Handler(c.State), stateFiles.TLSConfig()},
	} {
		if s.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			stop()
			return nil, fmt.Errorf("consumer: listen on %s: %w", s.addr, err)
		}
		c.log.Info("serving", "endpoints", s.paths, "addr", ln.Addr().String())
		srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, srv)
		if s.tls != nil {
			ln = tls.NewListener(ln, s.tls)
		}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				c.log.Error(err, "HTTP server stopped", "addr", ln.Addr().String())
			}
		}()
	}
	return stop, nil
}

// onFence receives the fence's readiness reports.
func (c *Consumer) onFence(ready bool, reason string) {
	c.mu.Lock()
	c.fenceReady, c.fenceReason = ready, reason
	close(c.fenceChanged)
	c.fenceChanged = make(chan struct{})
	c.mu.Unlock()
	if !ready {
		c.log.Info("not consuming", "reason", reason)
	}
	c.updateReadyMetric()
}

func (c *Consumer) fenceState() (bool, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fenceReady, c.fenceChanged
}

// awaitFence waits until the fence lets this consumer process; false when ctx ended or killed.
func (c *Consumer) awaitFence(ctx context.Context) bool {
	for {
		ready, changed := c.fenceState()
		if ready {
			return ctx.Err() == nil && !c.killed.Load()
		}
		select {
		case <-ctx.Done():
			return false
		case <-c.work.Done():
			return false
		case <-changed:
		}
	}
}

// cancelWhenFenceCloses ends a session as soon as the fence turns not ready.
func (c *Consumer) cancelWhenFenceCloses(ctx context.Context, cancel context.CancelFunc) {
	for {
		ready, changed := c.fenceState()
		if !ready {
			cancel()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

func (c *Consumer) setSessionActive(active bool) {
	c.mu.Lock()
	c.sessionActive = active
	c.mu.Unlock()
	c.updateReadyMetric()
}

func (c *Consumer) updateReadyMetric() {
	ready, _ := c.Ready()
	if ready {
		c.metrics.ready.Set(1)
	} else {
		c.metrics.ready.Set(0)
	}
}

// sleep waits d on the consumer's clock; false when ctx ended or the consumer was killed first.
func (c *Consumer) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-c.work.Done():
		return false
	case <-c.clock.After(d):
		return true
	}
}

// retryBackoff is the waits between the retries of one failing thing (a session, a record, a
// dead letter): retryMin doubling up to retryMax.
func retryBackoff() wait.Backoff {
	return wait.Backoff{Duration: retryMin, Factor: 2, Steps: math.MaxInt32, Cap: retryMax}
}
