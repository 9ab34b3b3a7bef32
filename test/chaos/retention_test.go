package chaos

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Outbox retention (docs/operations.md, "Outbox retention") runs in every
// chaos run: the connector deletes delivered rows older than
// chaosRetention, under the faults. A trigger records each deleted row in
// chaos_deleted, in the DELETE's own transaction, with the time it was
// deleted: so a restore or a promotion rewinds the record with the row,
// the ledger's "in the database" (readTable) is the table plus what
// retention deleted, and the check below can hold every deletion against
// the first copy of its event the broker appended.
//
// public.outbox, when partitioned, is RANGE-partitioned on created_at at
// the root (what retention asks of a partitioned outbox) with one
// partition covering all time, outbox_all, itself RANGE-partitioned on
// bucket (the partitions ops-partition works on): retention makes no
// partition there (each window it would make overlaps outbox_all, a
// partition it did not make; it warns once) and drops none. Its rows are
// deleted only when the outbox is plain (OUTBOX_CDC_CHAOS_SKIP=ops-partition);
// billing.events (tables_test.go) is plain, and its rows are deleted in
// every run.
const (
	chaosRetention         = 5 * time.Second
	chaosRetentionInterval = time.Second
	// retentionDDL records what retention deletes (after the tables exist).
	// low is the row's lower bound of its commit LSN (secondslot_test.go).
	retentionDDL = `CREATE TABLE chaos_deleted (id text PRIMARY KEY, tbl text NOT NULL, agg text NOT NULL, seq int NOT NULL,
	deleted_at timestamptz NOT NULL DEFAULT clock_timestamp(), low pg_lsn);
CREATE FUNCTION chaos_outbox_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN INSERT INTO chaos_deleted (id, tbl, agg, seq, low) VALUES (OLD.id::text, 'public.outbox', OLD.aggregate_id, (OLD.payload->>'seq')::int, (OLD.payload->>'low')::pg_lsn); RETURN OLD; END $$;
CREATE FUNCTION chaos_billing_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN INSERT INTO chaos_deleted (id, tbl, agg, seq, low) VALUES (OLD.event_id::text, 'billing.events', OLD.invoice_id, (OLD.body->>'seq')::int, (OLD.body->>'low')::pg_lsn); RETURN OLD; END $$;
CREATE TRIGGER chaos_deleted AFTER DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION chaos_outbox_deleted();
CREATE TRIGGER chaos_deleted AFTER DELETE ON billing.events FOR EACH ROW EXECUTE FUNCTION chaos_billing_deleted();
CREATE INDEX ON billing.events (created_at)`
	// deletedRows is added to the checker's read of the outbox tables.
	deletedRows = ` UNION ALL SELECT id, agg, seq, deleted_at, tbl FROM chaos_deleted`
	// deletedMetric is the connector's count of the rows it deleted.
	deletedMetric = "outbox_cdc_outbox_rows_deleted_total"
)

// committedSQL looks an event's row up by id ($1) in table (id column col)
// and among the rows retention deleted: a row delivered and deleted
// before a writer settles its commit's unknown outcome was committed.
func committedSQL(table, col string) string {
	return fmt.Sprintf("SELECT (SELECT count(*) FROM %s WHERE %s = $1::text::uuid) + (SELECT count(*) FROM chaos_deleted WHERE id = $1::text)", table, col)
}

// retentionSection is the connector's retention keys (outbox section).
func retentionSection() string {
	return fmt.Sprintf("  retention: %s\n  retention_interval: %s\n", chaosRetention, chaosRetentionInterval)
}

// retentionReport is what retention did in the run (the report's
// "retention" section).
type retentionReport struct {
	Retention string `json:"retention"`
	// Deleted are the rows chaos_deleted holds at the end, by table.
	Deleted        int            `json:"rows_deleted"`
	DeletedByTable map[string]int `json:"rows_deleted_by_table"`
	// BeforeDelivery: rows deleted before the broker appended any copy of
	// their event (or whose event has none): each fails the run.
	BeforeDelivery int      `json:"rows_deleted_before_delivery"`
	Examples       []string `json:"examples,omitempty"`
	// LastProcessMetric is outbox_cdc_outbox_rows_deleted_total of the last
	// connector process, read before its stop (-1: not read); it counts
	// only that process's deletions, which chaos_deleted all holds.
	LastProcessMetric float64 `json:"rows_deleted_metric_last_process"`
}

func (rr *retentionReport) String() string {
	return fmt.Sprintf("retention %s: %d rows deleted %v, %d of them before their event was appended; the last process's %s %v",
		rr.Retention, rr.Deleted, rr.DeletedByTable, rr.BeforeDelivery, deletedMetric, rr.LastProcessMetric)
}

// checkRetention holds every row retention deleted against its event's
// copies: the broker must have appended one (LogAppendTime, whole
// milliseconds, never after the append) at or before the deletion. An
// event with no copy at all is also lost (checkLoss). In long mode a run
// in which retention deleted nothing fails: it tested nothing.
func (o *observation) checkRetention(rep *Report, copies map[string][]copyRec, fail func(string, ...any)) {
	rr := &retentionReport{Retention: chaosRetention.String(), DeletedByTable: map[string]int{}, LastProcessMetric: o.LastDeleted}
	rep.Retention = rr
	for id, row := range o.Table {
		if row.Deleted.IsZero() {
			continue
		}
		rr.Deleted++
		rr.DeletedByTable[row.Tbl]++
		i := slices.IndexFunc(copies[id], func(c copyRec) bool { return !c.Append.After(row.Deleted) })
		if i < 0 {
			rr.BeforeDelivery++
			if len(rr.Examples) < 10 {
				first := "no copy"
				if len(copies[id]) > 0 {
					first = "first copy appended " + earliest(copies[id]).Format("15:04:05.000")
				}
				rr.Examples = append(rr.Examples, fmt.Sprintf("%s (%s %s seq %d) deleted %s, %s",
					id, row.Tbl, row.Agg, row.Seq, row.Deleted.Format("15:04:05.000"), first))
			}
		}
	}
	if rr.BeforeDelivery > 0 {
		fail("retention deleted %d rows before the broker appended their event; first: %v", rr.BeforeDelivery, rr.Examples)
	}
	if o.LastDeleted > float64(rr.Deleted) {
		fail("the last connector process counted %v rows deleted (%s), the table records %d deletions in all", o.LastDeleted, deletedMetric, rr.Deleted)
	}
	if o.Mode == longMode.Name && rr.Deleted == 0 {
		fail("outbox.retention is %s but retention deleted no row in the whole run", chaosRetention)
	}
}

func earliest(cs []copyRec) time.Time {
	t := cs[0].Append
	for _, c := range cs[1:] {
		if c.Append.Before(t) {
			t = c.Append
		}
	}
	return t
}

// TestCheckRetention: the retention check passes rows deleted after their
// event was appended and fails one deleted before (or never delivered),
// a process's count above the recorded deletions, and a long run that
// deleted nothing.
func TestCheckRetention(t *testing.T) {
	row := func(f *checkFixture, i int, after time.Duration) tableRow {
		return tableRow{Agg: "a", Seq: i + 1, Tbl: "public.outbox", Deleted: f.copies[f.events[i].ID][0].Append.Add(after)}
	}
	for _, tc := range []struct {
		name   string
		mode   mode
		metric float64
		rows   func(f *checkFixture) map[string]tableRow
		want   string // "" passes
	}{
		{"deleted after the append", shortMode, 2, func(f *checkFixture) map[string]tableRow {
			return map[string]tableRow{"e1": row(f, 0, 0), "e2": row(f, 1, time.Second), "e3": {Agg: "a", Seq: 3}}
		}, ""},
		{"deleted before the append", shortMode, -1, func(f *checkFixture) map[string]tableRow {
			return map[string]tableRow{"e1": row(f, 0, time.Second), "e2": row(f, 1, -time.Millisecond)}
		}, "before the broker appended"},
		{"deleted, never delivered", shortMode, -1, func(f *checkFixture) map[string]tableRow {
			delete(f.copies, "e4")
			return map[string]tableRow{"e4": {Agg: "a", Seq: 4, Tbl: "public.outbox", Deleted: time.Now()}}
		}, "e4 (public.outbox a seq 4) deleted"},
		{"a count above the records", shortMode, 3, func(f *checkFixture) map[string]tableRow {
			return map[string]tableRow{"e1": row(f, 0, 0), "e2": row(f, 1, 0)}
		}, "counted 3 rows deleted"},
		{"a long run that deleted nothing", longMode, 0, func(f *checkFixture) map[string]tableRow {
			return map[string]tableRow{"e1": {Agg: "a", Seq: 1}}
		}, "deleted no row"},
		{"a short run that deleted nothing", shortMode, 0, func(f *checkFixture) map[string]tableRow {
			return map[string]tableRow{"e1": {Agg: "a", Seq: 1}}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.o.Mode, f.o.LastDeleted, f.o.Table = tc.mode.Name, tc.metric, tc.rows(f)
			rep := &Report{}
			f.o.checkRetention(rep, f.copies, f.fail)
			switch {
			case tc.want == "" && len(f.fails) > 0:
				t.Fatalf("fails %v", f.fails)
			case tc.want != "" && (len(f.fails) != 1 || !strings.Contains(f.fails[0], tc.want)):
				t.Fatalf("fails %q, want one with %q", f.fails, tc.want)
			}
		})
	}
}
