package migrations_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/seqinbox/seqinbox/migrations"
)

// TestUpgradeKeysRawRecordsByTheirMessageAndKeepsThem upgrades a database whose raw records
// (buffered_message) were written by the previous schema, for a WAITING and for a PROCESSED
// message, and checks that the migration keeps them, keys them by their message alone, and that
// deleting an instance still deletes its records, through its messages.
func TestUpgradeKeysRawRecordsByTheirMessageAndKeepsThem(t *testing.T) {
	ctx := context.Background()
	pool := newDatabase(t)
	i := slices.IndexFunc(migrations.All(), func(m migrations.Migration) bool {
		return strings.HasSuffix(m.Name, "_raw_record_keys.sql")
	})
	if i < 0 {
		t.Fatal("no raw-record-keys migration embedded")
	}
	version := migrations.All()[i].Version
	if _, err := migrations.ApplyUpTo(ctx, pool, version-1); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `WITH i AS (
  INSERT INTO sequence_instance (name, context_id, retain_until) VALUES ('order', 'o-1', now() + interval '1 day') RETURNING id
), m AS (
  INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, state)
  SELECT id, t, 'o-1-' || t, s FROM i, (VALUES ('OrderCreated', 'PROCESSED'), ('OrderPaid', 'WAITING')) v(t, s)
  RETURNING id, sequence_instance_id, message_type
)
INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value)
SELECT sequence_instance_id, id, 'o-1', convert_to(message_type, 'UTF8') FROM m`); err != nil {
		t.Fatal(err)
	}
	const recordsSQL = `SELECT m.message_type || ' ' || m.state || ' ' || convert_from(b.value, 'UTF8')
FROM buffered_message b JOIN sequenced_message m ON m.id = b.sequenced_message_id ORDER BY m.id`
	before := collect(t, pool, recordsSQL)

	res, err := migrations.ApplyUpTo(ctx, pool, version)
	if err != nil || !slices.Equal(res.Applied, []int{version}) {
		t.Fatalf("upgrade = %+v, %v; want version %d applied", res, err, version)
	}
	if after := collect(t, pool, recordsSQL); !slices.Equal(after, before) || len(after) != 2 {
		t.Fatalf("records after the upgrade %v, want as before %v", after, before)
	}
	if got := collect(t, pool, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = 'buffered_message'::regclass ORDER BY contype, conname`); !slices.Equal(got, []string{
		"FOREIGN KEY (sequenced_message_id) REFERENCES sequenced_message(id) ON DELETE CASCADE",
		"PRIMARY KEY (sequenced_message_id)",
	}) {
		t.Fatalf("constraints of buffered_message = %v, want its message's key and foreign key alone", got)
	}
	if got := collect(t, pool, `SELECT indexname::text FROM pg_indexes WHERE tablename = 'buffered_message'`); !slices.Equal(got, []string{"buffered_message_pkey"}) {
		t.Fatalf("indexes of buffered_message = %v, want its primary key alone", got)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM sequence_instance WHERE context_id = 'o-1'`); err != nil {
		t.Fatal(err)
	}
	if left := collect(t, pool, recordsSQL+` LIMIT 1`); len(left) != 0 {
		t.Fatalf("records left after their instance was deleted: %v", left)
	}
	if got := collect(t, pool, `SELECT count(*)::text FROM buffered_message`); !slices.Equal(got, []string{"0"}) {
		t.Fatalf("buffered_message rows after the instance was deleted: %v, want 0", got)
	}
}
