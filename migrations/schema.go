package migrations

import (
	"context"
	"errors"
	"fmt"
)

// ErrWrongSchema marks a connection whose unqualified table names resolve to another schema than
// the one the inbox names (spec.database.schema): its tables would be created, or looked for,
// elsewhere.
var ErrWrongSchema = errors.New("the connection resolves tables in another schema than the inbox names")

// CheckSchemaName returns nil when want is empty or is the schema that unqualified table names
// of db resolve to (current_schema(): the first schema of search_path that exists), and otherwise
// an ErrWrongSchema error that names the schema found and how to set the right one. Migrations
// and consumers call it before they touch a table, so that tables never silently land in, or are
// read from, another schema, for instance behind a pooler that drops search_path from the URL.
func CheckSchemaName(ctx context.Context, db Querier, want string) error {
	if want == "" {
		return nil
	}
	var got *string
	if err := db.QueryRow(ctx, `SELECT current_schema()`).Scan(&got); err != nil {
		return fmt.Errorf("read the current schema: %w", err)
	}
	how := fmt.Sprintf("set search_path to %[1]s for the database role (ALTER ROLE … SET search_path = %[1]s) or the database (ALTER DATABASE … SET search_path = %[1]s), which works behind a connection pooler, or in the database URL when nothing pools the connections", want)
	if got == nil {
		return fmt.Errorf("%w: no schema of the connection's search_path exists, spec.database.schema names %q: create it (CREATE SCHEMA %s) and %s",
			ErrWrongSchema, want, want, how)
	}
	if *got != want {
		return fmt.Errorf("%w: tables resolve to schema %q (the first existing schema of the connection's search_path), spec.database.schema names %q: %s",
			ErrWrongSchema, *got, want, how)
	}
	return nil
}
