package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A stateConn is the connection of a holder's state writes, which commit before its holding
// transaction (lease.go). Directly connected, the pool connection is a server session of its own,
// ready for a write at any time. Behind a connection pooler in transaction mode (PgBouncer,
// CloudNativePG's Pooler) a client connection gets a server connection only for the duration of a
// transaction, and a write after a listener call would wait for one, maybe beyond the lease:
// the outcome would be lost and the message delivered again. There the state connection is held
// (hold): an empty transaction is opened on it before a listener call, so that the write after the
// call needs no server connection of the pooler; the write commits that transaction.
type stateConn struct {
	conn *pgxpool.Conn
	// held is set behind a pooler: listener calls need the connection held first.
	held bool
	// open is set while the held transaction is open and not yet committed by a write.
	open bool
	// gate limits the holders that wait for or hold a second server connection at once.
	gate *holdGate
}

// holdTimeout bounds the wait for the pooler's server connection that holds the state connection.
// A holder that waits longer gives its claims or lock up without a listener call and is tried
// again: with every server connection taken by holders that each wait for a second one, nothing
// else would end the wait.
const holdTimeout = time.Second

// errPoolerSaturated reports a held state connection that the pooler gave no server connection
// within holdTimeout; no listener call was made, the record is tried again.
var errPoolerSaturated = errors.New("the connection pooler gave no server connection for the state write in time; the record is tried again: give the pooler more server connections (two per record in flight, docs/poolers.md)")

// hold opens the held transaction before a listener call under l when the connection is held and
// it is not open yet. Its wait is bounded by holdTimeout; as a wait inside the lease, it requires
// a proof of l's transaction before the call (lease.prove).
func (s *stateConn) hold(ctx context.Context, l *lease) error {
	if !s.held || s.open {
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, holdTimeout)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue(beginReadCommittedSQL)
	b.Queue(setIdleTimeoutSQL, millis(l.length))
	err := s.conn.SendBatch(hctx, b).Close()
	l.waited()
	if err != nil {
		if ctx.Err() == nil && hctx.Err() != nil {
			s.gate.narrow()
			return errPoolerSaturated
		}
		return fmt.Errorf("hold state connection: %w", err)
	}
	s.gate.widen()
	s.open = true
	return nil
}

// exec runs one state-writing statement in a transaction of its own: the held one, committed in
// the same round trip, or an implicit one.
func (s *stateConn) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if !s.open {
		return s.conn.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	err := s.commitWith(ctx, func(b *pgx.Batch) {
		b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	})
	return tag, err
}

// queryRow runs one state-writing statement that returns one row into dest, in a transaction of
// its own as exec does.
func (s *stateConn) queryRow(ctx context.Context, dest []any, sql string, args ...any) error {
	if !s.open {
		return s.conn.QueryRow(ctx, sql, args...).Scan(dest...)
	}
	return s.commitWith(ctx, func(b *pgx.Batch) {
		b.Queue(sql, args...).QueryRow(func(r pgx.Row) error { return r.Scan(dest...) })
	})
}

// commitWith sends the statements that queue adds and COMMIT on the held transaction in one round
// trip; a COMMIT that answers ROLLBACK (a statement failed) is an error.
func (s *stateConn) commitWith(ctx context.Context, queue func(*pgx.Batch)) error {
	s.open = false
	b := &pgx.Batch{}
	queue(b)
	b.Queue(commitSQL).Exec(func(t pgconn.CommandTag) error {
		if t.String() != commitSQL {
			return fmt.Errorf("commit: transaction was rolled back (%s)", t)
		}
		return nil
	})
	return s.conn.SendBatch(ctx, b).Close()
}

// inTx runs fn's statements in one transaction that commits when fn returns nil and rolls back
// otherwise: the held one when it is open, else a new one.
func (s *stateConn) inTx(ctx context.Context, fn func(q execer) error) error {
	if !s.open {
		return pgx.BeginTxFunc(ctx, s.conn, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error { return fn(tx) })
	}
	s.open = false
	if err := fn(s.conn); err != nil {
		endQuietly(s.conn, rollbackSQL)
		return err
	}
	tag, err := s.conn.Exec(ctx, commitSQL)
	if err == nil && tag.String() != commitSQL {
		err = fmt.Errorf("transaction was rolled back (%s)", tag)
	}
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// execer is what inTx's statements run on: a transaction or the held connection.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// release ends a held transaction that no write committed (its holder ended before a write),
// returns the connection to the pool and lets the next holder through the gate.
func (s *stateConn) release() {
	if s.open {
		s.open = false
		endQuietly(s.conn, rollbackSQL)
	}
	s.conn.Release()
	s.gate.leave()
}
