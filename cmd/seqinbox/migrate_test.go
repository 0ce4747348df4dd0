package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seqinbox/seqinbox/internal/fence"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/internal/version"
	"github.com/seqinbox/seqinbox/migrations"
)

// migrateDatabase creates an empty database for one test; it returns its URL and a pool on it.
func migrateDatabase(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := testenv.FreshDatabase(t, "cmd_migrate")
	return url, testenv.Pool(t, url)
}

// migrateCommand runs `seqinbox migrate` with args in process, its output going to stdout.
func migrateCommand(ctx context.Context, args []string, stdout io.Writer) error {
	return run(ctx, append([]string{"migrate"}, args...), stdout, io.Discard)
}

func allVersions() []int {
	vs := make([]int, migrations.Latest())
	for i := range vs {
		vs[i] = i + 1
	}
	return vs
}

func TestMigrateDryRunAppliesNothingAndReportsPending(t *testing.T) {
	ctx := context.Background()
	url, pool := migrateDatabase(t)
	if _, err := migrations.ApplyUpTo(ctx, pool, 1); err != nil {
		t.Fatal(err)
	}

	report, err := migrate(ctx, migrateOptions{databaseURL: url, dryRun: true, liveWithin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if report.SchemaVersion != 1 || len(report.Applied) != 0 || !slices.Equal(report.Pending, allVersions()[1:]) || !report.DryRun {
		t.Fatalf("dry-run report = %+v, want version 1, nothing applied, %v pending", report, allVersions()[1:])
	}
	if v, err := migrations.Current(ctx, pool); err != nil || v != 1 {
		t.Fatalf("schema version after dry run = %d, %v; want still 1", v, err)
	}
	var claimTable bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('sequential_inbox_idempotence') IS NOT NULL`).Scan(&claimTable); err != nil || claimTable {
		t.Fatalf("claim table exists after a dry run (%v, %v)", claimTable, err)
	}
}

func TestMigrateAppliesThenReportsOnlyLiveConsumers(t *testing.T) {
	ctx := context.Background()
	url, pool := migrateDatabase(t)

	first, err := migrate(ctx, migrateOptions{databaseURL: url, liveWithin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if first.SchemaVersion != migrations.Latest() || !slices.Equal(first.Applied, allVersions()) || len(first.Pending) != 0 ||
		first.ClaimProtocol != inbox.ClaimProtocol || first.EngineVersion != version.Version || len(first.LiveConsumers) != 0 {
		t.Fatalf("first report = %+v, want every version applied by this build and no consumers", first)
	}

	for _, id := range []string{"live", "stale"} {
		f, err := fence.New(pool, fence.Identity{InstanceID: id, ConsumerGroup: "orders", EngineVersion: "v0.0.9", ClaimProtocol: "old-v0"}, fence.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Register(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE consumer_registry SET heartbeat_at = now() - interval '2 minutes' WHERE instance_id = 'stale'`); err != nil {
		t.Fatal(err)
	}

	second, err := migrate(ctx, migrateOptions{databaseURL: url, liveWithin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Applied) != 0 || second.SchemaVersion != migrations.Latest() {
		t.Fatalf("second report = %+v, want nothing applied", second)
	}
	if len(second.LiveConsumers) != 1 {
		t.Fatalf("live consumers = %+v, want only the live one", second.LiveConsumers)
	}
	c := second.LiveConsumers[0]
	if c.InstanceID != "live" || c.ConsumerGroup != "orders" || c.EngineVersion != "v0.0.9" || c.ClaimProtocol != "old-v0" ||
		c.HeartbeatAt.IsZero() || c.HeartbeatAt.Location() != time.UTC {
		t.Fatalf("live consumer = %+v, want the registered identity with a UTC heartbeat", c)
	}
}

func TestMigrateCommandWritesTheSameJSONToStdoutAndTheTerminationMessage(t *testing.T) {
	url, _ := migrateDatabase(t)
	path := filepath.Join(t.TempDir(), "termination-log")
	var stdout bytes.Buffer

	err := migrateCommand(context.Background(), []string{"--database-url", url, "--output", "json", "--termination-message-path", path}, &stdout)
	if err != nil {
		t.Fatal(err)
	}
	message, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(stdout.String()) != string(message) {
		t.Fatalf("stdout %s differs from the termination message %s", stdout.String(), message)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(message, &fields); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"applied", "claimProtocol", "engineVersion", "liveConsumers", "pending", "schemaVersion"}
	if !slices.Equal(keys, want) {
		t.Fatalf("report keys = %v, want exactly %v", keys, want)
	}
	all := make([]int, 0, migrations.Latest())
	for _, m := range migrations.All() {
		all = append(all, m.Version)
	}
	wantApplied, _ := json.Marshal(all)
	if string(fields["applied"]) != string(wantApplied) || string(fields["pending"]) != "[]" || string(fields["liveConsumers"]) != "[]" {
		t.Fatalf("report = %s, want applied %s, pending [], liveConsumers []", message, wantApplied)
	}
}

func TestMigrateCommandCutsTheTerminationMessageButNotStdout(t *testing.T) {
	ctx := context.Background()
	url, pool := migrateDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const consumers = 200
	_, err := pool.Exec(ctx, `
		INSERT INTO consumer_registry (instance_id, consumer_group, engine_version, claim_protocol, started_at, heartbeat_at)
		SELECT 'orders-consumer-7d9f8c6b5-' || lpad(i::text, 5, '0'), 'orders', 'v0.1.0', 'insert-first-v1', now(), now()
		FROM generate_series(1, $1) i`, consumers)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "termination-log")
	var stdout bytes.Buffer

	if err := migrateCommand(ctx, []string{"--database-url", url, "--output", "json", "--termination-message-path", path}, &stdout); err != nil {
		t.Fatal(err)
	}
	var full, cut migrations.Report
	if err := json.Unmarshal(stdout.Bytes(), &full); err != nil {
		t.Fatal(err)
	}
	message, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(message, &cut); err != nil {
		t.Fatal(err)
	}
	if len(full.LiveConsumers) != consumers || full.LiveConsumersTruncated {
		t.Fatalf("stdout lists %d consumers (truncated %v), want all %d", len(full.LiveConsumers), full.LiveConsumersTruncated, consumers)
	}
	if len(message) > migrations.TerminationMessageLimit || !cut.LiveConsumersTruncated || len(cut.LiveConsumers) == 0 {
		t.Fatalf("termination message: %d bytes, %d consumers, truncated %v; want within %d bytes, some consumers, flagged",
			len(message), len(cut.LiveConsumers), cut.LiveConsumersTruncated, migrations.TerminationMessageLimit)
	}
}

func TestMigrateCommandFailureStillWritesAReportWithTheError(t *testing.T) {
	ctx := context.Background()
	url, pool := migrateDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+migrations.LedgerTable+` SET checksum = 'edited' WHERE version = 1`); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "termination-log")
	var stdout bytes.Buffer

	err := migrateCommand(ctx, []string{"--database-url", url, "--termination-message-path", path}, &stdout)
	if !errors.Is(err, migrations.ErrLedgerMismatch) {
		t.Fatalf("migrate error = %v, want ErrLedgerMismatch", err)
	}
	if stdout.Len() != 0 {
		t.Fatalf("text output on failure: %q, want none (the error goes to stderr)", stdout.String())
	}
	message, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var report migrations.Report
	if err := json.Unmarshal(message, &report); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(report.Error, "0001_base.sql") || report.ClaimProtocol != inbox.ClaimProtocol || len(report.Applied) != 0 {
		t.Fatalf("failure report = %+v, want the error naming 0001_base.sql, this build's protocol, nothing applied", report)
	}
}

func TestMigrateTextOutputNamesVersionsProtocolAndConsumers(t *testing.T) {
	var out bytes.Buffer
	r := migrations.Report{SchemaVersion: 3, Applied: []int{2, 3}, ClaimProtocol: "insert-first-v1", EngineVersion: "v0.1.0",
		LiveConsumers: []migrations.LiveConsumer{{InstanceID: "pod-a", ConsumerGroup: "orders", EngineVersion: "v0.0.9",
			ClaimProtocol: "old-v0", HeartbeatAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}}

	if err := writeMigrateText(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"schema version 3", "applied now: 2, 3", "pending: none", "claim protocol insert-first-v1",
		"engine v0.1.0", "pod-a", "orders", "old-v0", "2026-01-02T03:04:05Z"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestMigrateCommandRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  string
	}{
		{"no database", []string{}, ""},
		{"bad output", []string{"--database-url", "postgres://x", "--output", "yaml"}, ""},
		{"zero live-within", []string{"--database-url", "postgres://x", "--live-within", "0s"}, ""},
		{"inbox without namespace", []string{"--database-url", "postgres://x", "--inbox", "orders"}, ""},
		{"take-over without inbox", []string{"--database-url", "postgres://x", "--take-over-from", "shop/orders"}, ""},
		{"take-over as a dry run", []string{"--database-url", "postgres://x", "--inbox", "shop/b", "--take-over-from", "shop/a", "--dry-run"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SEQINBOX_DATABASE_URL", tt.env)
			var out bytes.Buffer
			if err := migrateCommand(context.Background(), tt.args, &out); err == nil {
				t.Fatal("migrate accepted the flags")
			}
			if out.Len() != 0 {
				t.Fatalf("wrote %q before rejecting the flags", out.String())
			}
		})
	}
}

func TestMigrateCommandTakesTheDatabaseFromTheEnvironment(t *testing.T) {
	url, _ := migrateDatabase(t)
	t.Setenv("SEQINBOX_DATABASE_URL", url)
	var stdout bytes.Buffer

	if err := migrateCommand(context.Background(), []string{"--dry-run", "--output", "json"}, &stdout); err != nil {
		t.Fatal(err)
	}
	var report migrations.Report
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		t.Fatal(err)
	}
	if report.SchemaVersion != 0 || !slices.Equal(report.Pending, allVersions()) || len(report.Applied) != 0 {
		t.Fatalf("dry run via SEQINBOX_DATABASE_URL = %+v, want an empty database with everything pending", report)
	}
}

// TestMigrateCommandRefusesASecondInboxWithAReportNamingTheOwner runs the command as the
// operator's Job does (inbox from SEQINBOX_INBOX, JSON report in the termination message): the
// first inbox becomes the owner, the second fails with a report that names the owner.
func TestMigrateCommandRefusesASecondInboxWithAReportNamingTheOwner(t *testing.T) {
	ctx := context.Background()
	url, _ := migrateDatabase(t)
	t.Setenv("SEQINBOX_DATABASE_URL", url)
	run := func(inbox string) (migrations.Report, error) {
		t.Helper()
		t.Setenv("SEQINBOX_INBOX", inbox)
		path := filepath.Join(t.TempDir(), "termination-log")
		err := migrateCommand(ctx, []string{"--output", "json", "--termination-message-path", path}, io.Discard)
		message, readErr := os.ReadFile(path)
		if readErr != nil {
			t.Fatal(readErr)
		}
		var report migrations.Report
		if err := json.Unmarshal(message, &report); err != nil {
			t.Fatal(err)
		}
		return report, err
	}

	first, err := run("shop/orders")
	if err != nil || first.Owner != "shop/orders" || first.SchemaVersion != migrations.Latest() {
		t.Fatalf("first inbox: %+v, %v; want the schema migrated and shop/orders the owner", first, err)
	}
	second, err := run("billing/invoices")
	if !errors.Is(err, migrations.ErrOwnedByAnotherInbox) {
		t.Fatalf("second inbox: %v, want a refusal", err)
	}
	if second.Owner != "shop/orders" || !strings.Contains(second.Error, "belong to inbox shop/orders") || len(second.Applied) != 0 {
		t.Fatalf("second inbox's report = %+v, want the owner shop/orders named and nothing applied", second)
	}
}

func TestMigrateDryRunReportsBlockedRecordsAndToleratesASchemaWithoutThem(t *testing.T) {
	ctx := context.Background()
	url, pool := migrateDatabase(t)
	// The schema before the blocked record's columns: the live consumer is listed without one.
	if _, err := migrations.ApplyUpTo(ctx, pool, migrations.Latest()-1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO consumer_registry (instance_id, consumer_group, engine_version, claim_protocol, started_at, heartbeat_at)
		VALUES ('orders-consumer-0', 'orders', 'v0.1.0', 'insert-first-v1', now(), now())`); err != nil {
		t.Fatal(err)
	}
	before, err := migrate(ctx, migrateOptions{databaseURL: url, dryRun: true, liveWithin: time.Minute})
	if err != nil {
		t.Fatalf("dry run on schema %d: %v", migrations.Latest()-1, err)
	}
	if len(before.LiveConsumers) != 1 || before.LiveConsumers[0].Blocked != nil {
		t.Fatalf("dry run on the older schema lists %+v, want the consumer without a blocked record", before.LiveConsumers)
	}

	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE consumer_registry SET blocked_topic = 'orders', blocked_partition = 2, blocked_offset = 42,
		blocked_since = now() - interval '10 minutes', blocked_error = repeat('ERROR: out of resources (SQLSTATE 53000) ', 40)`); err != nil {
		t.Fatal(err)
	}
	report, err := migrate(ctx, migrateOptions{databaseURL: url, dryRun: true, liveWithin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.LiveConsumers) != 1 || report.LiveConsumers[0].Blocked == nil {
		t.Fatalf("dry run lists %+v, want the consumer with its blocked record", report.LiveConsumers)
	}
	b := report.LiveConsumers[0].Blocked
	if b.Topic != "orders" || b.Partition != 2 || b.Offset != 42 || time.Since(b.Since) < 9*time.Minute ||
		!strings.Contains(b.Error, "SQLSTATE 53000") || len(b.Error) > migrations.MaxBlockedError {
		t.Fatalf("blocked record %+v (error of %d bytes), want orders[2] offset 42 since ten minutes, error cut to %d bytes",
			b, len(b.Error), migrations.MaxBlockedError)
	}
	var out bytes.Buffer
	if err := writeMigrateText(&out, report); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "orders-consumer-0 retries orders[2] offset 42 since") {
		t.Fatalf("text output does not name the blocked record:\n%s", out.String())
	}
}

// TestMigrateCreatesTheTablesOnlyInTheSchemaOfTheInbox runs `seqinbox migrate --schema inbox_a`
// through PgBouncer in transaction mode, which refuses search_path in the URL: on a database whose
// sessions resolve tables to public it refuses before anything is created, naming public and how
// to set the schema; on one whose search_path is set for the database it creates every table in
// inbox_a and none in public. Without the check the first run created a second set of tables in
// public.
func TestMigrateCreatesTheTablesOnlyInTheSchemaOfTheInbox(t *testing.T) {
	ctx := context.Background()
	tables := func(pool *pgxpool.Pool, schema string) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, setPath := range []bool{false, true} {
		url, pool := migrateDatabase(t)
		if _, err := pool.Exec(ctx, `CREATE SCHEMA inbox_a`); err != nil {
			t.Fatal(err)
		}
		if setPath {
			var db string
			if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `ALTER DATABASE "`+db+`" SET search_path = inbox_a`); err != nil {
				t.Fatal(err)
			}
		}
		pooled := testenv.PgBouncer(t, url, 2)
		var out bytes.Buffer
		err := migrateCommand(ctx, []string{"--database-url", pooled, "--schema", "inbox_a"}, &out)
		if !setPath {
			if !errors.Is(err, migrations.ErrWrongSchema) || !strings.Contains(err.Error(), `"public"`) || !strings.Contains(err.Error(), "ALTER ROLE") {
				t.Fatalf("migrate --schema inbox_a on a database resolving to public = %v; want %v naming \"public\" and how to set the schema", err, migrations.ErrWrongSchema)
			}
			if n := tables(pool, "public") + tables(pool, "inbox_a"); n != 0 {
				t.Fatalf("%d tables created by a refused migration, want none", n)
			}
			continue
		}
		if err != nil {
			t.Fatalf("migrate --schema inbox_a with the database's search_path set: %v", err)
		}
		var claims bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass('inbox_a.sequential_inbox_idempotence') IS NOT NULL`).Scan(&claims); err != nil || !claims {
			t.Fatalf("claim table in inbox_a: %v, %v; want it created there", claims, err)
		}
		if n := tables(pool, "public"); n != 0 {
			t.Fatalf("%d tables in public, want none", n)
		}
	}
}
