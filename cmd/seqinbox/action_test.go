package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/controller"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/sequence"
	"github.com/seqinbox/seqinbox/migrations"
)

// actionDatabase is a migrated database holding instance order/o-1 with a WAITING OrderPaid
// (idempotence ID paid-1), and instance order/o-2 with nothing pending.
func actionDatabase(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url, pool := migrateDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `
		WITH i AS (
			INSERT INTO sequence_instance (name, context_id, retain_until)
			VALUES ('order', 'o-1', now() + interval '1 hour'), ('order', 'o-2', now() + interval '1 hour')
			RETURNING id, context_id)
		INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, state)
		SELECT id, 'OrderPaid', 'paid-1', 'WAITING' FROM i WHERE context_id = 'o-1'`)
	if err != nil {
		t.Fatal(err)
	}
	return url, pool
}

// actionCommand runs `seqinbox action` with args in process, its output going to stdout.
func actionCommand(ctx context.Context, args []string, stdout io.Writer) error {
	return run(ctx, append([]string{"action"}, args...), stdout, io.Discard)
}

// pendingActions returns the pending actions of the fixture's message and instances.
func pendingActions(t *testing.T, pool *pgxpool.Pool) (message, o1, o2 string) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT
		(SELECT coalesce(pending_action, '') FROM sequenced_message WHERE idempotence_id = 'paid-1'),
		(SELECT coalesce(pending_action, '') FROM sequence_instance WHERE context_id = 'o-1'),
		(SELECT coalesce(pending_action, '') FROM sequence_instance WHERE context_id = 'o-2')`).Scan(&message, &o1, &o2)
	if err != nil {
		t.Fatal(err)
	}
	return message, o1, o2
}

func TestActionCommandRecordsEachActionOnItsTargetOnly(t *testing.T) {
	tests := []struct {
		args               []string
		message, o1, o2    string
		wantTarget, action string
	}{
		{[]string{"--action", "Consume", "--type", "OrderPaid", "--idempotence-id", "paid-1"}, "CONSUME", "", "", "message OrderPaid/paid-1", "Consume"},
		{[]string{"--action", "Expire", "--type", "OrderPaid", "--idempotence-id", "paid-1"}, "EXPIRE", "", "", "message OrderPaid/paid-1", "Expire"},
		{[]string{"--action", "ConsumeAll", "--sequence", "order", "--context-id", "o-2"}, "", "", "CONSUME_ALL", "instance order/o-2", "ConsumeAll"},
		{[]string{"--action", "Close", "--sequence", "order", "--context-id", "o-1"}, "", "CLOSE", "", "instance order/o-1", "Close"},
	}
	for _, tt := range tests {
		t.Run(tt.action, func(t *testing.T) {
			url, pool := actionDatabase(t)
			path := filepath.Join(t.TempDir(), "termination-log")
			var stdout bytes.Buffer

			args := append([]string{"--database-url", url, "--output", "json", "--termination-message-path", path}, tt.args...)
			if err := actionCommand(context.Background(), args, &stdout); err != nil {
				t.Fatal(err)
			}
			if m, o1, o2 := pendingActions(t, pool); m != tt.message || o1 != tt.o1 || o2 != tt.o2 {
				t.Fatalf("pending actions (message, o-1, o-2) = (%q, %q, %q), want (%q, %q, %q)", m, o1, o2, tt.message, tt.o1, tt.o2)
			}
			message, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(stdout.String()) != string(message) {
				t.Fatalf("stdout %s differs from the termination message %s", stdout.String(), message)
			}
			var report controller.ActionReport
			if err := json.Unmarshal(message, &report); err != nil {
				t.Fatal(err)
			}
			want := controller.ActionReport{Action: tt.action, Target: tt.wantTarget, Recorded: true}
			if report != want {
				t.Fatalf("report = %+v, want %+v", report, want)
			}
			if strings.Contains(string(message), `"error"`) {
				t.Fatalf("report of a recorded action has an error field: %s", message)
			}
		})
	}
}

// TestActionCommandRefusesTablesOfAnotherInbox: the operator's action Job names its inbox
// (SEQINBOX_INBOX); on tables another inbox owns, nothing is recorded, since that inbox's
// consumers would execute it.
func TestActionCommandRefusesTablesOfAnotherInbox(t *testing.T) {
	ctx := context.Background()
	url, pool := actionDatabase(t)
	if err := migrations.ClaimOwner(ctx, pool, "shop/orders"); err != nil {
		t.Fatal(err)
	}
	args := []string{"--database-url", url, "--action", "Consume", "--type", "OrderPaid", "--idempotence-id", "paid-1"}

	t.Setenv("SEQINBOX_INBOX", "billing/invoices")
	err := actionCommand(ctx, args, io.Discard)
	if !errors.Is(err, migrations.ErrOwnedByAnotherInbox) || !strings.Contains(err.Error(), "shop/orders") {
		t.Fatalf("action for another inbox = %v, want a refusal naming shop/orders", err)
	}
	if m, o1, o2 := pendingActions(t, pool); m != "" || o1 != "" || o2 != "" {
		t.Fatalf("pending actions after the refusal = (%q, %q, %q), want none", m, o1, o2)
	}

	t.Setenv("SEQINBOX_INBOX", "shop/orders")
	if err := actionCommand(ctx, args, io.Discard); err != nil {
		t.Fatalf("action for the owner: %v", err)
	}
	if m, _, _ := pendingActions(t, pool); m != "CONSUME" {
		t.Fatalf("pending action of the message = %q, want CONSUME", m)
	}
}

func TestActionCommandOnAMissingTargetFailsAndReportsNotFound(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"message", []string{"--action", "Consume", "--type", "OrderPaid", "--idempotence-id", "paid-404"}},
		{"message of another type", []string{"--action", "Expire", "--type", "OrderShipped", "--idempotence-id", "paid-1"}},
		{"instance", []string{"--action", "Close", "--sequence", "order", "--context-id", "o-404"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, pool := actionDatabase(t)
			path := filepath.Join(t.TempDir(), "termination-log")
			var stdout bytes.Buffer

			args := append([]string{"--database-url", url, "--termination-message-path", path}, tt.args...)
			err := actionCommand(context.Background(), args, &stdout)
			if !errors.Is(err, inbox.ErrNotFound) {
				t.Fatalf("action error = %v, want ErrNotFound", err)
			}
			if action := tt.args[1]; !strings.Contains(err.Error(), ": "+action+" on ") || strings.Contains(err.Error(), strings.ToUpper(action)) {
				t.Fatalf("action error %q, want it to name the action as the API does (%s), not as the engine stores it", err, action)
			}
			if stdout.Len() != 0 {
				t.Fatalf("text output on failure: %q, want none (the error goes to stderr)", stdout.String())
			}
			if m, o1, o2 := pendingActions(t, pool); m != "" || o1 != "" || o2 != "" {
				t.Fatalf("pending actions (message, o-1, o-2) = (%q, %q, %q), want none", m, o1, o2)
			}
			message, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var report controller.ActionReport
			if err := json.Unmarshal(message, &report); err != nil {
				t.Fatal(err)
			}
			if report.Recorded || !strings.Contains(report.Error, "not found") {
				t.Fatalf("report = %+v, want not recorded, with the not-found error", report)
			}
		})
	}
}

func TestActionCommandRejectsBadFlagsBeforeConnecting(t *testing.T) {
	tests := []struct {
		name, want string
		args       []string
	}{
		{"no database", "--database-url", []string{"--action", "Close", "--sequence", "order", "--context-id", "o-1"}},
		{"unknown action", "use Consume, Expire, ConsumeAll or Close", []string{"--database-url", "postgres://x", "--action", "CONSUME"}},
		{"message action without message", "takes --type and --idempotence-id", []string{"--database-url", "postgres://x", "--action", "Consume", "--type", "OrderPaid"}},
		{"message action on an instance", "takes --type and --idempotence-id", []string{"--database-url", "postgres://x", "--action", "Expire",
			"--type", "OrderPaid", "--idempotence-id", "paid-1", "--sequence", "order"}},
		{"instance action on a message", "takes --sequence and --context-id", []string{"--database-url", "postgres://x", "--action", "ConsumeAll",
			"--sequence", "order", "--context-id", "o-1", "--idempotence-id", "paid-1"}},
		{"bad output", "--output", []string{"--database-url", "postgres://x", "--action", "Close", "--sequence", "order", "--context-id", "o-1", "--output", "yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SEQINBOX_DATABASE_URL", "")
			path := filepath.Join(t.TempDir(), "termination-log")
			var out bytes.Buffer
			err := actionCommand(context.Background(), append(tt.args, "--termination-message-path", path), &out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("action error = %v, want one mentioning %q", err, tt.want)
			}
			if out.Len() != 0 {
				t.Fatalf("wrote %q before rejecting the flags", out.String())
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("termination message written for rejected flags (stat: %v)", err)
			}
		})
	}
}

func TestActionReportFitsTheTerminationMessage(t *testing.T) {
	r := controller.ActionReport{Action: "Consume", Target: "message " + strings.Repeat("t", 3000), Error: strings.Repeat("é", 5000)}

	b, err := r.EncodeWithin(migrations.TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	var back controller.ActionReport
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("shortened report is not valid JSON: %v", err)
	}
	if len(b) > migrations.TerminationMessageLimit || !strings.HasSuffix(back.Error, "é…") || back.Action != "Consume" {
		t.Fatalf("encoded %d bytes, action %q, error ending %q; want within the limit, the action kept, cut on a rune boundary",
			len(b), back.Action, back.Error[len(back.Error)-8:])
	}
}

// discard is a listener and dead-letterer that accepts everything.
type discard struct{}

func (discard) Deliver(context.Context, inbox.Message) error { return nil }

func (discard) DeadLetter(context.Context, inbox.Message, string) error { return nil }

func TestActionCommandAwaitsTheOutcomeAConsumerReports(t *testing.T) {
	ctx := context.Background()
	url, pool := actionDatabase(t)
	var stdout bytes.Buffer
	record := []string{"--database-url", url, "--output", "json", "--action", "Close", "--sequence", "order", "--context-id", "o-1",
		"--request-id", "uid-1"}
	if err := actionCommand(ctx, append(record, "--wait", "0s"), &stdout); err != nil {
		t.Fatal(err)
	}
	var report controller.ActionReport
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil || !report.Recorded || report.Executed {
		t.Fatalf("report before any consumer ran = %+v (%v), want recorded, not executed", report, err)
	}

	maintenance, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer maintenance.Close()
	set := sequence.NewSet([]*sequence.Sequence{{Name: "order", Retention: time.Hour,
		Types: []*sequence.MessageType{{Type: "OrderPaid", Qualified: "OrderPaid"}}}})
	engine, err := inbox.New(pool, set, discard{}, inbox.Config{ListenerDeadline: time.Minute, IdleLockTimeout: time.Minute,
		Maintenance: maintenance}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := engine.RunPendingActions(ctx, discard{}); err != nil || n != 1 {
		t.Fatalf("RunPendingActions = %d, %v; want the Close executed", n, err)
	}

	stdout.Reset()
	if err := actionCommand(ctx, append(record, "--await-only", "--wait", "10s"), &stdout); err != nil {
		t.Fatal(err)
	}
	report = controller.ActionReport{}
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatal(err)
	}
	if !report.Executed || report.Outcome != controller.OutcomeExecuted || !strings.Contains(report.Detail, "instance closed") {
		t.Fatalf("report after the consumer ran = %+v, want Executed with what it did", report)
	}
}
