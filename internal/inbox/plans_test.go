package inbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// engineTables are the tables a message's processing reads and writes.
var engineTables = []string{"sequence_instance", "sequenced_message", "sequential_inbox_idempotence", "buffered_message"}

// fillEngineTables stores n instances of ten messages each (one in ten WAITING), each with its
// claim and its raw record, as a long-running inbox holds them.
func fillEngineTables(t *testing.T, h *harness, from, n int) {
	t.Helper()
	for _, sql := range []string{
		`INSERT INTO sequence_instance (name, context_id, retain_until)
		 SELECT 'chain', 'fill-' || g, now() + interval '1 day' FROM generate_series($1::int, $2::int) g`,
		`INSERT INTO sequenced_message (sequence_instance_id, message_type, idempotence_id, message_id, topic, partition, "offset", state)
		 SELECT i.id, 'A', i.context_id || '-' || g, 'm', 'orders', 0, g, CASE WHEN g = 10 THEN 'WAITING' ELSE 'PROCESSED' END
		 FROM sequence_instance i, generate_series(1, 10) g
		 WHERE i.context_id LIKE 'fill-%' AND substr(i.context_id, 6)::int BETWEEN $1 AND $2`,
		`INSERT INTO sequential_inbox_idempotence (message_type, idempotence_id, sequence_instance_id, created_at)
		 SELECT m.message_type, m.idempotence_id, m.sequence_instance_id, now() FROM sequenced_message m
		 JOIN sequence_instance i ON i.id = m.sequence_instance_id WHERE substr(i.context_id, 6)::int BETWEEN $1 AND $2`,
		`INSERT INTO buffered_message (sequence_instance_id, sequenced_message_id, key, value)
		 SELECT m.sequence_instance_id, m.id, 'k', repeat('v', 200)::bytea FROM sequenced_message m
		 JOIN sequence_instance i ON i.id = m.sequence_instance_id WHERE substr(i.context_id, 6)::int BETWEEN $1 AND $2`,
	} {
		if _, err := h.pool.Exec(context.Background(), sql, from, from+n-1); err != nil {
			t.Fatalf("fill: %v", err)
		}
	}
}

// TestHotStatementsProbeIndexesWhateverTheStatistics plans every statement that processing a
// message or a batch runs per message, on tables of 200,000 messages whose statistics are missing
// (never analyzed, as with autovacuum off) or stale (analyzed when they held 100 messages), with
// the planner's own choices: each must find its rows through an index. A plan that scans a table
// costs time in proportion to everything the inbox keeps, and batches would wait on each other's
// scans as the tables grow.
func TestHotStatementsProbeIndexesWhateverTheStatistics(t *testing.T) {
	const batch = 16
	keys := func() (types, ids []string) {
		for i := range batch {
			types, ids = append(types, "A"), append(ids, fmt.Sprintf("fill-%d-%d", 7*i+1, i%10+1))
		}
		return types, ids
	}
	types, ids := keys()
	instances, contexts := make([]int64, batch), make([]string, batch)
	for i := range instances {
		instances[i], contexts[i] = int64(7*i+1), fmt.Sprintf("fill-%d", 7*i+1)
	}
	var states insertStatesColumns
	for i := range batch {
		states.instanceIDs = append(states.instanceIDs, instances[i])
		states.types, states.ids = append(states.types, "A"), append(states.ids, fmt.Sprintf("new-%d", i))
		states.messageIDs, states.topics = append(states.messageIDs, "m"), append(states.topics, "orders")
		states.partitions, states.offsets = append(states.partitions, 0), append(states.offsets, int64(i))
		states.states, states.traces = append(states.states, stateProcessed), append(states.traces, nil)
		states.keys, states.values = append(states.keys, []byte("k")), append(states.values, []byte("v"))
		states.hdr, states.keepRecords = append(states.hdr, "[]"), append(states.keepRecords, true)
	}
	statements := []struct {
		name, sql string
		args      []any
		// uses are the indexes of messageIndexes that the plan must name: the statement is why
		// they exist.
		uses []string
	}{
		{"claim", claimSQL, []any{"A", "new-claim", instances[0], "60000"}, []string{"sequential_inbox_idempotence_pkey"}},
		{"claim lookup", lookupMessageSQL, []any{"A", ids[0]}, []string{"sequenced_message_idempotence_id"}},
		{"instance state", instanceStateSQL, []any{instances[0]}, []string{"sequenced_message_instance_state_type"}},
		{"instance lookup", selectInstanceSQL, []any{"chain", contexts[0]}, nil},
		{"batch lookup", lookupMessagesSQL, []any{types, ids}, nil},
		{"batch states", insertStatesSQL, states.args(), nil},
		{"batch unclaim", unclaimSQL, []any{types, ids}, nil},
		{"record of a release", loadBufferedSQL, []any{int64(10)}, []string{"sequenced_message_pkey", "buffered_message_pkey"}},
		{"released", markReleasedSQL, []any{int64(10), stateWaiting, false}, nil},
		{"pending actions", pendingInstancesSQL, []any{actionBatchSize}, []string{"sequenced_message_pending_action"}},
		{"waiting gauges", stateCollectSQL, []any{time.Now(), time.Now().Add(time.Hour), "no-holder"}, []string{"sequenced_message_waiting_type"}},
		// What the foreign keys' ON DELETE CASCADE runs when housekeeping deletes an instance
		// (PostgreSQL's own statement text): without the index each deleted instance would read
		// the whole table.
		{"instance deleted: its claims", `DELETE FROM ONLY sequential_inbox_idempotence WHERE $1 OPERATOR(pg_catalog.=) sequence_instance_id`,
			[]any{instances[0]}, []string{"sequential_inbox_idempotence_sequence_instance_id"}},
		{"instance deleted: its messages", `DELETE FROM ONLY sequenced_message WHERE $1 OPERATOR(pg_catalog.=) sequence_instance_id`,
			[]any{instances[0]}, []string{"sequenced_message_instance_state_type"}},
		{"message deleted: its record", `DELETE FROM ONLY buffered_message WHERE $1 OPERATOR(pg_catalog.=) sequenced_message_id`,
			[]any{int64(10)}, []string{"buffered_message_pkey"}},
	}
	used := map[string]bool{}
	for _, st := range statements {
		for _, index := range st.uses {
			used[index] = true
		}
	}
	for _, index := range messageIndexes {
		if !used[index] {
			t.Fatalf("index %s has no statement in this test that needs it", index)
		}
	}

	for _, stats := range []string{"missing", "stale"} {
		t.Run(stats, func(t *testing.T) {
			h := newIsolatedHarness(t, chainSet())
			for _, table := range engineTables {
				if _, err := h.pool.Exec(context.Background(), `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
					t.Fatal(err)
				}
			}
			first := 1
			if stats == "stale" {
				fillEngineTables(t, h, first, 10)
				for _, table := range engineTables {
					if _, err := h.pool.Exec(context.Background(), `ANALYZE `+table); err != nil {
						t.Fatal(err)
					}
				}
				first += 10
			}
			fillEngineTables(t, h, first, 20_000-first+1)
			h.requireMessageIndexesAndKeys()
			for _, st := range statements {
				t.Run(st.name, func(t *testing.T) {
					plan := h.planAsIs(st.sql, st.args...)
					for _, table := range engineTables {
						if strings.Contains(plan, "Seq Scan on "+table) {
							t.Fatalf("plan scans %s:\n%s", table, plan)
						}
					}
					for _, index := range st.uses {
						if !strings.Contains(plan, index) {
							t.Fatalf("plan does not use %s:\n%s", index, plan)
						}
					}
				})
			}
		})
	}
}

// messageIndexes are all the indexes that every message pays for, or every message that waits or
// failed, or is to get an action: of its claim, its state row and its raw record. Each is named
// by a statement of TestHotStatementsProbeIndexesWhateverTheStatistics that needs it.
var messageIndexes = []string{
	"buffered_message_pkey",
	"sequenced_message_idempotence_id",
	"sequenced_message_instance_state_type",
	"sequenced_message_pending_action",
	"sequenced_message_pkey",
	"sequenced_message_waiting_type",
	"sequential_inbox_idempotence_pkey",
	"sequential_inbox_idempotence_sequence_instance_id",
}

// messageForeignKeys are all the foreign keys that a message's rows are checked against, and what
// each gives: the claim's holds the instance for T1 (its check locks the instance row FOR KEY
// SHARE, so housekeeping cannot delete the instance under a claim in flight) and, with the other
// two, deletes a message's rows with its instance (plans of the cascade in the test above).
var messageForeignKeys = []string{
	"buffered_message_sequenced_message_id_fkey",
	"sequenced_message_sequence_instance_id_fkey",
	"sequential_inbox_idempotence_sequence_instance_id_fkey",
}

// requireMessageIndexesAndKeys fails unless the tables of a message's rows have exactly
// messageIndexes and messageForeignKeys: a new index or key needs a statement that proves it.
func (h *harness) requireMessageIndexesAndKeys() {
	h.t.Helper()
	tables := []string{"sequenced_message", "sequential_inbox_idempotence", "buffered_message"}
	for _, c := range []struct {
		what, sql string
		want      []string
	}{
		{"indexes", `SELECT indexname::text FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ANY($1) ORDER BY 1`, messageIndexes},
		{"foreign keys", `SELECT conname::text FROM pg_constraint WHERE contype = 'f' AND conrelid::regclass::text = ANY($1) ORDER BY 1`, messageForeignKeys},
	} {
		rows, err := h.pool.Query(context.Background(), c.sql, tables)
		if err != nil {
			h.t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			h.t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			h.t.Fatalf("%s of a message's tables = %v, want %v", c.what, got, c.want)
		}
	}
}

// planAsIs returns the query plan of sql as the planner chooses it for these arguments.
func (h *harness) planAsIs(sql string, args ...any) string {
	h.t.Helper()
	return h.explain("", sql, args...)
}

// requireEngineTablesEmpty fails when one of engineTables still holds a row.
func (h *harness) requireEngineTablesEmpty(when string) {
	h.t.Helper()
	for _, table := range engineTables {
		if n := h.count(`SELECT count(*) FROM ` + table); n != 0 {
			h.t.Fatalf("%s has %d rows %s, want 0", table, n, when)
		}
	}
}
