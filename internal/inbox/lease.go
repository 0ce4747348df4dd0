package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A lease is a transaction that holds what lets a listener call run alone: the claims of T1, or
// the release lock of an instance (T2, an action run). The server ends it once it has been idle
// for its length (idle_in_transaction_session_timeout, set inside it), and with it what it holds.
// Every listener call for a claimed or locked message goes through Engine.callUnderLease, which
// keeps one rule for every path (single record, batch, release, actions):
//
//   - The call follows an answer of the holding transaction with no wait and no other listener
//     call in between, so the transaction lived when the call began. No connection is waited
//     for inside a lease: the state connection is taken before the transaction begins. Behind a
//     pooler in transaction mode its server connection is held just before the call
//     (stateConn.hold), a bounded wait. A call after another one or after that wait, with no
//     statement of the transaction since, is preceded by a ping (lease.prove).
//   - The call's deadline is ListenerDeadline after that answer; the lease is at least
//     ListenerDeadline plus LeaseMargin long and restarts with every answer, so the server
//     cannot end the transaction while the call runs. The margin is left for the state write;
//     a claim's state write and T1's commit end with the lease (writeContext).
//
// What stays exposed is the call in flight when the connection is lost: the server rolls the
// transaction back at once, and a waiting duplicate may take over before that call returns.

// errLeaseLost reports a holding transaction that did not answer before a listener call: its
// connection or its server session is gone, and with it what it held. No call was made.
var errLeaseLost = errors.New("the transaction holding the claims or lock is gone")

// lease is a holding transaction on conn, idle for at most length after each answer.
type lease struct {
	conn   *pgxpool.Conn
	length time.Duration
	// answeredAt is when the transaction last answered a statement: it lived then, and its idle
	// time began no later (the margin covers the way of the answer back).
	answeredAt time.Time
	// stale is set by a listener call or a wait after the last answer: the next call needs a
	// proof that the transaction still lives.
	stale bool
}

// answered records an answer of the holding transaction; every statement on conn ends with it.
func (l *lease) answered() {
	l.answeredAt, l.stale = time.Now(), false
}

// waited records a wait after the last answer (stateConn.hold).
func (l *lease) waited() { l.stale = true }

// end is when the server ends the transaction if it stays idle from its last answer on.
func (l *lease) end() time.Time { return l.answeredAt.Add(l.length) }

// writeContext bounds a state write that follows a listener call by the lease: the outcome is
// known and must not be thrown away, so the caller's cancellation is ignored, but a write that
// commits after the lease could record a delivery that someone else has repeated meanwhile.
func (l *lease) writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(ctx), l.end())
}

// prove proves the transaction alive when a listener was called or something waited since its last
// answer: a ping (an empty query, the cheapest round trip; as a message of the session it restarts
// the idle time too) whose answer reports the transaction still open and not failed, for a failed
// one has released its claims and locks already. The ping's own wait is bounded by the lease: a
// transaction that does not answer before it ends holds nothing any more.
func (l *lease) prove(ctx context.Context) error {
	if !l.stale {
		return nil
	}
	pctx, cancel := context.WithDeadline(ctx, l.end())
	defer cancel()
	pg := l.conn.Conn().PgConn()
	err := pg.Ping(pctx)
	if err == nil && pg.TxStatus() != txStatusInTransaction {
		err = fmt.Errorf("transaction status %q after a ping, want %q", pg.TxStatus(), txStatusInTransaction)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %w", errLeaseLost, err)
	}
	l.answered()
	return nil
}

// txStatusInTransaction is the status byte of ReadyForQuery inside an open transaction block
// that has not failed.
const txStatusInTransaction = 'T'

// callUnderLease calls the listener for a message that l holds, under the rule above, with state
// held for the write that follows (stateConn.hold). err is not nil when no call was made
// (errLeaseLost, errPoolerSaturated, or ctx ended first); listenerErr is the listener's.
func (e *Engine) callUnderLease(ctx context.Context, l *lease, state *stateConn, msg Message) (listenerErr, err error) {
	if err := state.hold(ctx, l); err != nil {
		return nil, fmt.Errorf("call listener for %s/%s: %w", msg.QualifiedType, msg.Record.IdempotenceID, err)
	}
	if err := l.prove(ctx); err != nil {
		return nil, fmt.Errorf("call listener for %s/%s: %w", msg.QualifiedType, msg.Record.IdempotenceID, err)
	}
	lctx, cancel := context.WithDeadline(ctx, l.answeredAt.Add(e.cfg.ListenerDeadline))
	defer cancel()
	l.stale = true
	return e.invokeListener(lctx, msg), nil
}
