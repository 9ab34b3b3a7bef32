package replication

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// gapMapping maps the gap tests' outbox columns.
var gapMapping = decode.Mapping{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"}

// gapSource is table of the server pg as a repair's source, its publication
// named after it.
func gapSource(t *testing.T, pg *testenv.Postgres, table string) Source {
	t.Helper()
	db, err := ParseDB(pg.DSN("postgres"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return Source{DB: db, OutboxTable: OutboxTable{Schema: "public", Table: table}, Publication: table}
}

// eventTypes reads rows to the end and returns each row's event type.
func eventTypes(rows *Rows) ([]string, error) {
	defer rows.Close()
	var got []string
	for rows.Next() {
		ev, err := rows.Event()
		if err != nil {
			return got, err
		}
		got = append(got, string(ev.EventType.Bytes))
	}
	return got, rows.Err()
}

// roomInPageZero fills table with full pages of 1 KB rows and frees room
// for one of them in page 0, which VACUUM records in the free space map:
// a transaction's later rows can land there, before its earlier ones.
func roomInPageZero(ctx context.Context, t *testing.T, conn *pgx.Conn, table string) {
	t.Helper()
	for _, sql := range []string{`INSERT INTO ` + table + ` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'fill', 'fill', 'f', to_jsonb(repeat('x', 1000)) FROM generate_series(1, 40)`,
		`DELETE FROM ` + table + ` WHERE ctid = '(0,3)'`, `VACUUM ` + table} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// byCtid is the event types of aggregate a in heap order.
func byCtid(ctx context.Context, t *testing.T, conn *pgx.Conn, table string) []string {
	t.Helper()
	q, err := conn.Query(ctx, `SELECT event_type FROM `+table+` WHERE aggregate_id = 'a' ORDER BY ctid`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(q, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// gapRead is the event types a repair of src's gap from bound reads,
// leaving out the finished transactions f.
func gapRead(ctx context.Context, t *testing.T, src Source, bound uint64, f offsets.FinishedTxns) []string {
	t.Helper()
	rows, _, err := src.GapRows(ctx, bound, offsets.RepairedRows{}, f, []RowSpec{{Mapping: gapMapping}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := eventTypes(rows)
	if err != nil {
		t.Fatal(err)
	}
	return got
}
