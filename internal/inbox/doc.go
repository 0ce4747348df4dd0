// Package inbox is the claim engine of the sequential inbox (docs/design.md#processing-one-record):
// it claims each logical message once in PostgreSQL, hands released messages to a Listener in the
// declared order per sequence instance, buffers out-of-order messages, runs housekeeping and
// operator actions.
//
// Transactions, one function each:
//   - getOrCreateInstance: the sequence instance row, in its own short transaction.
//   - claimAndProcess (T1): the claim insert as first statement, then deliver or buffer while the
//     claim is held; T1 stays open and idle during the listener call.
//   - storeStateInNewTx: the message state after a listener call, committed before T1.
//   - releaseUnderInstanceLock (T2): releases buffered messages whose condition holds, under a
//     FOR NO KEY UPDATE lock of the instance row; closes complete instances.
//   - markReleaseFailedInNewTx: FAILED plus deletion of the claim, in one transaction.
//   - runActionsUnderInstanceLock: operator actions (CONSUME, EXPIRE, CONSUME_ALL, CLOSE); a
//     message action takes the message's claim behind a savepoint, as T1 does, and writes its
//     outcome in finishMessageActionInNewTx, committed before the claim.
//   - housekeeping batches: windowClosedBatch, deleteClosedBatch (closed instances past their
//     duplicate-protection window, which closing starts in remove_after), markExpiredBatch,
//     deleteExpiredBatch.
//
// Every state write names the state it expects (PROCESSED is final), and only an action's own
// execution clears it. A message keeps the raw record of its latest delivery (buffered_message)
// only while the engine may still have to deliver it: WAITING until released, FAILED until a
// resend or an action settles it; a PROCESSED one keeps it only when its sequence keeps the
// records of delivered messages (keepsRecord), and only then can CONSUME deliver it again. Reads
// that pick a message pick one row per logical message (lookupMessageSQL,
// waitingStandsForItsMessage).
//
// What the engine expects from the records' pool it is given (housekeeping, actions and metrics
// reads run on Config.Maintenance, never on it):
//   - At least two connections per concurrent Process call: T1 (and later T2) holds one, the
//     state transactions that must commit before T1 use a second one. The consumer bounds its
//     records in flight to MaxConns/2.
//   - TCP keepalives on the connections (pgx: a net.Dialer with KeepAlive in the ConnConfig's
//     DialFunc; server: tcp_keepalives_idle/interval/count), so that the server notices a consumer
//     that lost its network and rolls its T1 back, which frees the claim like an expiring lease.
//     The engine bounds the idle time of T1 and T2 itself through
//     idle_in_transaction_session_timeout; keepalives cover the case where the client vanished
//     while the server waits for it to read.
package inbox
