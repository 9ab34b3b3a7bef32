package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestGapRepairSurvivesServerRestart: the gap repair waits for a
// transaction that was open when the outbox came back into the
// publication (replication/gapwait.go), and the server restarts while it
// waits. The restart ends the open transaction and the repair's
// connection; the repair connects again and reads the table then, as the
// stream reconnects: the connector keeps running and publishes every row
// of the gap once. (A chaos run found it exiting 1 on the lost connection.)
func TestGapRepairSurvivesServerRestart(t *testing.T) {
	if pgServer.External() {
		t.Skip("PostgreSQL is external (OUTBOX_CDC_TEST_PG_DSN): cannot restart it")
	}
	ensurePostgresRunning(t)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "gaprestart"
	cfgPath := writeConfig(t, yamlFor(t, dsn, slot, "outbox: {table: public.outbox}"))
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	row, _ := gapWriters(ctx, t, slot)
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
		consumeN(t, []string{topicFor(slot)}, 1, time.Minute, 0)
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	})
	if code != 1 || !strings.Contains(out, "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, out)
	}
	for i := range 3 {
		committed(t, conn, func(tx pgx.Tx) { row(tx, fmt.Sprintf("gap-%d", i)) })
	}
	// Open across the fix: the repair waits for it.
	open := pgConnect(t, dsn)
	held, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	row(held, "held")
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	conn.Close(ctx)

	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, false, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	defer func() {
		if t.Failed() {
			t.Logf("first run:\n%s\nafter the fix:\n%s", out, p.output())
		}
	}()
	// The repair's wait polls the running transactions.
	probe := pgConnect(t, dsn)
	waitRepairWaits(ctx, t, probe, p, time.Minute)
	if err := pgServer.Crash(); err != nil {
		t.Fatalf("crash: %v", err)
	}
	if err := pgServer.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	conn = pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "after") })
	got := consumeUntilValue(t, topicFor(slot), `{"n": "after"}`, 2*time.Minute)
	if p.proc.Exited() {
		t.Fatalf("the connector exited: %v", p.proc.Err())
	}
	stopClean(t, p)
	if !strings.Contains(p.output(), "the gap repair lost its connection") {
		t.Errorf("the restart did not reach the repair while it waited")
	}

	count := map[string]int{}
	for _, r := range got {
		count[string(r.Value)]++
	}
	for _, name := range []string{"gap-0", "gap-1", "gap-2", "after"} {
		if n := count[fmt.Sprintf(`{"n": %q}`, name)]; n != 1 {
			t.Errorf("%s published %d times, want once", name, n)
		}
	}
	if n := count[`{"n": "held"}`]; n != 0 {
		t.Errorf("the row of the transaction the crash rolled back was published %d times", n)
	}
}
