package replication

import (
	"context"
	"testing"
	"time"

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

// gapResult is what a repair's read returned: each row's event type.
type gapResult struct {
	got []string
	err error
}

// startGapRows reads the gap's rows from xmin on in a goroutine, which may
// wait for the gap's writers; the result comes on the channel.
func startGapRows(ctx context.Context, src Source, xmin uint64) <-chan gapResult {
	done := make(chan gapResult, 1)
	go func() {
		rows, _, err := src.GapRows(ctx, xmin, offsets.RepairedRows{}, []RowSpec{{Mapping: gapMapping}}, nil)
		if err != nil {
			done <- gapResult{err: err}
			return
		}
		got, err := eventTypes(rows)
		done <- gapResult{got, err}
	}()
	return done
}

// waitForRepairWait returns once a repair waits for the gap's writers (its
// query is in pg_stat_activity).
func waitForRepairWait(ctx context.Context, t *testing.T, conn *pgx.Conn) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%the gap repair waits%' "+
			"AND pid <> pg_backend_pid()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the repair did not wait for the gap's writer within 30 s")
		}
	}
}
