package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"sigs.k8s.io/yaml"

	"github.com/seqinbox/seqinbox/internal/cli"
	"github.com/seqinbox/seqinbox/internal/declaration"
	"github.com/seqinbox/seqinbox/internal/inbox"
	"github.com/seqinbox/seqinbox/internal/manifest"
	"github.com/seqinbox/seqinbox/internal/testenv"
	"github.com/seqinbox/seqinbox/migrations"
)

// sampleManifest is the path of the sample inbox, whose order sequence the inspect tests use.
func sampleManifest(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "config", "samples", "inbox_v1alpha1_sequentialinbox.yaml")
}

// inspectDatabase is a migrated database in which the sample's engine processed OrderCreated,
// OrderValidated.STOCK_AVAILABLE and OrderShipped of order 42: OrderShipped waits for OrderPaid.
func inspectDatabase(t *testing.T) (string, *pgxpool.Pool, *inbox.Engine) {
	t.Helper()
	ctx := context.Background()
	url, pool := migrateDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	in, err := manifest.Load(sampleManifest(t))
	if err != nil {
		t.Fatal(err)
	}
	set, errs := declaration.Compile(&in.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	maintenance := testenv.Pool(t, url)
	engine, err := inbox.New(pool, set, discard{}, inbox.Config{ListenerDeadline: time.Minute, IdleLockTimeout: time.Minute,
		Maintenance: maintenance}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ typ, subtype, id string }{
		{"OrderCreated", "", "order-42-created"},
		{"OrderValidated", "STOCK_AVAILABLE", "order-42-validated"},
		{"OrderShipped", "", "order-42-shipped"},
	} {
		rec := inbox.Record{Type: r.typ, Subtype: r.subtype, IdempotenceID: r.id, ContextID: "42", Sequenced: true,
			Value: []byte(`{"orderId":"42","secret":"payload-never-printed"}`), Origin: inbox.Origin{Topic: "orders", Partition: 2, Offset: 7}}
		if _, err := engine.Process(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	return url, pool, engine
}

func TestInspectCommandSaysWhatAWaitingMessageWaitsForInTextJSONAndYAML(t *testing.T) {
	url, pool, engine := inspectDatabase(t)
	ctx := context.Background()
	var validatedAt time.Time
	if err := pool.QueryRow(ctx, `SELECT state_changed_at FROM sequenced_message WHERE idempotence_id = 'order-42-validated'`).Scan(&validatedAt); err != nil {
		t.Fatal(err)
	}
	base := []string{"inspect", "-f", sampleManifest(t), "--database-url", url}

	stdout, stderr, code := seqinbox(t, append(base, "--context-id", "42")...)
	if code != cli.ExitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	t.Logf("seqinbox inspect --context-id 42:\n%s", stdout)
	stampRE := `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
	for _, want := range []string{
		`(?m)^Instance order/42: OPEN$`,
		`(?m)^  Retained until +` + stampRE + `: its messages may arrive until then`,
		`(?m)^  Not processed +OrderPaid, OrderShipped, OrderDelivered \(it closes when every type of the sequence is processed\)$`,
		`(?m)^Messages \(3\)$`,
		`(?m)^  OrderCreated +order-42-created +PROCESSED +` + stampRE + ` +` + stampRE + ` +orders\[2\]@7 +-$`,
		`(?m)^  OrderShipped +order-42-shipped +WAITING `,
		`(?m)^Waiting\n  OrderShipped/order-42-shipped: OrderShipped waits for OrderPaid, which has not arrived; ` +
			`OrderValidated.STOCK_AVAILABLE arrived and was processed at ` + regexp.QuoteMeta(validatedAt.UTC().Format(time.RFC3339)) + `\.$`,
	} {
		if !regexp.MustCompile(want).MatchString(stdout) {
			t.Errorf("the text does not match %s", want)
		}
	}
	if strings.Contains(stdout, "payload-never-printed") {
		t.Errorf("the text shows a payload")
	}

	for _, output := range []string{"json", "yaml"} {
		stdout, stderr, code = seqinbox(t, append(base, "--message", "OrderShipped/order-42-shipped", "-o", output)...)
		if code != cli.ExitOK {
			t.Fatalf("-o %s: exit %d, stderr %q", output, code, stderr)
		}
		data := []byte(stdout)
		if output == "yaml" {
			var err error
			if data, err = yaml.YAMLToJSON(data); err != nil {
				t.Fatal(err)
			}
		}
		var got inbox.Inspection
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatalf("-o %s: %v:\n%s", output, err, stdout)
		}
		if got.Instance.ContextID != "42" || len(got.Messages) != 1 || got.Messages[0].Waits == nil ||
			strings.Join(got.Messages[0].Waits.MissingTypes, ",") != "OrderPaid" || strings.Contains(stdout, "payload-never-printed") {
			t.Fatalf("-o %s --message: %s", output, stdout)
		}
	}

	// Once OrderPaid arrives, OrderShipped is released: processed, nothing waits.
	if _, err := engine.Process(ctx, inbox.Record{Type: "OrderPaid", IdempotenceID: "order-42-paid", ContextID: "42", Sequenced: true,
		Value: []byte(`{"orderId":"42"}`)}); err != nil {
		t.Fatal(err)
	}
	stdout, _, code = seqinbox(t, append(base, "--context-id", "42", "--sequence", "order")...)
	if code != cli.ExitOK || !regexp.MustCompile(`(?m)^  OrderShipped +order-42-shipped +PROCESSED `).MatchString(stdout) || strings.Contains(stdout, "Waiting") {
		t.Fatalf("after OrderPaid: exit %d:\n%s", code, stdout)
	}
}

func TestInspectCommandExitCodes(t *testing.T) {
	url, pool, _ := inspectDatabase(t)
	t.Setenv(envDatabaseURL, "")
	base := []string{"inspect", "-f", sampleManifest(t), "--database-url", url}
	tests := []struct {
		args []string
		code int
		want string
	}{
		{append(base, "--context-id", "43"), cli.ExitFailed, "seqinbox inspect: inspect context 43: no sequence instance: none was created for it, or housekeeping deleted it"},
		{append(base, "--context-id", "42", "--sequence", "refund"), cli.ExitFailed, "inspect instance refund/42: no sequence instance"},
		{append(base, "--message", "OrderPaid/order-42-paid"), cli.ExitFailed, "inspect message OrderPaid/order-42-paid: no stored message with this qualified type and idempotence ID"},
		{append(base, "--message", "OrderShipped/order-42-shipped", "--context-id", "41"), cli.ExitFailed, "the message belongs to instance order/42"},
		{append(base, "--message", "OrderPaid"), cli.ExitUsage, `seqinbox inspect: --message "OrderPaid": want TYPE/ID`},
		{base, cli.ExitUsage, "seqinbox inspect: --context-id or --message is required"},
		{append(base, "--context-id", "42", "-o", "wide"), cli.ExitUsage, `seqinbox inspect: --output "wide": use text, json or yaml`},
		{[]string{"inspect", "--context-id", "42", "--database-url", url}, cli.ExitUsage, "seqinbox inspect: -f inbox.yaml is required"},
		{[]string{"inspect", "-f", sampleManifest(t), "--context-id", "42"}, cli.ExitUsage, "seqinbox inspect: --database-url or SEQINBOX_DATABASE_URL is required"},
		{append(base, "--context-id", "42", "extra"), cli.ExitUsage, `seqinbox inspect: takes no arguments, got "extra"`},
	}
	for _, tt := range tests {
		_, stderr, code := seqinbox(t, tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tt.args, code, stderr, tt.code, tt.want)
		}
	}
	// Tables another inbox owns are refused: they are not this manifest's.
	if _, err := pool.Exec(context.Background(), `INSERT INTO seqinbox_owner (inbox) VALUES ('shop/refund-inbox')`); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := seqinbox(t, append(base, "--context-id", "42")...); code != cli.ExitFailed || !strings.Contains(stderr, "shop/refund-inbox") {
		t.Fatalf("tables of another inbox: exit %d, stderr %q", code, stderr)
	}
}
