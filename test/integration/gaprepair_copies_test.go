package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestGapRepairStoppedChangeKeepsGapBound: in at_least_once, the outbox
// leaves the publication while the connector runs (it records the gap and
// exits 1) and comes back while it is stopped, which the restart also
// finds as a change while stopped. The repair goes where the stream
// reaches the gap, after the stream's replay from its start; its bound is
// the gap's. It was lowered to the floor of the checkpoint's position,
// which a long transaction since ended held below rows delivered long
// before (r*): those went again after the replayed s*, and the key then
// jumped to the gap's rows (short chaos seed 16213174281140426822, 17
// keys). The checkpoint here goes back to r10 with the floor it had there,
// as acknowledgements that lag behind the gap leave it.
func TestGapRepairStoppedChangeKeepsGapBound(t *testing.T) {
	e := newCopiesEnv(t, "gapfloor")
	ctx, dsn, conn, slot, early, cfgPath, long := e.ctx, e.dsn, e.conn, e.slot, e.early, e.cfgPath, e.long
	write := func(name string) { e.write(t, name) }
	var ckptEarly lsn.LSN
	var floorEarly, longXid int64
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		long.takeID() // below every r*: the floor stays there while it runs
		if err := long.tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&longXid); err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 10; i++ {
			write(fmt.Sprintf("r%d", i))
		}
		consumeUntilValue(t, topicFor(slot), `{"n": "r10"}`, time.Minute)
		end := currentLSN(t, conn)
		waitFor(t, 30*time.Second, "slot and checkpoint past r10", func() bool {
			return slotConfirmed(t, dsn, slot) >= end && checkpointLSN(t, conn, slot) >= end
		})
		exec1(t, dsn, fmt.Sprintf("SELECT pg_copy_logical_replication_slot('%s', '%s')", slot, early))
		if err := conn.QueryRow(ctx, "SELECT lsn::text, coalesce(floor_xid, 0) FROM outbox_cdc.checkpoints WHERE slot = $1",
			slot).Scan(&ckptEarly, &floorEarly); err != nil {
			t.Fatal(err)
		}
		long.commit() // the gap's readings come after it
		for i := 1; i <= 10; i++ {
			write(fmt.Sprintf("s%d", i))
		}
		consumeUntilValue(t, topicFor(slot), `{"n": "s10"}`, time.Minute)
		end = currentLSN(t, conn)
		waitFor(t, 30*time.Second, "checkpoint past s10", func() bool { return checkpointLSN(t, conn, slot) >= end })
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	})
	if code != 1 || !strings.Contains(out, "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, out)
	}
	if floorEarly == 0 || floorEarly > longXid {
		t.Fatalf("the premise: the checkpoint at r10 has floor %d, want one at or below the long transaction's id %d", floorEarly, longXid)
	}
	for i := 1; i <= 3; i++ { // rows the stream never decodes
		write(fmt.Sprintf("g%d", i))
	}
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	dropReleasedSlot(t, dsn, slot)
	exec1(t, dsn, fmt.Sprintf("SELECT pg_copy_logical_replication_slot('%s', '%s')", early, slot))
	exec1(t, dsn, fmt.Sprintf("UPDATE outbox_cdc.checkpoints SET lsn = '%v', floor_xid = %d WHERE slot = '%s'", ckptEarly, floorEarly, slot))

	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	defer func() {
		if t.Failed() {
			t.Logf("after the gap:\n%s", p.output())
		}
	}()
	write("last")
	got := consumeUntilValue(t, topicFor(slot), `{"n": "last"}`, time.Minute)
	stopClean(t, p)

	checkReplayedStrict(t, e.order, got)
}

// TestGapRepairAtLeastOnceCopiesInOrder: in at_least_once, a transaction
// open across a publication gap holds the gap's bound below rows delivered
// long before it (r*). The restart's stream, resuming behind the gap (the
// last saves were lost, as in a crash), replays newer rows (s*) before it
// reaches the gap; a repair that read r* again sent them after s*, and the
// key then jumped to the gap's rows (long chaos seed 10167240380432169663:
// 19 keys). The repair leaves out the transactions that had ended at the
// reading behind the gap's position: the stream decodes them, or delivered
// them before its start.
func TestGapRepairAtLeastOnceCopiesInOrder(t *testing.T) {
	e := newCopiesEnv(t, "gapcopies")
	dsn, conn, slot, early, cfgPath, long := e.dsn, e.conn, e.slot, e.early, e.cfgPath, e.long
	write := func(name string) { e.write(t, name) }
	var ckptEarly lsn.LSN
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		long.takeID() // below every row's id: the gap's bound stays below them
		for i := 1; i <= 20; i++ {
			write(fmt.Sprintf("r%d", i))
		}
		consumeUntilValue(t, topicFor(slot), `{"n": "r20"}`, time.Minute)
		end := currentLSN(t, conn)
		waitFor(t, 30*time.Second, "slot and checkpoint past r20", func() bool {
			return slotConfirmed(t, dsn, slot) >= end && checkpointLSN(t, conn, slot) >= end
		})
		exec1(t, dsn, fmt.Sprintf("SELECT pg_copy_logical_replication_slot('%s', '%s')", slot, early))
		ckptEarly = checkpointLSN(t, conn, slot)
		for i := 1; i <= 20; i++ {
			write(fmt.Sprintf("s%d", i))
		}
		consumeUntilValue(t, topicFor(slot), `{"n": "s20"}`, time.Minute)
		end = currentLSN(t, conn)
		waitFor(t, 30*time.Second, "checkpoint past s20", func() bool { return checkpointLSN(t, conn, slot) >= end })
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	})
	if code != 1 || !strings.Contains(out, "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, out)
	}
	for i := 1; i <= 3; i++ { // rows the stream never decodes
		write(fmt.Sprintf("g%d", i))
	}
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	// The slot and the checkpoint go back to r20, as a crash that lost the
	// saves since does; the checkpoint keeps the gap.
	dropReleasedSlot(t, dsn, slot)
	exec1(t, dsn, fmt.Sprintf("SELECT pg_copy_logical_replication_slot('%s', '%s')", early, slot))
	exec1(t, dsn, fmt.Sprintf("UPDATE outbox_cdc.checkpoints SET lsn = '%v' WHERE slot = '%s'", ckptEarly, slot))

	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	defer func() {
		if t.Failed() {
			t.Logf("after the gap:\n%s", p.output())
		}
	}()
	long.commit() // the repair waits for what was open when it began
	write("last")
	got := consumeUntilValue(t, topicFor(slot), `{"n": "last"}`, time.Minute)
	stopClean(t, p)
	checkReplayedStrict(t, e.order, got)
}

// copiesEnv is a new database's outbox with one aggregate's writer, the
// connector's configuration for slot, and a long transaction: the setup
// of the tests of a repair's copies.
type copiesEnv struct {
	ctx              context.Context
	dsn, slot, early string
	cfgPath          string
	conn             *pgx.Conn
	row              func(pgx.Tx, string)
	long             *longTxn
	order            []string // every row, in commit order (one aggregate, one writer)
}

func newCopiesEnv(t *testing.T, slot string) *copiesEnv {
	t.Helper()
	e := &copiesEnv{dsn: newDatabase(t), slot: slot, early: slot + "_early"}
	createOutbox(t, e.dsn, "outbox", "jsonb")
	e.cfgPath = writeConfig(t, yamlFor(t, e.dsn, slot, "outbox: {table: public.outbox}"))
	dropSlotAtEnd(t, e.dsn, e.early)
	e.conn = pgConnect(t, e.dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	e.ctx = ctx
	e.row, _ = gapWriters(ctx, t, slot)
	e.long = beginLong(ctx, t, e.dsn, slot, 9, 0)
	return e
}

// write commits one row named name.
func (e *copiesEnv) write(t *testing.T, name string) {
	t.Helper()
	committed(t, e.conn, func(tx pgx.Tx) { e.row(tx, name) })
	e.order = append(e.order, name)
}
