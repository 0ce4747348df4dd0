// Package migrations holds the database schema of seqinbox as ordered SQL files embedded in the
// binary, and the runner that applies them (docs/design.md#migrations): each file once, in its own
// transaction together with its ledger row, serialized across migrators by a transaction-level
// PostgreSQL advisory lock, so that it works behind a pooler in transaction mode.
package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// AdvisoryLockKey is the transaction-level advisory lock key (pg_advisory_xact_lock(bigint)) that
// serializes migrators on one database: the ASCII bytes of "seqinbox" read as a big-endian int64.
// Other advisory locks of seqinbox (e.g. housekeeping) must use different keys.
const AdvisoryLockKey int64 = 0x736571696e626f78

// LedgerTable is the table that records which migrations a database has.
const LedgerTable = "seqinbox_schema_migrations"

//go:embed *.sql
var files embed.FS

// fileName is the shape of a migration file: a four-digit version, an underscore, a name.
var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

// Migration is one embedded SQL file.
type Migration struct {
	// Version is the file's number; versions start at 1 and have no gaps.
	Version int
	// Name is the file name, e.g. "0002_claims.sql", used in messages and the ledger.
	Name string
	// Checksum is the hex SHA-256 of the file, recorded in the ledger to detect edited files.
	Checksum string
	// SQL is the file's content.
	SQL string
}

// embedded is the parsed, ordered list of the embedded files; it is computed once and never
// changes, like the files themselves.
var embedded = mustLoad(files)

func mustLoad(fsys fs.FS) []Migration {
	ms, err := load(fsys)
	if err != nil {
		panic(err)
	}
	return ms
}

// load reads and checks the migration files: names match fileName and versions run 1..N.
func load(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	slices.Sort(names)
	ms := make([]Migration, 0, len(names))
	for i, name := range names {
		m := fileName.FindStringSubmatch(path.Base(name))
		if m == nil {
			return nil, fmt.Errorf("migration file %s: name must look like 0001_name.sql", name)
		}
		v, _ := strconv.Atoi(m[1])
		if v != i+1 {
			return nil, fmt.Errorf("migration file %s: version %d, expected %d (versions start at 1 without gaps)", name, v, i+1)
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		sum := sha256.Sum256(body)
		ms = append(ms, Migration{Version: v, Name: name, Checksum: hex.EncodeToString(sum[:]), SQL: string(body)})
	}
	return ms, nil
}

// All returns the embedded migrations in version order.
func All() []Migration {
	return slices.Clone(embedded)
}

// Latest returns the schema version this binary brings, the version a consumer of this build
// needs.
func Latest() int {
	return len(embedded)
}

// Result says what one Apply call did.
type Result struct {
	// Before is the schema version found when the migrator first got the lock.
	Before int
	// After is the schema version when the migrator last released the lock.
	After int
	// Applied lists the versions this call applied, in order; empty when the schema was current.
	Applied []int
}

// Status is the schema state of a database as compared with this binary's migrations.
type Status struct {
	// Version is the highest applied version (0 for an empty database).
	Version int
	// Pending lists the versions this binary would apply, in order.
	Pending []int
}

// Querier runs queries; *pgx.Conn, *pgxpool.Conn, *pgxpool.Pool and pgx.Tx satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Executor runs statements too; *pgx.Conn, *pgxpool.Conn, *pgxpool.Pool and pgx.Tx satisfy it.
type Executor interface {
	Querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Apply brings the database behind pool to the latest schema on one of its connections.
// Concurrent callers serialize; each file is applied exactly once.
func Apply(ctx context.Context, pool *pgxpool.Pool) (Result, error) {
	return ApplyUpTo(ctx, pool, Latest())
}

// ApplyUpTo applies the migrations up to and including version and no further. It is the way
// tests build the schema of an older release (e.g. ApplyUpTo(ctx, pool, 1) for a database from
// before the claim table) before upgrading it with Apply.
func ApplyUpTo(ctx context.Context, pool *pgxpool.Pool, version int) (Result, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("migrate: acquire connection: %w", err)
	}
	defer conn.Release()
	return applyOn(ctx, conn.Conn(), embedded, version, ownerClaim{})
}

// ApplyConn is Apply on a single connection, for callers that hold no pool.
func ApplyConn(ctx context.Context, conn *pgx.Conn) (Result, error) {
	return applyOn(ctx, conn, embedded, Latest(), ownerClaim{})
}

// ApplyFor is ApplyConn for one inbox (namespace/name), under the same advisory lock: it refuses
// tables that another inbox owns (*OwnedError) before it applies anything, and records inbox as
// their owner afterwards. takeOverFrom, when set, names the inbox whose tables inbox takes over.
func ApplyFor(ctx context.Context, conn *pgx.Conn, inbox, takeOverFrom string) (Result, error) {
	if inbox == "" {
		return Result{}, errors.New("migrate: no inbox named to own the tables")
	}
	return applyOn(ctx, conn, embedded, Latest(), ownerClaim{inbox: inbox, from: takeOverFrom})
}

// ownerClaim is the inbox a migration runs for (none when inbox is empty), and the inbox it
// takes the tables over from.
type ownerClaim struct {
	inbox, from string
}

// refuse returns the *OwnedError of tables owned by neither the inbox nor the one it takes over from.
func (c ownerClaim) refuse(ctx context.Context, db Querier) error {
	if c.inbox == "" {
		return nil
	}
	owner, claimedAt, found, err := Owner(ctx, db)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if found && owner != c.inbox && (c.from == "" || owner != c.from) {
		return &OwnedError{Inbox: c.inbox, Owner: owner, ClaimedAt: claimedAt}
	}
	return nil
}

// record makes the inbox the owner of the tables.
func (c ownerClaim) record(ctx context.Context, db Executor) error {
	switch {
	case c.inbox == "":
		return nil
	case c.from != "":
		return TakeOver(ctx, db, c.from, c.inbox)
	default:
		return ClaimOwner(ctx, db, c.inbox)
	}
}

// applyOn checks the ledger against ms and applies the pending migrations up to target, each in
// its own transaction that first takes the migrators' transaction-level advisory lock and reads
// the ledger again under it. No lock outlives its transaction, so a migrator behind a pooler in
// transaction mode, whose statements may run on any server connection, serializes all the same
// and can leak no lock.
func applyOn(ctx context.Context, conn *pgx.Conn, ms []Migration, target int, claim ownerClaim) (Result, error) {
	if target < 0 || target > len(ms) {
		return Result{}, fmt.Errorf("migrate: no schema version %d in this binary (latest is %d)", target, len(ms))
	}
	var res Result
	for first := true; ; first = false {
		applied, done := 0, false
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			st, err := lockAndInspect(ctx, tx, ms)
			if err != nil {
				return err
			}
			if first {
				res.Before = st.Version
			}
			res.After = st.Version
			if err := claim.refuse(ctx, tx); err != nil {
				return err
			}
			if len(st.Pending) == 0 || st.Pending[0] > target {
				done = true
				if err := claim.record(ctx, tx); err != nil {
					return fmt.Errorf("migrate: %w", err)
				}
				return nil
			}
			m := ms[st.Pending[0]-1]
			if err := applyOne(ctx, tx, m); err != nil {
				return err
			}
			applied = m.Version
			return nil
		})
		if err != nil {
			return res, err
		}
		if done {
			return res, nil
		}
		res.Applied = append(res.Applied, applied)
		res.After = applied
	}
}

// lockMigratorsSQL serializes migrators until the end of the calling transaction.
const lockMigratorsSQL = `SELECT pg_advisory_xact_lock($1)`

// lockAndInspect takes the migrators' lock in tx, creates the ledger if there is none, and reads
// it: what it returns stays true until tx ends.
func lockAndInspect(ctx context.Context, tx pgx.Tx, ms []Migration) (Status, error) {
	if _, err := tx.Exec(ctx, lockMigratorsSQL, AdvisoryLockKey); err != nil {
		return Status{}, fmt.Errorf("migrate: take advisory lock %d: %w", AdvisoryLockKey, err)
	}
	if _, err := tx.Exec(ctx, createLedger); err != nil {
		return Status{}, fmt.Errorf("migrate: create %s: %w", LedgerTable, err)
	}
	return inspect(ctx, tx, ms)
}

// createLedger runs under the advisory lock, so concurrent migrators never race on it.
const createLedger = `CREATE TABLE IF NOT EXISTS ` + LedgerTable + ` (
  version integer PRIMARY KEY,
  name text NOT NULL,
  checksum text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
)`

// applyOne runs one file and records it in the ledger, in tx: either both happen or neither does.
func applyOne(ctx context.Context, tx pgx.Tx, m Migration) error {
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return fmt.Errorf("migrate: apply %s: %w", m.Name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+LedgerTable+` (version, name, checksum) VALUES ($1, $2, $3)`,
		m.Version, m.Name, m.Checksum); err != nil {
		return fmt.Errorf("migrate: record %s in %s: %w", m.Name, LedgerTable, err)
	}
	return nil
}

// ErrSchemaNewer marks the error of a database whose ledger records a version this binary does
// not know: the database was migrated by a newer release.
var ErrSchemaNewer = errors.New("database schema is newer than this binary")

// ErrLedgerMismatch marks the error of a ledger that does not match the embedded files: an
// applied file was edited, or the ledger was.
var ErrLedgerMismatch = errors.New("schema ledger does not match the migration files")

// ledgerRow is one row of the ledger table.
type ledgerRow struct {
	Version  int
	Name     string
	Checksum string
}

// Inspect compares the database's ledger with this binary's migrations without changing
// anything: it returns the current version and the pending ones, or an error when the ledger
// records an edited file or a version this binary does not know.
func Inspect(ctx context.Context, db Querier) (Status, error) {
	return inspect(ctx, db, embedded)
}

func inspect(ctx context.Context, db Querier, ms []Migration) (Status, error) {
	rows, err := readLedger(ctx, db)
	if err != nil {
		return Status{}, err
	}
	if err := verify(rows, ms); err != nil {
		return Status{}, err
	}
	st := Status{Version: len(rows)}
	for _, m := range ms[len(rows):] {
		st.Pending = append(st.Pending, m.Version)
	}
	return st, nil
}

// verify checks that the ledger is a prefix of ms: versions 1..n without gaps, each with the name
// and checksum of the embedded file.
func verify(rows []ledgerRow, ms []Migration) error {
	for i, r := range rows {
		if r.Version > len(ms) {
			return fmt.Errorf("%w: database schema version %d (%s) is newer than this binary, which knows versions up to %d; "+
				"run a seqinbox release that ships %s or newer (downgrading the schema is not supported)",
				ErrSchemaNewer, r.Version, r.Name, len(ms), r.Name)
		}
		if r.Version != i+1 {
			return fmt.Errorf("%w: %s has version %d but not version %d, so it was edited by hand; "+
				"restore it from the migration files before migrating", ErrLedgerMismatch, LedgerTable, r.Version, i+1)
		}
		m := ms[i]
		if r.Name != m.Name {
			return fmt.Errorf("%w: version %d was applied as %s, but this binary's file is %s; "+
				"applied migration files must never be renamed: restore the original name", ErrLedgerMismatch, r.Version, r.Name, m.Name)
		}
		if r.Checksum != m.Checksum {
			return fmt.Errorf("%w: migration %s was applied with checksum %s, but this binary's file has checksum %s; "+
				"applied migration files must never change: restore the original file and put the change in a new migration",
				ErrLedgerMismatch, m.Name, r.Checksum, m.Checksum)
		}
	}
	return nil
}

// readLedger returns the ledger rows in version order; a database without a ledger has none.
func readLedger(ctx context.Context, db Querier) ([]ledgerRow, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, LedgerTable).Scan(&exists); err != nil {
		return nil, fmt.Errorf("read schema ledger: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := db.Query(ctx, `SELECT version, name, checksum FROM `+LedgerTable+` ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("read schema ledger: %w", err)
	}
	ledger, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ledgerRow])
	if err != nil {
		return nil, fmt.Errorf("read schema ledger: %w", err)
	}
	return ledger, nil
}

// Current returns the highest schema version recorded in the database's ledger, 0 for a database
// that was never migrated. It does not verify the ledger; Inspect does.
func Current(ctx context.Context, db Querier) (int, error) {
	rows, err := readLedger(ctx, db)
	if err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, nil
	}
	return rows[len(rows)-1].Version, nil
}
