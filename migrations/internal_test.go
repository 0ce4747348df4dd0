package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/internal/testenv"
)

func TestLoadRejectsMisnamedOrGappedFiles(t *testing.T) {
	file := &fstest.MapFile{Data: []byte("SELECT 1;")}
	tests := []struct {
		name    string
		files   fstest.MapFS
		wantErr string
	}{
		{"ordered", fstest.MapFS{"0001_a.sql": file, "0002_b.sql": file}, ""},
		{"gap", fstest.MapFS{"0001_a.sql": file, "0003_c.sql": file}, "0003_c.sql: version 3, expected 2"},
		{"starts at zero", fstest.MapFS{"0000_a.sql": file}, "version 0, expected 1"},
		{"no version", fstest.MapFS{"base.sql": file}, "base.sql: name must look like"},
		{"upper case", fstest.MapFS{"0001_Base.sql": file}, "name must look like"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms, err := load(tt.files)
			if tt.wantErr == "" {
				if err != nil || len(ms) != len(tt.files) {
					t.Fatalf("load = %d migrations, %v; want %d, no error", len(ms), err, len(tt.files))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("load error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestEmbeddedMigrationsLoad(t *testing.T) {
	if _, err := load(files); err != nil {
		t.Fatal(err)
	}
	if Latest() < 3 {
		t.Fatalf("Latest = %d, want at least the three files of docs/design.md#tables", Latest())
	}
}

func TestFailingMigrationLeavesNeitherItsTablesNorItsLedgerRow(t *testing.T) {
	ctx := context.Background()
	url := testenv.FreshDatabase(t, "migrations_fail")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	ms, err := load(fstest.MapFS{
		"0001_ok.sql":     {Data: []byte("CREATE TABLE kept (id int);")},
		"0002_broken.sql": {Data: []byte("CREATE TABLE half_done (id int); SELECT no_such_column FROM kept;")},
	})
	if err != nil {
		t.Fatal(err)
	}

	res, err := applyOn(ctx, conn, ms, len(ms), ownerClaim{})
	if err == nil || !strings.Contains(err.Error(), "0002_broken.sql") {
		t.Fatalf("applyOn error = %v, want one naming 0002_broken.sql", err)
	}
	if res.After != 1 || len(res.Applied) != 1 {
		t.Fatalf("result = %+v, want version 1 applied and version 2 not", res)
	}
	var halfDone bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('half_done') IS NOT NULL`).Scan(&halfDone); err != nil {
		t.Fatal(err)
	}
	if halfDone {
		t.Fatal("table of the failed migration exists: its transaction was not rolled back")
	}
	if v, err := Current(ctx, conn); err != nil || v != 1 {
		t.Fatalf("Current = %d, %v; want 1", v, err)
	}
	st, err := inspect(ctx, conn, ms)
	if err != nil || len(st.Pending) != 1 || st.Pending[0] != 2 {
		t.Fatalf("inspect = %+v, %v; want version 2 still pending", st, err)
	}
}

func TestEditedFileIsDetectedAgainstTheLedger(t *testing.T) {
	ctx := context.Background()
	url := testenv.FreshDatabase(t, "migrations_edit")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	original, _ := load(fstest.MapFS{"0001_a.sql": {Data: []byte("CREATE TABLE a (id int);")}})
	edited, _ := load(fstest.MapFS{"0001_a.sql": {Data: []byte("CREATE TABLE a (id bigint);")}})
	if _, err := applyOn(ctx, conn, original, 1, ownerClaim{}); err != nil {
		t.Fatal(err)
	}

	_, err = applyOn(ctx, conn, edited, 1, ownerClaim{})
	if !errors.Is(err, ErrLedgerMismatch) || !strings.Contains(err.Error(), "0001_a.sql") {
		t.Fatalf("applyOn with an edited file = %v, want ErrLedgerMismatch naming 0001_a.sql", err)
	}
}

// TestARefusedInboxAppliesNothing: tables owned by another inbox are refused before any pending
// migration runs, so the refused inbox's newer image never changes the owner's schema.
func TestARefusedInboxAppliesNothing(t *testing.T) {
	ctx := context.Background()
	url := testenv.FreshDatabase(t, "migrations_refuse")
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := applyOn(ctx, conn, embedded, Latest(), ownerClaim{inbox: "shop/orders"}); err != nil {
		t.Fatal(err)
	}
	next := fmt.Sprintf("%04d_later.sql", Latest()+1)
	fsys := fstest.MapFS{next: {Data: []byte("CREATE TABLE later (id int);")}}
	for _, m := range embedded {
		fsys[m.Name] = &fstest.MapFile{Data: []byte(m.SQL)}
	}
	newer, err := load(fsys)
	if err != nil {
		t.Fatal(err)
	}

	res, err := applyOn(ctx, conn, newer, len(newer), ownerClaim{inbox: "billing/invoices"})
	if !errors.Is(err, ErrOwnedByAnotherInbox) || len(res.Applied) != 0 {
		t.Fatalf("applyOn for another inbox = %+v, %v; want a refusal with nothing applied", res, err)
	}
	var later bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('later') IS NOT NULL`).Scan(&later); err != nil || later {
		t.Fatalf("the pending migration ran for the refused inbox (table exists: %v, %v)", later, err)
	}
}
