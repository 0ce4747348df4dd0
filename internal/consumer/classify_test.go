package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/seqinbox/seqinbox/internal/deadletter"
	"github.com/seqinbox/seqinbox/internal/decode"
	"github.com/seqinbox/seqinbox/internal/inbox"
)

// TestRecordFaultsAreTheRecordsAndEverythingElseIsRetried classifies errors that a real
// PostgreSQL raises for bad values next to infrastructure errors: only the former may
// dead-letter a record.
func TestRecordFaultsAreTheRecordsAndEverythingElseIsRetried(t *testing.T) {
	pool := database(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	serverErr := func(sql string, args ...any) error {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Fatalf("%s: %v, want an error of the server", sql, err)
		}
		return fmt.Errorf("claim OrderCreated/x: %w", err)
	}
	if _, err := conn.Exec(ctx, `CREATE TEMP TABLE classify_keys (k text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		err         error
		listenerCut bool
		wantReason  string // empty: retried
	}{
		{"NUL in text (22021)", serverErr(`SELECT $1::text`, "a\x00"), false, deadletter.ReasonRecordRejected},
		{"invalid UTF-8 (22021)", serverErr(`SELECT $1::text`, "\xff"), false, deadletter.ReasonRecordRejected},
		{"invalid number text (22P02)", serverErr(`SELECT 'x'::int`), false, deadletter.ReasonRecordRejected},
		{"index entry too large (54000)", serverErr(`INSERT INTO classify_keys SELECT string_agg(md5(i::text), '') FROM generate_series(1, 400) i`), false, deadletter.ReasonRecordRejected},
		{"undeclared type", fmt.Errorf("process: %w", inbox.ErrUndeclaredType), false, decode.ClassUndeclaredType},
		{"no idempotence ID", fmt.Errorf("process: %w", inbox.ErrNoIdempotenceID), false, decode.ClassMissingIdempotenceID},
		{"sink cut by the record deadline", fmt.Errorf("claim: %w", context.DeadlineExceeded), true, deadletter.ReasonListenerDeadlineExceeded},
		{"record deadline while waiting for the database", fmt.Errorf("claim: %w", context.DeadlineExceeded), false, ""},
		{"serialization failure (40001)", &pgconn.PgError{Code: "40001"}, false, ""},
		{"deadlock (40P01)", fmt.Errorf("claim: %w", &pgconn.PgError{Code: "40P01"}), false, ""},
		{"server shutting down (57P01)", &pgconn.PgError{Code: "57P01"}, false, ""},
		{"connection lost", fmt.Errorf("claim: %w", io.ErrUnexpectedEOF), false, ""},
		{"pool closed", fmt.Errorf("acquire: %w", errors.New("closed pool")), false, ""},
		{"shutdown", context.Canceled, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reason, cause, ok := recordFault(tt.err, tt.listenerCut, 9*time.Second, 12*time.Second)
			if reason != tt.wantReason || ok != (tt.wantReason != "") {
				t.Fatalf("recordFault(%v) = %q, %v; want %q", tt.err, reason, ok, tt.wantReason)
			}
			if ok && !errors.Is(cause, tt.err) {
				t.Fatalf("the dead-letter message %v does not carry the error %v", cause, tt.err)
			}
		})
	}
}
