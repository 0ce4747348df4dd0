package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
)

// errRecordDeadline is the cause of a record's context when its processing deadline ends.
var errRecordDeadline = errors.New("record processing deadline exceeded")

// recordFault says whether an error of the engine was caused by the record itself, and with which
// dead-letter reason and message. Everything else (connection loss, server shutdown,
// serialization failures and deadlocks, pool exhaustion, errors nobody classified) is an
// infrastructure error: the record is retried with backoff, never skipped.
//
// listenerCut reports that the record's deadline ended while the sink was being called: a sink
// slower than the record may take fails the same way on every retry.
func recordFault(err error, listenerCut bool, recordTimeout, listenerDeadline time.Duration) (reason string, cause error, ok bool) {
	switch {
	case errors.Is(err, inbox.ErrUndeclaredType):
		return decode.ClassUndeclaredType, err, true
	case errors.Is(err, inbox.ErrNoIdempotenceID):
		return decode.ClassMissingIdempotenceID, err, true
	case listenerCut:
		return deadletter.ReasonListenerDeadlineExceeded, fmt.Errorf(
			"the sink was still being called when the record's processing deadline of %s (nine tenths of spec.kafka.maxPollIntervalMs) ended; "+
				"the sink may take %s (spec.sink.timeout, retries and backoff): raise spec.kafka.maxPollIntervalMs or lower the sink's timeout or retries: %w",
			recordTimeout, listenerDeadline, err), true
	case rejectedByDatabase(err):
		return deadletter.ReasonRecordRejected, err, true
	}
	return "", nil, false
}

// SQLSTATEs caused by a value of the record: class 22 (data exception: invalid text encoding,
// values out of range or too long) and 54000 (program limit exceeded: an index entry too large).
const (
	dataExceptionClass   = "22"
	programLimitExceeded = "54000"
)

// rejectedByDatabase reports an error that PostgreSQL raised because of a value it was given.
func rejectedByDatabase(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, dataExceptionClass) || pgErr.Code == programLimitExceeded
}

// listenerWatch marks, per record, whether the record's deadline cut a sink call. The engine
// derives the listener's context from the record's, so the mark travels with it.
type listenerWatch struct{ inbox.Listener }

type cutKey struct{}

// Deliver implements inbox.Listener.
func (l listenerWatch) Deliver(ctx context.Context, m inbox.Message) error {
	err := l.Listener.Deliver(ctx, m)
	if err != nil && errors.Is(context.Cause(ctx), errRecordDeadline) {
		if cut, ok := ctx.Value(cutKey{}).(*atomic.Bool); ok {
			cut.Store(true)
		}
	}
	return err
}
