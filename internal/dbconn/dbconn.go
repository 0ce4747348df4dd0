// Package dbconn opens the PostgreSQL connections and pools of seqinbox (consumer, migrate, the
// CLI) so that they work behind a connection pooler in transaction mode.
//
// pgx prepares every statement by default and keeps it on the connection (its statement cache).
// Behind a pooler in transaction mode (PgBouncer, CloudNativePG's Pooler) a client connection
// gets another server connection for each transaction, so a statement prepared on one is missing
// on the next, or already exists there under the same name (SQLSTATE 42P05), unless the pooler
// itself tracks prepared statements (PgBouncer 1.21 or newer with max_prepared_statements above 0).
// A pooler announces a process ID of its own at startup, not the one of the backend that runs the
// statements; when the two differ, statements are not prepared (pgx's exec mode: the extended
// protocol with an unnamed statement, in one round trip). The URL parameter
// default_query_exec_mode, when set, decides instead: cache_statement prepares behind a pooler
// that supports it, exec never prepares.
package dbconn

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"sync"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ModeParam is the parameter of a database URL that sets pgx's statement mode
// (cache_statement, cache_describe, describe_exec, exec, simple_protocol).
const ModeParam = "default_query_exec_mode"

// PoolConfig parses a database URL into a pool configuration whose connections prepare
// statements unless they reach PostgreSQL through a pooler, decided with the pool's first
// connection and logged once then; ModeParam in the URL decides instead.
func PoolConfig(connString string, log logr.Logger) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	if modeNamed(connString) {
		return cfg, nil
	}
	var (
		mu      sync.Mutex
		decided bool
		mode    pgx.QueryExecMode
	)
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		mu.Lock()
		defer mu.Unlock()
		if !decided {
			probe, err := pgx.ConnectConfig(ctx, cc.Copy())
			if err != nil {
				return err
			}
			pooled, err := BehindPooler(ctx, probe)
			_ = probe.Close(ctx)
			if err != nil {
				return err
			}
			mode, decided = modeFor(pooled, log), true
		}
		cc.DefaultQueryExecMode = mode
		return nil
	}
	return cfg, nil
}

// Connect opens one connection on a database URL, with the statement mode of PoolConfig. Behind a
// pooler it connects twice: the first connection only tells that a pooler answers.
func Connect(ctx context.Context, connString string, log logr.Logger) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil || modeNamed(connString) {
		return conn, err
	}
	pooled, err := BehindPooler(ctx, conn)
	if err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	if !pooled {
		return conn, nil
	}
	_ = conn.Close(ctx)
	cfg.DefaultQueryExecMode = modeFor(true, log)
	return pgx.ConnectConfig(ctx, cfg)
}

// modeFor returns the statement mode for a connection behind a pooler or not, logging the
// choice of a pooler.
func modeFor(pooled bool, log logr.Logger) pgx.QueryExecMode {
	if !pooled {
		return pgx.QueryExecModeCacheStatement
	}
	log.Info("a connection pooler answers for PostgreSQL: statements are not prepared",
		"queryExecMode", "exec",
		"hint", "if the pooler keeps prepared statements (PgBouncer 1.21 or newer with max_prepared_statements, or session mode), set "+ModeParam+"=cache_statement in the database URL to prepare them")
	return pgx.QueryExecModeExec
}

// BehindPooler reports whether conn reaches PostgreSQL through a pooler: the process ID that the
// startup announced is then the pooler's, not the one of the backend that answers. The query
// prepares nothing. The engine asks it too: behind a pooler it holds server connections itself.
func BehindPooler(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, fmt.Errorf("read the backend process ID: %w", err)
	}
	return pid != conn.PgConn().PID(), nil
}

// keywordMode finds ModeParam in a keyword/value connection string.
var keywordMode = regexp.MustCompile(`(^|\s)` + ModeParam + `\s*=`)

// modeNamed reports whether the connection string sets ModeParam.
func modeNamed(connString string) bool {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		return u.Query().Has(ModeParam)
	}
	return keywordMode.MatchString(connString)
}
