package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/internal/dbconn"
	"github.com/seqinbox/seqinbox/internal/sequence"
)

// Listener receives released messages; in production it is the HTTP sink. It must honour the
// context: the engine cancels it at Config.ListenerDeadline.
type Listener interface {
	Deliver(ctx context.Context, m Message) error
}

// Message is what the listener receives: the record, replayed byte for byte for buffered
// messages, and where it belongs.
type Message struct {
	Sequence, ContextID, QualifiedType string
	Record                             Record
}

// DeadLetterer takes messages that the engine gives up on outside of a record's own processing
// (housekeeping deleting WAITING messages, failed operator actions).
type DeadLetterer interface {
	DeadLetter(ctx context.Context, m Message, reason string) error
}

// Config tunes the engine.
type Config struct {
	// ListenerDeadline bounds one listener call including the sink's own retries. T1's
	// idle_in_transaction_session_timeout is this plus LeaseMargin, so that a claim never expires
	// while its listener call may still run.
	ListenerDeadline time.Duration
	// LeaseMargin is added to ListenerDeadline for the idle timeouts of T1 and T2; it covers the
	// state write after the listener returned and the network between engine and server.
	// Zero: 5s.
	LeaseMargin time.Duration
	// IdleLockTimeout is T2's idle_in_transaction_session_timeout: how long a consumer that hangs
	// may keep an instance locked. It is raised to ListenerDeadline plus LeaseMargin when lower,
	// because T2 calls the listener while it holds the lock, and a lock that expired during a
	// listener call would let another consumer release the same message at the same time.
	IdleLockTimeout time.Duration
	// SequencingStartTime starts sequencing; before it the engine is in recording mode (every
	// message delivered at once and stored PROCESSED). Zero: sequencing is active.
	SequencingStartTime time.Time
	// Maintenance is the pool of housekeeping, operator actions and the metrics' database reads:
	// small and bounded, and apart from the records' pool, so that maintenance never takes a
	// record's connection. Required; MaintenanceConnections is what it needs.
	Maintenance *pgxpool.Pool
	// AcquireTimeout bounds every wait for a maintenance connection, so that an action holding
	// an instance lock never waits for a connection without end. Zero: 10s.
	AcquireTimeout time.Duration
	// ExpiringSoonWindow is how far ahead of its retain_until an open instance counts as
	// "expiring soon" in the metrics. Zero: one hour.
	ExpiringSoonWindow time.Duration
	// Clock is the time source of all time-based decisions (recording mode, retention,
	// housekeeping), injected so that tests control it; nil is the real clock.
	Clock clock.PassiveClock
	// Log receives structured logs; the zero value discards them.
	Log logr.Logger
}

// defaultLeaseMargin is the LeaseMargin of a zero Config.
const defaultLeaseMargin = 5 * time.Second

// defaultAcquireTimeout is the AcquireTimeout of a zero Config.
const defaultAcquireTimeout = 10 * time.Second

// MaintenanceConnections is what Config.Maintenance needs: one for a housekeeping run, two for an
// action run (its instance lock and the state writes that commit before it). Other users of the
// same pool (the consumer's version fence) add theirs.
const MaintenanceConnections = 3

// instanceCacheSize bounds the instance id cache (about 100 bytes an entry).
const instanceCacheSize = 10000

// maxInstanceAttempts bounds the retries when housekeeping deletes an instance between its
// lookup and the claim insert.
const maxInstanceAttempts = 3

// ErrUndeclaredType reports a record whose qualified type no sequence declares; a configuration
// error for that record, which the caller dead-letters.
var ErrUndeclaredType = errors.New("undeclared message type")

// ErrNoIdempotenceID reports a sequenced record without idempotence ID, which cannot be claimed;
// the caller dead-letters it.
var ErrNoIdempotenceID = errors.New("record has no idempotence ID")

// Outcome says what Process did with a record.
type Outcome int

const (
	// Delivered means the claim was won, the listener accepted the message, its state is PROCESSED.
	Delivered Outcome = iota + 1
	// Buffered means the claim was won but the release condition did not hold; the message was
	// stored WAITING. If its predecessor was processed meanwhile, this record's own release
	// delivered it already, and it is in Result.Released.
	Buffered
	// Duplicate means another delivery holds or held the claim, or the message is already WAITING
	// or PROCESSED; the listener was not called.
	Duplicate
	// Bypassed means the record is not sequenced (filter false or empty context ID) and the
	// listener accepted it; no row was written.
	Bypassed
	// Failed means the listener failed. For a sequenced record its state is FAILED and its claim
	// rolled back, so that a resend can retry it; the caller dead-letters the record.
	Failed
)

// String names the outcome for logs.
func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "Delivered"
	case Buffered:
		return "Buffered"
	case Duplicate:
		return "Duplicate"
	case Bypassed:
		return "Bypassed"
	case Failed:
		return "Failed"
	default:
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
}

// Result is what Process did with a record and with the buffered messages its release freed.
type Result struct {
	Outcome Outcome
	// ListenerErr is the listener's error when Outcome is Failed.
	ListenerErr error
	// Released are buffered messages that this record's release transaction delivered.
	Released []Message
	// ReleaseFailures are buffered messages whose release failed: they are FAILED, their claims
	// deleted; the caller dead-letters them.
	ReleaseFailures []Failure
}

// Failure is a buffered message whose delivery failed.
type Failure struct {
	Message Message
	Origin  Origin
	Err     error
}

// Engine is the claim engine of one inbox. It is safe for concurrent use; each concurrent
// Process or ProcessBatch call holds two pool connections.
type Engine struct {
	// pool serves the records (T1, T2, state writes), maint the maintenance (Config.Maintenance).
	pool, maint *pgxpool.Pool
	set         *sequence.Set
	listener    Listener
	cfg         Config
	clock       clock.PassiveClock
	log         logr.Logger
	metrics     *Metrics
	// instances caches instance ids by (sequence, context ID).
	instances *instanceCache
	// claimLease is T1's idle_in_transaction_session_timeout, lockLease T2's.
	claimLease, lockLease time.Duration
	// lead is this engine's part in the housekeeping lease.
	lead housekeepingLead
	// pooler is whether the pools reach PostgreSQL through a connection pooler, decided with the
	// first holder (holdGateOf).
	pooler struct {
		mu      sync.Mutex
		decided atomic.Pointer[poolerDecision]
	}
}

// poolerDecision is what Engine.pooler decided: the gate of the holders behind a pooler, nil when
// directly connected.
type poolerDecision struct{ gate *holdGate }

// New builds an engine. m may be nil when nobody collects metrics.
func New(pool *pgxpool.Pool, set *sequence.Set, l Listener, cfg Config, m *Metrics) (*Engine, error) {
	switch {
	case pool == nil:
		return nil, errors.New("new engine: no database pool")
	case set == nil:
		return nil, errors.New("new engine: no sequence set")
	case l == nil:
		return nil, errors.New("new engine: no listener")
	case cfg.ListenerDeadline <= 0:
		return nil, fmt.Errorf("new engine: listener deadline must be positive, got %s", cfg.ListenerDeadline)
	case cfg.IdleLockTimeout <= 0:
		return nil, fmt.Errorf("new engine: idle lock timeout must be positive, got %s", cfg.IdleLockTimeout)
	case pool.Config().MaxConns < 2:
		return nil, fmt.Errorf("new engine: the pool needs at least 2 connections, has %d", pool.Config().MaxConns)
	case cfg.Maintenance == nil:
		return nil, errors.New("new engine: no maintenance pool")
	case cfg.Maintenance == pool:
		return nil, errors.New("new engine: the maintenance pool must not be the records' pool")
	case cfg.Maintenance.Config().MaxConns < MaintenanceConnections:
		return nil, fmt.Errorf("new engine: the maintenance pool needs at least %d connections, has %d",
			MaintenanceConnections, cfg.Maintenance.Config().MaxConns)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log.IsZero() {
		cfg.Log = logr.Discard()
	}
	if cfg.LeaseMargin <= 0 {
		cfg.LeaseMargin = defaultLeaseMargin
	}
	if cfg.AcquireTimeout <= 0 {
		cfg.AcquireTimeout = defaultAcquireTimeout
	}
	if cfg.ExpiringSoonWindow <= 0 {
		cfg.ExpiringSoonWindow = time.Hour
	}
	if m == nil {
		m = NewMetrics()
	}
	e := &Engine{
		pool: pool, maint: cfg.Maintenance, set: set, listener: l, cfg: cfg, clock: cfg.Clock, log: cfg.Log, metrics: m,
		instances:  newInstanceCache(instanceCacheSize),
		claimLease: cfg.ListenerDeadline + cfg.LeaseMargin,
		lockLease:  max(cfg.IdleLockTimeout, cfg.ListenerDeadline+cfg.LeaseMargin),
	}
	if cfg.IdleLockTimeout < e.lockLease {
		e.log.Info("idle lock timeout raised to the listener deadline plus margin, so that a release lock never expires during a listener call",
			"configured", cfg.IdleLockTimeout, "effective", e.lockLease)
	}
	e.lead.holder = newHolder()
	m.state.bind(cfg.Maintenance, cfg.Clock, cfg.ExpiringSoonWindow, e.lead.holder, e.leading, e.sequenceOf)
	return e, nil
}

// sequenceOf names the sequence of a qualified type, "" when no sequence declares it (any more).
func (e *Engine) sequenceOf(qualified string) string {
	if t, ok := e.set.Lookup(qualified); ok {
		return t.Sequence.Name
	}
	return ""
}

// Process handles one record (docs/design.md#processing-one-record). The error is for
// infrastructure failures only (database unreachable, context cancelled) and for ErrUndeclaredType
// / ErrNoIdempotenceID; after any error the caller must not commit the record's offset. After a nil
// error it may.
func (e *Engine) Process(ctx context.Context, rec Record) (Result, error) {
	qualified := sequence.Qualify(rec.Type, rec.Subtype)
	mt, ok := e.set.Lookup(qualified)
	if !ok {
		return Result{}, fmt.Errorf("process %s/%s: %w", qualified, rec.IdempotenceID, ErrUndeclaredType)
	}
	msg := Message{Sequence: mt.Sequence.Name, ContextID: rec.ContextID, QualifiedType: qualified, Record: rec}
	if !rec.Sequenced || rec.ContextID == "" {
		return e.deliverUnsequenced(ctx, msg)
	}
	if rec.IdempotenceID == "" {
		return Result{}, fmt.Errorf("process %s in %s/%s: %w", qualified, mt.Sequence.Name, rec.ContextID, ErrNoIdempotenceID)
	}

	conn, stateConn, err := e.acquirePair(ctx, e.pool)
	if err != nil {
		return Result{}, fmt.Errorf("claim %s/%s: %w", qualified, rec.IdempotenceID, err)
	}
	defer conn.Release()
	defer stateConn.release()

	var (
		res   Result
		after instanceState
	)
	for attempt := 1; ; attempt++ {
		instanceID, err := e.getOrCreateInstance(ctx, conn, mt.Sequence, rec.ContextID)
		if err != nil {
			return Result{}, err
		}
		res, after, err = e.processUnderProtocol(ctx, conn, stateConn, instanceID, mt, msg)
		if errors.Is(err, errInstanceGone) && attempt < maxInstanceAttempts {
			e.instances.evict(instanceKey{mt.Sequence.Name, rec.ContextID})
			continue
		}
		if err != nil {
			return res, err
		}
		if !after.needsRelease(mt.Sequence) {
			e.metrics.releases.WithLabelValues(releaseSkipped).Inc()
			return res, nil
		}
		e.metrics.releases.WithLabelValues(releaseRun).Inc()
		res.Released, res.ReleaseFailures, err = e.releaseUnderInstanceLock(ctx, conn, stateConn, instanceID, mt.Sequence)
		return res, err
	}
}

// deliverUnsequenced hands a record that is not sequenced straight to the listener
// (docs/design.md#records-that-are-not-sequenced).
func (e *Engine) deliverUnsequenced(ctx context.Context, msg Message) (Result, error) {
	lctx, cancel := context.WithTimeout(ctx, e.cfg.ListenerDeadline)
	defer cancel()
	err := e.invokeListener(lctx, msg)
	switch {
	case ctx.Err() != nil:
		// The caller abandoned the record: not the listener's failure.
		return Result{}, fmt.Errorf("deliver %s/%s unsequenced: %w", msg.QualifiedType, msg.Record.IdempotenceID, ctx.Err())
	case err != nil:
		return Result{Outcome: Failed, ListenerErr: err}, nil
	default:
		return Result{Outcome: Bypassed}, nil
	}
}

// acquirePair takes the two connections of a holding transaction (lease.go) and of the state
// writes that commit before it. Both are taken before the transaction begins, so that no wait
// for a connection lies between its claims or lock and a listener call; behind a connection
// pooler the holder passes the pooler's gate first, and its state connection is held before a
// listener call (stateConn). stateConn.release gives both the gate and the state connection back.
func (e *Engine) acquirePair(ctx context.Context, pool *pgxpool.Pool) (conn *pgxpool.Conn, state *stateConn, err error) {
	gate, err := e.holdGateOf(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	if err := gate.enter(ctx); err != nil {
		return nil, nil, fmt.Errorf("wait for the connection pooler's gate: %w", err)
	}
	if conn, err = pool.Acquire(ctx); err != nil {
		gate.leave()
		return nil, nil, fmt.Errorf("acquire connection: %w", err)
	}
	sc, err := pool.Acquire(ctx)
	if err != nil {
		gate.leave()
		conn.Release()
		return nil, nil, fmt.Errorf("acquire state connection: %w", err)
	}
	return conn, &stateConn{conn: sc, held: gate != nil, gate: gate}, nil
}

// holdGateOf returns the gate of the holders when the pools reach PostgreSQL through a connection
// pooler, nil when they are directly connected; the first call decides with a connection of pool.
func (e *Engine) holdGateOf(ctx context.Context, pool *pgxpool.Pool) (*holdGate, error) {
	if d := e.pooler.decided.Load(); d != nil {
		return d.gate, nil
	}
	e.pooler.mu.Lock()
	defer e.pooler.mu.Unlock()
	if d := e.pooler.decided.Load(); d != nil {
		return d.gate, nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	pooled, err := dbconn.BehindPooler(ctx, conn.Conn())
	if err != nil {
		return nil, err
	}
	d := &poolerDecision{}
	if pooled {
		// Each holder takes two connections of the records' pool; one more for an action run.
		d.gate = newHoldGate(int(e.pool.Config().MaxConns)/2 + 1)
		e.log.Info("a connection pooler answers for PostgreSQL: each record in flight holds a second server connection for its state write during a sink call",
			"recordsInFlight", int(e.pool.Config().MaxConns)/2+1, "serverConnectionsPerRecord", 2)
	}
	e.pooler.decided.Store(d)
	return d.gate, nil
}

// acquire takes a connection from pool within the acquire timeout.
func (e *Engine) acquire(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, e.cfg.AcquireTimeout)
	defer cancel()
	return pool.Acquire(actx)
}

// invokeListener calls the listener and records latency, failures and consumption.
func (e *Engine) invokeListener(ctx context.Context, msg Message) error {
	start := time.Now()
	err := e.listener.Deliver(ctx, msg)
	e.metrics.listenerDuration.WithLabelValues(msg.Sequence, msg.QualifiedType).Observe(time.Since(start).Seconds())
	if err != nil {
		e.metrics.listenerFailures.WithLabelValues(msg.Sequence, msg.QualifiedType).Inc()
		e.log.Info("listener failed", "sequence", msg.Sequence, "context", msg.ContextID,
			"type", msg.QualifiedType, "idempotenceId", msg.Record.IdempotenceID, "error", err.Error())
		return err
	}
	e.metrics.consumed.WithLabelValues(msg.Sequence, msg.QualifiedType).Inc()
	return nil
}

// recording reports whether the engine is in recording mode (docs/design.md#recording-mode).
func (e *Engine) recording() bool {
	return !e.cfg.SequencingStartTime.IsZero() && e.clock.Now().Before(e.cfg.SequencingStartTime)
}

// splitQualified recovers type and subtype of a stored qualified type by the declaration (a type
// may contain dots, a subtype may not; docs/design.md#qualified-types).
func (e *Engine) splitQualified(qualified string) (typ, subtype string) {
	return e.set.Split(qualified)
}

// millis renders a duration as the milliseconds string that PostgreSQL settings take.
func millis(d time.Duration) string {
	return fmt.Sprintf("%d", d.Milliseconds())
}
