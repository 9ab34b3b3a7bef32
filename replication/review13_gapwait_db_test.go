package replication

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// review13 harness, self-contained (it also runs on the tree before
// 4bd2e73, where it passes).
type review13 struct {
	t     *testing.T
	ctx   context.Context
	dsn   string
	conn  *pgx.Conn
	table string
	src   Source
}

func newReview13(t *testing.T, name string) *review13 {
	ctx, pg, conn := startServer(t)
	r := &review13{t: t, ctx: ctx, dsn: pg.DSN("postgres"), conn: conn, table: fmt.Sprintf("%s_%d", name, time.Now().UnixNano()%1e9)}
	r.exec(conn, `CREATE TABLE `+r.table+reviewOutboxDDL)
	r.src = Source{DB: mustDB(t, r.dsn), Publication: r.table, OutboxTable: OutboxTable{Schema: "public", Table: r.table}}
	return r
}

func (r *review13) exec(c *pgx.Conn, sql string) {
	r.t.Helper()
	if _, err := c.Exec(r.ctx, sql); err != nil {
		r.t.Fatalf("%s: %v", sql, err)
	}
}

func (r *review13) connect() *pgx.Conn {
	r.t.Helper()
	c, err := pgx.Connect(r.ctx, r.dsn)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func (r *review13) insert(c interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string) uint64 {
	r.t.Helper()
	var xid uint64
	if err := c.QueryRow(r.ctx, "INSERT INTO "+r.table+" (aggregate_type, aggregate_id, event_type) VALUES ('o', 'a', $1) "+
		"RETURNING xmin::text::bigint", name).Scan(&xid); err != nil {
		r.t.Fatal(err)
	}
	return xid
}

type review13Result struct {
	got []string
	g   Gap
	err error
}

// read runs GapRows in a goroutine (it may wait for the gap's writers).
func (r *review13) read(xmin uint64, done offsets.RepairedRows) <-chan review13Result {
	ch := make(chan review13Result, 1)
	go func() {
		m := decode.Mapping{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"}
		rows, g, err := r.src.GapRows(r.ctx, xmin, done, offsets.FinishedTxns{}, []RowSpec{{Mapping: m}}, nil)
		if err != nil {
			ch <- review13Result{err: err}
			return
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			ev, err := rows.Event()
			if err != nil {
				ch <- review13Result{err: err}
				return
			}
			got = append(got, string(ev.EventType.Bytes))
		}
		ch <- review13Result{got, g, rows.Err()}
	}()
	return ch
}

func (r *review13) waitForWait() {
	r.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := r.conn.QueryRow(r.ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%the gap repair waits%' "+
			"AND pid <> pg_backend_pid()").Scan(&n); err != nil {
			r.t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatal("the repair did not wait within 30 s")
		}
	}
}

func (r *review13) result(ch <-chan review13Result) review13Result {
	r.t.Helper()
	select {
	case res := <-ch:
		if res.err != nil {
			r.t.Fatal(res.err)
		}
		return res
	case <-time.After(30 * time.Second):
		r.t.Fatal("the repair did not return within 30 s")
	}
	return review13Result{}
}

// TestGapRowsReview13UpdatedGapRowLeftOut (review13, LOSS, deterministic).
//
// The repair finds a row by the xmin of its live version. A gap row that
// another transaction U UPDATEs (a status column, an upsert's ON CONFLICT
// DO UPDATE, any housekeeping) gets a new version whose xmin is U. U took
// its lock on the outbox after the repair read the lock holders (it ran
// during the repair's wait), so laterTxns leaves U out ("the stream
// decodes it"); but the stream decodes an UPDATE as nothing (decode skips
// Update, docs/contract.md "UPDATEs ... publish nothing"). The gap row is
// published by neither.
//
// Before 4bd2e73 the repair read it (U >= the bound, committed before the
// snapshot): this test passes on 0946c58.
func TestGapRowsReview13UpdatedGapRowLeftOut(t *testing.T) {
	r := newReview13(t, "review13_upd")
	bound := r.insert(r.conn, "gap-committed") // written while the table was outside the publication
	w := r.connect()
	wtx, err := w.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer wtx.Rollback(context.Background())
	r.insert(wtx, "gap-open") // a gap writer still open: the repair waits for it
	r.exec(r.conn, "CREATE PUBLICATION "+r.table+" FOR TABLE "+r.table)

	ch := r.read(bound, offsets.RepairedRows{})
	r.waitForWait()
	// During the wait, U marks the committed gap row (autocommit).
	r.exec(r.connect(), "UPDATE "+r.table+` SET payload = '{"status": "seen"}' WHERE event_type = 'gap-committed'`)
	if err := wtx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	res := r.result(ch)
	t.Logf("the repair read %v", res.got)
	if !slices.Contains(res.got, "gap-committed") {
		t.Errorf("LOSS: the gap row updated during the repair's wait is not read (%v): its live version's xmin is the "+
			"updater's, which laterTxns leaves to the stream, and the stream publishes nothing for an UPDATE", res.got)
	}
}

// TestGapRowsReview13ReadClaimsLeftOutWriter (review13, LOSS in
// exactly_once via repair.resolved, and in at_least_once when the first
// repair published nothing).
//
// Gap.Read says the repair read every row of a transaction in [Xmin,
// Below) (Below: the snapshot's xmin). laterTxns now leaves out
// transactions that ended before the snapshot, yet Read still claims
// them. If the outbox leaves the publication again during the first
// repair's wait (a second gap; the guard finds it and records
// Pending.Later <= T), a transaction T that began after the repair's
// reading writes undecodable rows and commits before the snapshot: the
// first repair leaves T out, its Read claims T, and the restart (the first
// repair in Kafka: resolved() sets Xmin = Later, Repaired = Pending.Rows)
// reads from Later leaving out Read: T's row is read by no repair and never
// decoded. The same class as TestGapRowsReviewSubtransactionRowNotRepaired,
// which made Below the snapshot's xmin so that Read claims only what it
// read.
//
// Passes on 0946c58 (the first repair reads T's row).
func TestGapRowsReview13ReadClaimsLeftOutWriter(t *testing.T) {
	r := newReview13(t, "review13_claim")
	first := r.insert(r.conn, "gap-a") // the first gap's row
	w := r.connect()
	wtx, err := w.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer wtx.Rollback(context.Background())
	r.insert(wtx, "gap-a-open") // the first gap's writer, open: the first repair waits
	r.exec(r.conn, "CREATE PUBLICATION "+r.table+" FOR TABLE "+r.table)

	ch := r.read(first, offsets.RepairedRows{})
	r.waitForWait()
	// The second gap: the outbox leaves the publication again; T begins
	// now, writes (never decoded) and commits; the table comes back.
	r.exec(r.conn, "ALTER PUBLICATION "+r.table+" DROP TABLE "+r.table)
	tx := r.insert(r.connect(), "gap-b")
	r.exec(r.conn, "ALTER PUBLICATION "+r.table+" ADD TABLE "+r.table)
	if err := wtx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	r1 := r.result(ch)
	t.Logf("first repair read %v, Read %+v; T = %d", r1.got, r1.g.Read, tx)
	claimed := tx >= r1.g.Read.Xmin && tx < r1.g.Read.Below || slices.Contains(offsets.SplitXids(r1.g.Read.Xids), int64(tx))

	// The restart: the first repair is in Kafka; the gap is read from
	// Later (<= T, the guard's bound when it found the second gap)
	// leaving out what the first repair's record says it read.
	r2 := r.result(r.read(tx, r1.g.Read))
	t.Logf("second repair read %v", r2.got)
	if !slices.Contains(r1.got, "gap-b") && !slices.Contains(r2.got, "gap-b") {
		t.Errorf("LOSS: T's row, written in the second gap, is read by neither repair (claimed by the first's Read: %v)", claimed)
	}
}

// TestGapRowsReview13TableRewriteLeftOut (review13, LOSS, deterministic).
//
// A table-rewriting ALTER TABLE on the outbox (a type change of an
// unmapped column, or ADD COLUMN with a volatile default: "keeps flowing"
// in docs/operations.md) writes every row again with the ALTER's own id as
// xmin (ALTER TABLE rewrites are not MVCC-safe). Run during the repair's
// wait, it queues behind the gap's writer for its ACCESS EXCLUSIVE lock, so
// the holders reading sees its lock not granted (not a holder), and it
// takes its id once it gets the lock (after the reading: at or above
// xmax). The writer commits, the ALTER rewrites and commits at once, and
// the repair's snapshot (polled every 100 ms) follows it: every row of the
// table now carries the ALTER's id, which laterTxns leaves to the stream,
// which decodes no row of a rewrite. The repair reads nothing: every gap
// row is lost.
//
// Before 4bd2e73 the repair read every row (the gap's, and the older ones
// as copies): this test passes on 0946c58.
func TestGapRowsReview13TableRewriteLeftOut(t *testing.T) {
	r := newReview13(t, "review13_rewrite")
	r.exec(r.conn, "ALTER TABLE "+r.table+" ADD COLUMN extra int")
	bound := r.insert(r.conn, "gap-committed")
	w := r.connect()
	wtx, err := w.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer wtx.Rollback(context.Background())
	r.insert(wtx, "gap-open")
	r.exec(r.conn, "CREATE PUBLICATION "+r.table+" FOR TABLE "+r.table)

	ch := r.read(bound, offsets.RepairedRows{})
	r.waitForWait()
	alter := make(chan error, 1)
	a := r.connect()
	go func() {
		_, err := a.Exec(r.ctx, "ALTER TABLE "+r.table+" ALTER COLUMN extra TYPE bigint") // a rewrite
		alter <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := r.conn.QueryRow(r.ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'ALTER TABLE%' AND wait_event_type = 'Lock'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ALTER did not queue behind the gap's writer")
		}
	}
	if err := wtx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-alter; err != nil {
		t.Fatal(err)
	}
	res := r.result(ch)
	t.Logf("the repair read %v", res.got)
	for _, want := range []string{"gap-committed", "gap-open"} {
		if !slices.Contains(res.got, want) {
			t.Errorf("LOSS: gap row %s not read after a table rewrite during the repair's wait (read %v): the rewrite gave it "+
				"the ALTER's id, which the repair leaves to the stream", want, res.got)
		}
	}
}

// TestGapRowsReview13ReleasedSavepointAboveXmax (review13, LOSS,
// deterministic).
//
// A released savepoint's subtransaction gives up its xid lock (xact.c,
// CommitSubTransaction: "The only lock we actually release here is the
// subtransaction XID lock"), so its id is never among the lock holders,
// and subtransaction ids are never in a snapshot's xip: laterTxns keeps
// such a row only when its id is below the reading's xmax. A writer H in
// the documented "above" window (it takes its id after the ALTER
// PUBLICATION ... ADD TABLE did and inserts before that commits; the
// wait's outboxLockHolders part exists for it, review2/review3) that
// inserts inside a savepoint (an ORM's nested transaction) and releases
// it, has a row whose xmin S is above every ended id: no transaction with
// a higher id ends before the repair's reading (the cluster is quiet, H
// still open). The repair waits for H (a holder), then leaves S's row
// out (S >= xmax, not held); the stream never decodes it (written before
// the re-add committed). Before 4bd2e73 the repair read it (passes on
// 0946c58).
func TestGapRowsReview13ReleasedSavepointAboveXmax(t *testing.T) {
	r := newReview13(t, "review13_relsp")
	r.exec(r.conn, "CREATE TABLE "+r.table+"_other (x int)")
	r.exec(r.conn, "CREATE PUBLICATION "+r.table+" FOR TABLE "+r.table+"_other") // the outbox is out: the gap
	bound := r.insert(r.conn, "gap-committed")

	readd := r.connect()
	rtx, err := readd.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rtx.Rollback(context.Background())
	var upper uint64
	if _, err := rtx.Exec(r.ctx, "ALTER PUBLICATION "+r.table+" ADD TABLE "+r.table); err != nil {
		t.Fatal(err)
	}
	if err := rtx.QueryRow(r.ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&upper); err != nil {
		t.Fatal(err)
	}
	h := r.connect()
	htx, err := h.Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer htx.Rollback(context.Background())
	var top uint64
	if err := htx.QueryRow(r.ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&top); err != nil {
		t.Fatal(err)
	}
	if _, err := htx.Exec(r.ctx, "SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	sub := r.insert(htx, "gap-in-released-savepoint") // before the re-add commits: never decoded
	if _, err := htx.Exec(r.ctx, "RELEASE SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	if err := rtx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("re-add %d, writer %d, its savepoint's id %d", upper, top, sub)

	ch := r.read(bound, offsets.RepairedRows{})
	r.waitForWait() // for H: a holder above the re-add's id
	if err := htx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	res := r.result(ch)
	t.Logf("the repair read %v", res.got)
	if !slices.Contains(res.got, "gap-in-released-savepoint") {
		t.Errorf("LOSS: the row of a released savepoint (id %d, above the reading's xmax, its xid lock gone) is left out (read %v)", sub, res.got)
	}
}

// TestGapRowsReview13OrderByColumnMissing (review13, HANG: the connector
// stops at the gap on every start). snapshot.order_by is checked against
// the tables only when the slot is created (plan.go, CheckSnapshotOrder);
// an unmapped column may be dropped later ("keeps flowing"), or a table
// added to outbox.tables without it. The repair now orders by it: its
// query fails with 42703, which is not Transient, so runBackfill returns
// the error; the next start reaches the gap and fails the same way.
// Before 4bd2e73 the repair did not use the column.
func TestGapRowsReview13OrderByColumnMissing(t *testing.T) {
	r := newReview13(t, "review13_orderby")
	bound := r.insert(r.conn, "gap-committed") // the table has no column pos
	r.exec(r.conn, "CREATE PUBLICATION "+r.table+" FOR TABLE "+r.table)
	m := decode.Mapping{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"}
	rows, _, err := r.src.GapRows(r.ctx, bound, offsets.RepairedRows{}, offsets.FinishedTxns{}, []RowSpec{{Mapping: m, OrderBy: "pos"}}, nil)
	if err == nil {
		rows.Close()
		return
	}
	t.Errorf("the repair fails (transient: %v, so the connector stops and fails again at the next start): %v", Transient(err), err)
}
