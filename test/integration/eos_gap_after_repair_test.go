package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestExactlyOnceGapBeforeRepairCleared: exactly_once. The outbox left the
// publication while the connector was stopped; the next run's repair
// publishes the rows written meanwhile and commits in Kafka, and before a
// checkpoint clears that gap the outbox leaves the publication again. The
// two gaps are recorded as one. The start after the second fix must read
// only the second gap's rows: the first repair's rows were never
// decodable, so nothing in the stream says they are in Kafka. The long
// exactly_once chaos run (seed 12424546033271313958) sent 2,288 copies
// this way after two publication changes 2 s apart.
//
// What keeps the first gap recorded here is a long transaction with an id
// (a report, a migration): the slot and the checkpoint are held at the
// first outbox transaction above its id (pipeline/hold.go), which commits
// before the repair's rows, so no save passes them.
//
// Before the fix this run often passed anyway: the restart looked the
// repair's rows up in Kafka by time (a read-back of the last minute, when
// the history mark lags the committed position). So the test asserts that
// the restart decides from the gap's record, as it must once the rows are
// older than that minute.
func TestExactlyOnceGapBeforeRepairCleared(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "eosgaptwice"
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	cfgPath := eosConfig(t, dsn, slot, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("eosgaptwice%d", dbCounter.Add(1))
	topic := topicFor(agg)
	row, _ := gapWriters(ctx, t, agg)
	conn := pgConnect(t, dsn)

	p := startProcess(t, cfgPath, addr)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
	waitFor(t, time.Minute, "before visible", func() bool { return copiesOf(t, topic, "before") == 1 })
	stopClean(t, p)

	// While stopped: out of the publication and back, rows in between,
	// and a writer open across the fix (the repair waits for it).
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	for i := range 3 {
		committed(t, conn, func(tx pgx.Tx) { row(tx, fmt.Sprintf("flap-%d", i)) })
	}
	wtx, err := pgConnect(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	row(wtx, "held")
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	long, err := pgConnect(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := long.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	committed(t, conn, func(tx pgx.Tx) { row(tx, "post") }) // the stream reaches the gap

	p = startProc(t, cfgPath, addr, false, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	waitRepairWaits(ctx, t, conn, p, time.Minute)
	if err := wtx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the first repair committed in Kafka", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		return copiesOf(t, topic, "flap-2") == 1 && copiesOf(t, topic, "held") == 1
	})

	// Out again, before any save clears the first gap.
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap2") })
	select {
	case <-p.done:
	case <-ctx.Done():
		t.Fatalf("the connector did not stop when the outbox left the publication:\n%s", p.output())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(p.output(), "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, p.output())
	}
	if strings.Contains(p.output(), "gap repaired") {
		t.Fatalf("the first gap was cleared before the second was found: the case is not set up\n%s", p.output())
	}
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")

	p = startProcess(t, cfgPath, addr)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "after") })
	waitFor(t, time.Minute, "after visible", func() bool { return copiesOf(t, topic, "after") == 1 })
	stopClean(t, p)
	if !strings.Contains(p.output(), `msg="the gap records a repair handed over to Kafka"`) ||
		!strings.Contains(p.output(), "in_kafka=true") {
		t.Errorf("the restart did not find the first repair in the gap's record")
	}
	for _, name := range []string{"before", "flap-0", "flap-1", "flap-2", "held", "post", "gap2", "after"} {
		if n := copiesOf(t, topic, name); n != 1 {
			t.Errorf("%s: %d copies for read_committed, want 1", name, n)
		}
	}
	if t.Failed() {
		t.Logf("the start after the second gap:\n%s", p.output())
	}
}
