package replication

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestGapRowsOrderByWithinStatement: the rows one multi-row INSERT wrote in
// a gap share their cmin, and ctid is not their order when the free space
// map hands back room in an earlier page; snapshot.order_by (here a
// bigserial) is, and the repair orders by it within the statement, as the
// configuration says it does.
func TestGapRowsOrderByWithinStatement(t *testing.T) {
	ctx, pg, conn := startServer(t)
	table := fmt.Sprintf("gap_orderby_%d", time.Now().UnixNano()%1e9)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE ` + table + ` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), pos bigserial, aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb)`)
	roomInPageZero(ctx, t, conn, table)
	// One statement: a 2 KB event that does not fit page 0 starts a new
	// page, then 60 small ones fill it and go on in page 0.
	var xmin uint64
	if err := conn.QueryRow(ctx, `INSERT INTO `+table+` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'a', format('e%s', lpad(g::text, 2, '0')), CASE WHEN g = 0
			THEN (SELECT to_jsonb(string_agg(md5(h::text), '')) FROM generate_series(1, 60) h)
			ELSE to_jsonb(repeat('z', 100)) END
		FROM generate_series(0, 60) g ORDER BY g RETURNING pg_current_xact_id()::text::bigint`).Scan(&xmin); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 61 {
		want = append(want, fmt.Sprintf("e%02d", i))
	}
	heap := byCtid(ctx, t, conn, table)
	if slices.Equal(heap, want) {
		t.Fatalf("the heap kept the insertion order (%v): the statement's rows did not land in an earlier page", heap)
	}
	exec("CREATE PUBLICATION " + table + " FOR TABLE " + table)
	rows, _, err := gapSource(t, pg, table).GapRows(ctx, xmin, offsets.RepairedRows{}, offsets.FinishedTxns{}, []RowSpec{{Mapping: gapMapping, OrderBy: "pos"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := eventTypes(rows)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("gap rows in order\n%v\nwant the order of pos\n%v\n(heap order %v)", got, want, heap)
	}
}
