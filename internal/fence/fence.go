// Package fence is the engine side of the version fence (docs/design.md#the-version-fence): before
// and while a consumer processes, it checks that the database schema is the one this build needs
// and that no live consumer of the same group speaks another claim protocol. Consumers register in
// the consumer_registry table and heartbeat there; a consumer is live while its heartbeat is
// younger than the liveness window.
//
// Heartbeat timestamps come from the database server's clock (now()), and liveness is judged by
// the same clock, so clock skew between consumer hosts never makes a consumer look live or dead.
// The injected Clock only paces the loop and measures how long this consumer's own heartbeats
// have been failing.
//
// The refusal is symmetric: both sides of a conflict report not ready, because a consumer that
// registers and then checks is only guaranteed to see the consumers that registered before it,
// not the reverse. The operator's rollout gate keeps versions from overlapping; the fence makes
// an overlap safe, not productive.
package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/utils/clock"

	"github.com/seqinbox/seqinbox/migrations"
)

// Defaults of Config.
const (
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultLivenessWindow    = 30 * time.Second
)

// staleRowRetention is how long a registry row whose heartbeat stopped is kept (ignored) before
// Register deletes it; the rows only help a person see which consumers ran recently.
const staleRowRetention = time.Hour

// ErrSchemaOlder marks the error of a database whose schema is older than this build needs.
var ErrSchemaOlder = errors.New("database schema is older than this consumer needs")

// CheckSchema returns the database's schema version, or an error when it is not exactly the
// version this build needs: older (ErrSchemaOlder, run `seqinbox migrate`), newer than the build
// knows (migrations.ErrSchemaNewer), or with an edited ledger (migrations.ErrLedgerMismatch).
func CheckSchema(ctx context.Context, db migrations.Querier) (int, error) {
	st, err := migrations.Inspect(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("check schema: %w", err)
	}
	if len(st.Pending) > 0 {
		return st.Version, fmt.Errorf("%w: database schema version %d is older than version %d this consumer needs; run `seqinbox migrate`",
			ErrSchemaOlder, st.Version, migrations.Latest())
	}
	return st.Version, nil
}

// Identity is who a consumer is, as the registry records it.
type Identity struct {
	// InstanceID is unique per running consumer (in Kubernetes the pod name).
	InstanceID string
	// ConsumerGroup is the Kafka consumer group; only consumers of one group can conflict.
	ConsumerGroup string
	// EngineVersion is the release of the consumer binary, for people and the operator.
	EngineVersion string
	// ClaimProtocol is inbox.ClaimProtocol of the consumer binary; it decides conflicts.
	ClaimProtocol string
	// Inbox (namespace/name) is the SequentialInbox the consumer serves: the fence claims unowned
	// tables for it and refuses tables another inbox owns (migrations.ClaimOwner). Empty only
	// for tools that serve no inbox.
	Inbox string
	// Schema is spec.database.schema: the fence is not ready while the connection resolves
	// tables to another schema (migrations.CheckSchemaName). Empty: not checked.
	Schema string
}

// Consumer is one row of the consumer registry.
type Consumer struct {
	Identity
	// StartedAt is when the consumer registered, by the database clock.
	StartedAt time.Time
	// HeartbeatAt is the consumer's last heartbeat, by the database clock.
	HeartbeatAt time.Time
	// Blocked is the record the consumer retried longest at its last heartbeat; nil when none.
	Blocked *Blocked
}

// Blocked is a record a consumer retries after infrastructure errors, as its heartbeat writes it
// to the registry: the operator reads it for the inbox's Degraded condition.
type Blocked struct {
	Topic     string
	Partition int32
	Offset    int64
	// Since is the record's first failed attempt (by the database clock once read from the registry).
	Since time.Time
	// Error is the last attempt's error.
	Error string
}

// String names the consumer for a person: instance, group, protocol and version.
func (c Consumer) String() string {
	return fmt.Sprintf("%s (group %s, claim protocol %s, engine %s)", c.InstanceID, c.ConsumerGroup, c.ClaimProtocol, c.EngineVersion)
}

// Config tunes a Fence; zero fields take the defaults.
type Config struct {
	// Clock paces heartbeats; tests drive a fake one instead of sleeping. Default the real clock.
	Clock clock.Clock
	// HeartbeatInterval is how often the fence heartbeats and re-checks; default 10s.
	HeartbeatInterval time.Duration
	// LivenessWindow is how old a heartbeat may be for its consumer to count as live; default 30s.
	// It must exceed HeartbeatInterval. All consumers of a group must use the same window.
	LivenessWindow time.Duration
	// Log receives heartbeat failures and readiness changes; default discards.
	Log logr.Logger
	// Blocked, when set, tells every heartbeat the consumer's record retried longest (nil: none),
	// which it writes to the registry row.
	Blocked func() *Blocked
}

// Fence registers one consumer, keeps its heartbeat and decides whether it may process.
type Fence struct {
	pool     *pgxpool.Pool
	id       Identity
	clock    clock.Clock
	interval time.Duration
	window   time.Duration
	log      logr.Logger
	blocked  func() *Blocked
}

// New returns the fence of the consumer id on the database behind pool.
func New(pool *pgxpool.Pool, id Identity, cfg Config) (*Fence, error) {
	if id.InstanceID == "" || id.ConsumerGroup == "" || id.ClaimProtocol == "" || id.EngineVersion == "" {
		return nil, fmt.Errorf("fence: identity %+v: instance ID, consumer group, engine version and claim protocol are required", id)
	}
	f := &Fence{pool: pool, id: id, clock: cfg.Clock, interval: cfg.HeartbeatInterval, window: cfg.LivenessWindow, log: cfg.Log, blocked: cfg.Blocked}
	if f.clock == nil {
		f.clock = clock.RealClock{}
	}
	if f.interval == 0 {
		f.interval = DefaultHeartbeatInterval
	}
	if f.window == 0 {
		f.window = DefaultLivenessWindow
	}
	if f.log.GetSink() == nil {
		f.log = logr.Discard()
	}
	if f.interval < 0 {
		return nil, fmt.Errorf("fence: heartbeat interval %s must be positive", f.interval)
	}
	if f.window <= f.interval {
		return nil, fmt.Errorf("fence: liveness window %s must exceed the heartbeat interval %s", f.window, f.interval)
	}
	return f, nil
}

// registerSQL inserts or refreshes this consumer's row; a restarted consumer with the same
// instance ID starts anew. It also deletes rows that stopped heartbeating long ago.
const registerSQL = `
WITH cleaned AS (
  DELETE FROM consumer_registry WHERE heartbeat_at < now() - $5 * interval '1 microsecond'
)
INSERT INTO consumer_registry (instance_id, consumer_group, engine_version, claim_protocol, started_at, heartbeat_at)
VALUES ($1, $2, $3, $4, now(), now())
ON CONFLICT (instance_id) DO UPDATE SET
  consumer_group = excluded.consumer_group, engine_version = excluded.engine_version,
  claim_protocol = excluded.claim_protocol, started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
  blocked_topic = NULL, blocked_partition = NULL, blocked_offset = NULL, blocked_since = NULL, blocked_error = NULL`

// Register records this consumer as live. It commits before it returns, which is what makes the
// fence safe: of two consumers that register and then call Conflicts, the later one always sees
// the earlier one.
func (f *Fence) Register(ctx context.Context) error {
	_, err := f.pool.Exec(ctx, registerSQL, f.id.InstanceID, f.id.ConsumerGroup, f.id.EngineVersion, f.id.ClaimProtocol,
		staleRowRetention.Microseconds())
	if err != nil {
		return fmt.Errorf("register consumer %s: %w", f.id.InstanceID, err)
	}
	return nil
}

// heartbeatSQL refreshes this consumer's heartbeat and its blocked record (all NULL when none;
// the record's age $6 in microseconds makes its start a time of the database clock); 0 rows means
// its row is gone.
const heartbeatSQL = `
UPDATE consumer_registry SET heartbeat_at = now(),
  blocked_topic = $2, blocked_partition = $3, blocked_offset = $4, blocked_error = $5,
  blocked_since = now() - $6 * interval '1 microsecond'
WHERE instance_id = $1`

// Heartbeat refreshes this consumer's heartbeat and blocked record, registering it again if its
// row was deleted.
func (f *Fence) Heartbeat(ctx context.Context) error {
	var b *Blocked
	if f.blocked != nil {
		b = f.blocked()
	}
	var (
		topic, message   *string
		partition        *int32
		offset, ageMicro *int64
	)
	if b != nil {
		age := max(f.clock.Now().Sub(b.Since), 0).Microseconds()
		topic, partition, offset, message, ageMicro = &b.Topic, &b.Partition, &b.Offset, &b.Error, &age
	}
	tag, err := f.pool.Exec(ctx, heartbeatSQL, f.id.InstanceID, topic, partition, offset, message, ageMicro)
	if err != nil {
		return fmt.Errorf("heartbeat consumer %s: %w", f.id.InstanceID, err)
	}
	if tag.RowsAffected() == 0 {
		return f.Register(ctx)
	}
	return nil
}

// Deregister deletes this consumer's row, so that others need not wait out its liveness window.
func (f *Fence) Deregister(ctx context.Context) error {
	if _, err := f.pool.Exec(ctx, `DELETE FROM consumer_registry WHERE instance_id = $1`, f.id.InstanceID); err != nil {
		return fmt.Errorf("deregister consumer %s: %w", f.id.InstanceID, err)
	}
	return nil
}

// conflictsSQL finds the live consumers of a group that speak another claim protocol.
const conflictsSQL = `
SELECT instance_id, consumer_group, engine_version, claim_protocol, started_at, heartbeat_at
FROM consumer_registry
WHERE consumer_group = $1 AND claim_protocol <> $2 AND instance_id <> $3
  AND heartbeat_at > now() - $4 * interval '1 microsecond'
ORDER BY instance_id`

// Conflicts returns the live consumers of this consumer's group with a different claim protocol;
// this consumer must not process while there are any.
func (f *Fence) Conflicts(ctx context.Context) ([]Consumer, error) {
	rows, err := f.pool.Query(ctx, conflictsSQL, f.id.ConsumerGroup, f.id.ClaimProtocol, f.id.InstanceID, f.window.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("find conflicting consumers of group %s: %w", f.id.ConsumerGroup, err)
	}
	cs, err := pgx.CollectRows(rows, scanConsumer)
	if err != nil {
		return nil, fmt.Errorf("find conflicting consumers of group %s: %w", f.id.ConsumerGroup, err)
	}
	return cs, nil
}

// liveSQL lists every live consumer with its blocked record; liveSQLBeforeBlocked is the same
// for a schema that predates the blocked record's columns (a dry run before the migration).
const (
	liveSQL = `
SELECT instance_id, consumer_group, engine_version, claim_protocol, started_at, heartbeat_at,
  blocked_topic, blocked_partition, blocked_offset, blocked_since, blocked_error
FROM consumer_registry
WHERE heartbeat_at > now() - $1 * interval '1 microsecond'
ORDER BY consumer_group, instance_id`
	liveSQLBeforeBlocked = `
SELECT instance_id, consumer_group, engine_version, claim_protocol, started_at, heartbeat_at,
  NULL, NULL::integer, NULL::bigint, NULL::timestamptz, NULL
FROM consumer_registry
WHERE heartbeat_at > now() - $1 * interval '1 microsecond'
ORDER BY consumer_group, instance_id`
)

// LiveConsumers returns the consumers of every group whose heartbeat is younger than liveWithin,
// ordered by group and instance, with their blocked records; the migrate command reports them. A
// database whose schema predates the registry has none, one that predates the blocked records
// lists none. Do not call it inside a transaction: missing tables and columns are detected by
// their errors.
func LiveConsumers(ctx context.Context, db migrations.Querier, liveWithin time.Duration) ([]Consumer, error) {
	cs, err := queryLive(ctx, db, liveSQL, liveWithin)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedColumn {
		cs, err = queryLive(ctx, db, liveSQLBeforeBlocked, liveWithin)
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedTable {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list live consumers: %w", err)
	}
	return cs, nil
}

func queryLive(ctx context.Context, db migrations.Querier, query string, liveWithin time.Duration) ([]Consumer, error) {
	rows, err := db.Query(ctx, query, liveWithin.Microseconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Consumer, error) {
		var c Consumer
		var b struct {
			topic, message *string
			partition      *int32
			offset         *int64
			since          *time.Time
		}
		err := row.Scan(&c.InstanceID, &c.ConsumerGroup, &c.EngineVersion, &c.ClaimProtocol, &c.StartedAt, &c.HeartbeatAt,
			&b.topic, &b.partition, &b.offset, &b.since, &b.message)
		if err == nil && b.topic != nil && b.partition != nil && b.offset != nil && b.since != nil && b.message != nil {
			c.Blocked = &Blocked{Topic: *b.topic, Partition: *b.partition, Offset: *b.offset, Since: *b.since, Error: *b.message}
		}
		return c, err
	})
}

// PostgreSQL's undefined_table and undefined_column error codes.
const (
	sqlstateUndefinedTable  = "42P01"
	sqlstateUndefinedColumn = "42703"
)

func scanConsumer(row pgx.CollectableRow) (Consumer, error) {
	var c Consumer
	err := row.Scan(&c.InstanceID, &c.ConsumerGroup, &c.EngineVersion, &c.ClaimProtocol, &c.StartedAt, &c.HeartbeatAt)
	return c, err
}

// Run registers the consumer, then every heartbeat interval heartbeats and re-checks the schema
// and the conflicts, calling onChange whenever readiness or its reason changes (and once at the
// start). The consumer may process only while the last call said ready. Run returns when ctx ends,
// after reporting not ready and deregistering.
//
// The consumer turns not ready when its own heartbeats have failed for LivenessWindow minus
// HeartbeatInterval, before other consumers can take it for gone.
func (f *Fence) Run(ctx context.Context, onChange func(ready bool, reason string)) error {
	var lastReady *bool
	var lastReason string
	report := func(ready bool, reason string) {
		if lastReady != nil && *lastReady == ready && lastReason == reason {
			return
		}
		lastReady, lastReason = &ready, reason
		f.log.Info("version fence readiness changed", "ready", ready, "reason", reason)
		onChange(ready, reason)
	}
	// lastBeat is when the last successful heartbeat (the first: the registration) was sent; a
	// consumer that never registered has no row to delete when it stops.
	var lastBeat time.Time
	defer func() {
		report(false, "consumer is stopping")
		if lastBeat.IsZero() {
			return
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.interval)
		defer cancel()
		if err := f.Deregister(dctx); err != nil {
			f.log.Error(err, "deregister failed; other consumers wait out the liveness window")
		}
	}()

	for {
		// Every statement of a pass, and its wait for a connection, ends within the interval.
		cctx, cancel := context.WithTimeout(ctx, f.interval)
		ready, reason, unsure := f.check(cctx, &lastBeat)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		// A pass that could not read the database (a slow or lost connection) proves nothing new:
		// a ready consumer stays ready while its heartbeats are inside the liveness window, as it
		// does when a heartbeat fails, so that one slow query does not make it leave the group.
		if unsure && lastReady != nil && *lastReady && f.clock.Now().Sub(lastBeat) < f.window-f.interval {
			f.log.Info("fence pass could not read the database; readiness kept within the liveness window", "error", reason)
		} else {
			report(ready, reason)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-f.clock.After(f.interval):
		}
	}
}

// check is one pass of Run: schema, heartbeat, conflicts. lastBeat is when the last successful
// heartbeat was sent, by the injected clock. unsure is true when the pass is not ready only because
// a read failed, not because of what it read.
func (f *Fence) check(ctx context.Context, lastBeat *time.Time) (ready bool, reason string, unsure bool) {
	if err := migrations.CheckSchemaName(ctx, f.pool, f.id.Schema); err != nil {
		return false, err.Error(), !errors.Is(err, migrations.ErrWrongSchema)
	}
	if _, err := CheckSchema(ctx, f.pool); err != nil {
		return false, err.Error(), !errors.Is(err, ErrSchemaOlder)
	}
	if f.id.Inbox != "" {
		if err := migrations.ClaimOwner(ctx, f.pool, f.id.Inbox); err != nil {
			return false, err.Error(), !errors.Is(err, migrations.ErrOwnedByAnotherInbox)
		}
	}
	sent := f.clock.Now()
	var err error
	if lastBeat.IsZero() {
		err = f.Register(ctx)
	} else {
		err = f.Heartbeat(ctx)
	}
	if err == nil {
		*lastBeat = sent
	} else {
		f.log.Error(err, "heartbeat failed")
	}
	if lastBeat.IsZero() {
		return false, fmt.Sprintf("cannot register in the consumer registry: %v", err), false
	}
	if silent := f.clock.Now().Sub(*lastBeat); silent >= f.window-f.interval {
		return false, fmt.Sprintf("no successful heartbeat for %s (last error: %v); other consumers may soon take this one for gone",
			silent.Round(time.Second), err), false
	}
	conflicts, err := f.Conflicts(ctx)
	if err != nil {
		return false, err.Error(), true
	}
	if len(conflicts) > 0 {
		names := make([]string, len(conflicts))
		for i, c := range conflicts {
			names[i] = c.String()
		}
		return false, fmt.Sprintf("waiting for live consumers of another claim protocol to stop: %s; this consumer speaks %s",
			strings.Join(names, ", "), f.id.ClaimProtocol), false
	}
	return true, "", false
}
