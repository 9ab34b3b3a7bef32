package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Review of issue 35 (rv): paths where retention deletes a row whose event
// is not proven in Kafka.

// TestReview35HoldReadFailsOpen: a lost slot's hold is stored in
// outbox_cdc.repair_holds; a restart holds nothing in memory until the
// retention loop's first successful read of that table, and a failed read
// "keeps the last one" (none). A read that does not answer (here: the
// table locked by another session; in production a full max_connections,
// since every read opens a new connection, or a lost answer) lets the
// rounds delete every row the hold was to keep.
func TestReview35HoldReadFailsOpen(t *testing.T) {
	const slot, retain = "rv35hold", 2 * time.Second
	dsn, conn, aggType, cfgPath := retentionSetup(t, slot, retain)
	topics := []string{topicFor(aggType)}
	p := startRetention(t, cfgPath)
	delivered := deliverAndStop(t, conn, p, aggType)

	dropStoppedSlot(t, dsn, slot)
	lost := insertRows(t, conn, "outbox", aggType, 10)
	p = startRetention(t, cfgPath) // creates the slot again, stores the hold
	later := insertRows(t, conn, "outbox", aggType, 5)
	consumeN(t, topics, len(delivered)+len(later), time.Minute, 0)
	time.Sleep(3 * retain)
	if n := countIDs(t, conn, lost); n != len(lost) {
		t.Fatalf("%d of the %d held rows deleted by the instance that found the lost slot", len(lost)-n, len(lost))
	}
	stopClean(t, p)
	if n := queryInt(t, conn, "SELECT count(*) FROM outbox_cdc.repair_holds WHERE slot = $1", slot); n != 1 {
		t.Fatalf("%d hold rows for slot %s, want 1", n, slot)
	}

	// Another session holds the holds table (a migration, VACUUM FULL, a
	// stuck statement): the connector's reads of it time out.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE outbox_cdc.repair_holds IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	p = startRetention(t, cfgPath)
	after := insertRows(t, conn, "outbox", aggType, 5)
	consumeN(t, topics, len(delivered)+len(later)+len(after), time.Minute, 0)
	time.Sleep(25 * time.Second) // past two of the hold's 10 s read timeouts
	n := countIDs(t, conn, lost)
	_ = tx.Rollback(ctx)
	stopClean(t, p)
	if !strings.Contains(p.output(), "could not read the lost slots' repair holds") {
		t.Errorf("the connector did not say that it could not read the holds:\n%s", p.output())
	}
	if n != len(lost) {
		t.Errorf("%d of the %d rows the lost slot never delivered (never published: no verify --repair ran) deleted "+
			"while the hold could not be read", len(lost)-n, len(lost))
	}
}

// TestReview35StoppedFlapDuplicatesEOS: in exactly_once the slot is held
// at the first outbox commit whose xid is at or above the guard's Xmin at
// the time of each status update (hold.go), while a checkpoint records the
// Xmin of the moment it was saved (offsets.TableStream.Xmin). Saves trail
// status updates (every 200 ms, 10 s when idle, a failed save keeps the
// last one; a clean stop's now comes before the last confirmation), so the
// slot may pass outbox transactions the checkpoint's bound still covers.
// When the publication changes while the connector is stopped, the start
// records a gap from the checkpoint with that bound and repairs it from the
// table: the rows the slot passed are not decoded again (not "seen"), so
// the repair publishes them a second time.
func TestReview35StoppedFlapDuplicatesEOS(t *testing.T) {
	e := eosBehind(t, "rv35eos")
	// While stopped: the outbox leaves the publication and comes back.
	exec1(t, e.dsn, "ALTER PUBLICATION "+e.slot+" DROP TABLE outbox")
	gap := insertRows(t, e.conn, "outbox", e.aggType, 2)
	exec1(t, e.dsn, "ALTER PUBLICATION "+e.slot+" ADD TABLE outbox")

	p := startProcess(t, e.cfgPath, e.addr)
	ids := concat(e.first, e.held, gap)
	e.checkOnce(t, p, ids)
}

// TestReview35StoppedFlapRepairSkippedEOS: the gap a start records for a
// publication changed while stopped begins at the checkpoint, which in
// exactly_once trails the position committed to Kafka (hold.go, saves that
// lag). The run saves that gap in its checkpoint before the repair commits;
// if it dies then, the next start finds the committed position past the
// gap's Since and concludes "the gap's rows were published before the
// restart" (exactly_once.go): the rows written outside the publication are
// never published, and the gap is cleared (retention may delete them).
func TestReview35StoppedFlapRepairSkippedEOS(t *testing.T) {
	e := eosBehind(t, "rv35eosr")
	exec1(t, e.dsn, "ALTER PUBLICATION "+e.slot+" DROP TABLE outbox")
	gap := insertRows(t, e.conn, "outbox", e.aggType, 2)
	exec1(t, e.dsn, "ALTER PUBLICATION "+e.slot+" ADD TABLE outbox")

	// The repair's read of the table waits (a lock; in production the
	// process may die at any point before the repair's Kafka commit).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	locker, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	ktx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ktx.Exec(ctx, "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, e.cfgPath, e.addr, false)
	waitFor(t, time.Minute, "the gap saved in the checkpoint", func() bool {
		return queryInt(t, e.conn, "SELECT count(*) FROM outbox_cdc.checkpoints WHERE slot = $1 AND gap_since IS NOT NULL", e.slot) == 1
	})
	p.kill()
	_ = ktx.Rollback(ctx)

	p = startProcess(t, e.cfgPath, e.addr)
	e.checkOnce(t, p, concat(e.first, e.held, gap))
}

// eosRun is an exactly_once connector's database whose checkpoint trails
// the slot and the position committed to Kafka; the connector is stopped.
type eosRun struct {
	slot, dsn, cfgPath, addr, aggType, topic string
	conn                                     *pgx.Conn
	first, held                              []string
}

func eosBehind(t *testing.T, slot string) *eosRun {
	t.Helper()
	e := &eosRun{slot: slot, dsn: newDatabase(t), addr: freeAddr(t), aggType: slot + runID}
	createOutbox(t, e.dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, e.dsn, slot)
	e.cfgPath = eosConfig(t, e.dsn, slot, e.addr)
	e.topic = topicFor(e.aggType)
	e.conn = pgConnect(t, e.dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	p := startProcess(t, e.cfgPath, e.addr)
	e.first = insertRows(t, e.conn, "outbox", e.aggType, 3)
	waitFor(t, time.Minute, "the first rows committed in Kafka", func() bool { return len(readIsolated(t, true, e.topic)) >= len(e.first) })

	// A transaction elsewhere holds the guard's Xmin below what follows.
	long, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close(context.Background())
	ltx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ltx.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // guard readings with the long transaction running
	e.held = insertRows(t, e.conn, "outbox", e.aggType, 5)
	var afterHeld string
	if err := e.conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&afterHeld); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the held rows committed in Kafka", func() bool {
		return len(readIsolated(t, true, e.topic)) >= len(e.first)+len(e.held)
	})
	time.Sleep(2 * time.Second) // the checkpoint saves (held back at the first held row)
	lockedKill(ctx, t, e.dsn, e.conn, p, ltx, slot, afterHeld)
	var ckpt, confirmed string
	_ = e.conn.QueryRow(ctx, "SELECT row_to_json(c)::text FROM outbox_cdc.checkpoints c WHERE slot = $1", slot).Scan(&ckpt)
	_ = e.conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed)
	t.Logf("held rows end before %s; slot confirmed at %s; checkpoint %s", afterHeld, confirmed, ckpt)
	return e
}

// checkOnce waits for ids in Kafka (read_committed), stops p cleanly and
// expects each exactly once.
func (e *eosRun) checkOnce(t *testing.T, p *process, ids []string) {
	t.Helper()
	count := func() map[string]int {
		c := map[string]int{}
		for _, r := range readIsolated(t, true, e.topic) {
			if id, ok := header(r, "id"); ok {
				c[id]++
			}
		}
		return c
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		c, all := count(), true
		for _, id := range ids {
			all = all && c[id] > 0
		}
		if all {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	stopClean(t, p)
	c := count()
	var bad []string
	for _, id := range ids {
		if c[id] != 1 {
			bad = append(bad, fmt.Sprintf("%s x%d", id, c[id]))
		}
	}
	if len(bad) > 0 {
		t.Errorf("exactly_once, read_committed: %d of %d events not seen exactly once: %v\n%s", len(bad), len(ids), bad, p.output())
	}
}

// lockedKill makes checkpoint saves fail, ends the long transaction, waits
// until the slot is confirmed past afterHeld and kills the connector.
func lockedKill(ctx context.Context, t *testing.T, dsn string, conn *pgx.Conn, p *process, ltx pgx.Tx, slot, afterHeld string) {
	t.Helper()
	// Saves fail from now on (a lock, a network fault on that connection):
	// the checkpoint keeps the bound of the long transaction.
	locker, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	ktx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ktx.Exec(ctx, "LOCK TABLE outbox_cdc.checkpoints IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	if err := ltx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Before the fix the slot went past the held rows within a second or
	// two (status updates every 100 ms); it must now stay behind them while
	// the checkpoint's bound covers them (pipeline/hold.go savedStreamXmin).
	time.Sleep(5 * time.Second)
	if queryInt(t, conn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn >= $2::pg_lsn",
		slot, afterHeld) == 1 {
		t.Errorf("the slot passed the held rows while the saved checkpoint's bound still covers them: a restart's repair " +
			"would read them and the stream would not decode them again")
	}
	p.kill()
	_ = ktx.Rollback(ctx)

}
