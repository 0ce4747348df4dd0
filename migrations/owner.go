package migrations

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// OwnerTable records the one inbox (namespace/name) whose tables these are.
const OwnerTable = "seqinbox_owner"

// ErrOwnedByAnotherInbox marks the refusal to serve an inbox from tables another inbox owns.
var ErrOwnedByAnotherInbox = errors.New("the database tables belong to another inbox")

// OwnedError is the refusal to serve Inbox from tables that Owner owns; it wraps
// ErrOwnedByAnotherInbox and says what to do.
type OwnedError struct {
	// Inbox is the inbox that was refused, Owner the one recorded since ClaimedAt.
	Inbox, Owner string
	ClaimedAt    time.Time
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("%v: these tables belong to inbox %s (recorded in %s since %s), not to %s; "+
		"one set of tables serves one inbox, because housekeeping and operator actions act on every row they see. "+
		"Give %s its own database, or its own schema (spec.database.schema, with the search_path of its database role set to it); "+
		"if %s is gone for good and %s takes over its tables, run `seqinbox migrate --inbox %s --take-over-from %s`",
		ErrOwnedByAnotherInbox, e.Owner, OwnerTable, e.ClaimedAt.UTC().Format(time.RFC3339), e.Inbox,
		e.Inbox, e.Owner, e.Inbox, e.Inbox, e.Owner)
}

func (e *OwnedError) Unwrap() error { return ErrOwnedByAnotherInbox }

// Owner returns the inbox recorded as the owner of the tables; found is false when none is (the
// table is empty, or the schema predates it). Do not call it inside a transaction: the missing
// table is checked with to_regclass, which is fine, but the caller's snapshot would hide a
// concurrent claim.
func Owner(ctx context.Context, db Querier) (owner string, claimedAt time.Time, found bool, err error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, OwnerTable).Scan(&exists); err != nil {
		return "", time.Time{}, false, fmt.Errorf("read the owner of the tables: %w", err)
	}
	if !exists {
		return "", time.Time{}, false, nil
	}
	err = db.QueryRow(ctx, `SELECT inbox, claimed_at FROM `+OwnerTable).Scan(&owner, &claimedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, false, nil
	}
	if err != nil {
		return "", time.Time{}, false, fmt.Errorf("read the owner of the tables: %w", err)
	}
	return owner, claimedAt, true, nil
}

// claimSQL records the owner unless one is recorded; of racing claims one inserts, the others
// wait for it and insert nothing.
const claimSQL = `INSERT INTO ` + OwnerTable + ` (inbox) VALUES ($1) ON CONFLICT (singleton) DO NOTHING`

// ClaimOwner records inbox as the owner of the tables when no owner is recorded, and returns an
// *OwnedError when another inbox is. The schema must have the owner table (migration *_inbox_owner.sql).
// Each statement runs on its own, so that the read after a lost race sees the winner's row.
func ClaimOwner(ctx context.Context, db Executor, inbox string) error {
	if inbox == "" {
		return errors.New("claim the tables: no inbox named")
	}
	owner, claimedAt, found, err := Owner(ctx, db)
	if err != nil {
		return err
	}
	if !found {
		if _, err := db.Exec(ctx, claimSQL, inbox); err != nil {
			return fmt.Errorf("claim the tables for inbox %s: %w", inbox, err)
		}
		if owner, claimedAt, found, err = Owner(ctx, db); err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("claim the tables for inbox %s: %s has no owner after the claim (is the schema older than this build?)", inbox, OwnerTable)
		}
	}
	if owner != inbox {
		return &OwnedError{Inbox: inbox, Owner: owner, ClaimedAt: claimedAt}
	}
	return nil
}

// takeOverSQL hands the tables from one inbox to another; 0 rows when from is not the owner.
const takeOverSQL = `UPDATE ` + OwnerTable + ` SET inbox = $2, claimed_at = now() WHERE inbox = $1`

// TakeOver records inbox as the owner of tables that from owns (an inbox renamed or replaced).
// It refuses when from is not the recorded owner, so that a typo never steals another inbox's
// tables; with no owner recorded, it claims them.
func TakeOver(ctx context.Context, db Executor, from, inbox string) error {
	owner, claimedAt, found, err := Owner(ctx, db)
	if err != nil {
		return err
	}
	switch {
	case !found:
		return ClaimOwner(ctx, db, inbox)
	case owner == inbox:
		return nil
	case owner != from:
		return fmt.Errorf("take the tables over from inbox %s: %w", from, &OwnedError{Inbox: inbox, Owner: owner, ClaimedAt: claimedAt})
	}
	tag, err := db.Exec(ctx, takeOverSQL, from, inbox)
	if err != nil {
		return fmt.Errorf("take the tables over from inbox %s for %s: %w", from, inbox, err)
	}
	if tag.RowsAffected() == 0 { // the owner changed since it was read
		return ClaimOwner(ctx, db, inbox)
	}
	return nil
}
