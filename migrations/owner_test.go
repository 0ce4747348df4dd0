package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/seqinbox/seqinbox/migrations"
)

// connect opens one connection on url, closed when the test ends.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func owner(t *testing.T, db migrations.Querier) string {
	t.Helper()
	o, _, _, err := migrations.Owner(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestApplyForRecordsTheFirstInboxAndRefusesAnother(t *testing.T) {
	ctx := context.Background()
	url := newDatabaseURL(t)
	conn := connect(t, url)

	if _, err := migrations.ApplyFor(ctx, conn, "shop/orders", ""); err != nil {
		t.Fatal(err)
	}
	if got := owner(t, conn); got != "shop/orders" {
		t.Fatalf("owner after the first inbox migrated = %q, want shop/orders", got)
	}
	// The owner migrates again as often as it likes (every new image runs a migration).
	if _, err := migrations.ApplyFor(ctx, conn, "shop/orders", ""); err != nil {
		t.Fatalf("the owner migrating again: %v", err)
	}

	res, err := migrations.ApplyFor(ctx, connect(t, url), "billing/invoices", "")
	var owned *migrations.OwnedError
	if !errors.As(err, &owned) || !errors.Is(err, migrations.ErrOwnedByAnotherInbox) || owned.Owner != "shop/orders" {
		t.Fatalf("a second inbox migrating = %v, want an OwnedError naming shop/orders", err)
	}
	for _, phrase := range []string{"shop/orders", "billing/invoices", "search_path", "--take-over-from shop/orders"} {
		if !strings.Contains(err.Error(), phrase) {
			t.Errorf("refusal %q does not mention %q", err, phrase)
		}
	}
	if res.Before != migrations.Latest() || res.After != migrations.Latest() || len(res.Applied) != 0 {
		t.Errorf("refused run result = %+v, want the current version and nothing applied", res)
	}
	if got := owner(t, conn); got != "shop/orders" {
		t.Fatalf("owner after the refused inbox = %q, want still shop/orders", got)
	}
	// A consumer of the second inbox is refused too (the fence calls ClaimOwner).
	if err := migrations.ClaimOwner(ctx, conn, "billing/invoices"); !errors.As(err, &owned) || owned.Owner != "shop/orders" {
		t.Fatalf("ClaimOwner for a second inbox = %v, want an OwnedError naming shop/orders", err)
	}
}

func TestApplyWithoutAnInboxLeavesTheTablesToTheFirstInboxThatClaims(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if got := owner(t, pool); got != "" {
		t.Fatalf("owner after a migration for no inbox = %q, want none", got)
	}
	if err := migrations.ClaimOwner(ctx, pool, "shop/orders"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.ClaimOwner(ctx, pool, "shop/orders"); err != nil {
		t.Fatalf("the owner claiming again: %v", err)
	}
	if got := owner(t, pool); got != "shop/orders" {
		t.Fatalf("owner = %q, want shop/orders", got)
	}
}

// TestRacingClaimsLeaveExactlyOneOwner: inboxes claim unowned tables at the same moment, from
// their own connections; exactly one wins, every other is refused naming the winner.
func TestRacingClaimsLeaveExactlyOneOwner(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const claimers, iterations = 6, 50
	for it := range iterations {
		if _, err := pool.Exec(ctx, `DELETE FROM `+migrations.OwnerTable); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		errs := make([]error, claimers)
		var wg sync.WaitGroup
		for i := range claimers {
			wg.Go(func() {
				<-start
				errs[i] = migrations.ClaimOwner(ctx, pool, fmt.Sprintf("ns/inbox-%d", i))
			})
		}
		close(start)
		wg.Wait()
		winner := owner(t, pool)
		wins := 0
		for i, err := range errs {
			var owned *migrations.OwnedError
			switch {
			case err == nil:
				wins++
				if want := fmt.Sprintf("ns/inbox-%d", i); winner != want {
					t.Fatalf("iteration %d: claimer %s succeeded but the owner is %s", it, want, winner)
				}
			case errors.As(err, &owned):
				if owned.Owner != winner {
					t.Fatalf("iteration %d: claimer %d refused naming %s, but the owner is %s", it, i, owned.Owner, winner)
				}
			default:
				t.Fatalf("iteration %d: claimer %d: %v", it, i, err)
			}
		}
		if wins != 1 {
			t.Fatalf("iteration %d: %d claimers won, want exactly 1", it, wins)
		}
	}
}

func TestTakeOverHandsTheTablesOnlyFromTheirOwner(t *testing.T) {
	ctx := context.Background()
	url := newDatabaseURL(t)
	conn := connect(t, url)
	if _, err := migrations.ApplyFor(ctx, conn, "shop/orders", ""); err != nil {
		t.Fatal(err)
	}

	_, err := migrations.ApplyFor(ctx, conn, "shop/orders-v2", "shop/order") // a typo
	if !errors.Is(err, migrations.ErrOwnedByAnotherInbox) {
		t.Fatalf("take-over from an inbox that owns nothing = %v, want a refusal", err)
	}
	if got := owner(t, conn); got != "shop/orders" {
		t.Fatalf("owner after the refused take-over = %q, want shop/orders", got)
	}

	if _, err := migrations.ApplyFor(ctx, conn, "shop/orders-v2", "shop/orders"); err != nil {
		t.Fatalf("take-over from the owner: %v", err)
	}
	if got := owner(t, conn); got != "shop/orders-v2" {
		t.Fatalf("owner after the take-over = %q, want shop/orders-v2", got)
	}
	if _, err := migrations.ApplyFor(ctx, conn, "shop/orders", ""); !errors.Is(err, migrations.ErrOwnedByAnotherInbox) {
		t.Fatalf("the previous owner after the take-over = %v, want a refusal", err)
	}
}

// TestInboxesInTwoSchemasOfOneDatabaseEachOwnTheirTables: search_path in the URL gives each
// inbox its own tables in one database, and each its own owner.
func TestInboxesInTwoSchemasOfOneDatabaseEachOwnTheirTables(t *testing.T) {
	ctx := context.Background()
	url := newDatabaseURL(t)
	admin := connect(t, url)
	if _, err := admin.Exec(ctx, `CREATE SCHEMA orders; CREATE SCHEMA invoices`); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for _, inbox := range []string{"orders", "invoices"} {
		conn := connect(t, url+sep+"search_path="+inbox)
		if _, err := migrations.ApplyFor(ctx, conn, "shop/"+inbox, ""); err != nil {
			t.Fatalf("migrate for shop/%s in schema %s: %v", inbox, inbox, err)
		}
		if got := owner(t, conn); got != "shop/"+inbox {
			t.Fatalf("owner in schema %s = %q, want shop/%s", inbox, got, inbox)
		}
	}
	var tables int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_name = $1`, migrations.OwnerTable).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 2 {
		t.Fatalf("%d %s tables in the database, want one per schema", tables, migrations.OwnerTable)
	}
}
