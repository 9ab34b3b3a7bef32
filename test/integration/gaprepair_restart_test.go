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
// A fast shutdown waits for the walsender, which waits for the stream's
// confirmations while the stream waits for the repair: the repair drops the
// stream's session (a chaos run found it holding the shutdown 10 s, then
// exiting 1).
func TestGapRepairSurvivesServerRestart(t *testing.T) {
	t.Run("crash", func(t *testing.T) {
		gapRepairServerRestart(t, "gaprestart", false, func() error { return pgServer.Crash() })
	})
	t.Run("fast shutdown", func(t *testing.T) {
		gapRepairServerRestart(t, "gapfaststop", true, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return pgServer.Stop(ctx)
		})
	})
}

// gapRepairServerRestart runs TestGapRepairSurvivesServerRestart; stop
// stops the server. bulk: the stream's queue (1 MiB) is full when it stops,
// so the walsender has WAL left to send.
func gapRepairServerRestart(t *testing.T, slot string, bulk bool, stop func() error) {
	if pgServer.External() {
		t.Skip("PostgreSQL is external (OUTBOX_CDC_TEST_PG_DSN): cannot restart it")
	}
	ensurePostgresRunning(t)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	cfgPath := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: %s, publication: %s, queue_bytes: 1048576}\n"+
		"kafka: {brokers: [%s], dlq_topic: %s, topic: %q}\nhttp: {listen: ''}\noutbox: {table: public.outbox}\n",
		dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate))
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
	// The stream reaches the gap inside this transaction: its position is
	// not confirmed while the repair waits.
	committed(t, conn, func(tx pgx.Tx) { row(tx, "post") })
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
	if bulk {
		exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT $1, 'g', 'E', jsonb_build_object('n', 'bulk', 'pad', repeat('x', 2000)) FROM generate_series(1, 10000)`, slot)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
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
	for _, name := range []string{"gap-0", "gap-1", "gap-2", "post", "after"} {
		if n := count[fmt.Sprintf(`{"n": %q}`, name)]; n != 1 {
			t.Errorf("%s published %d times, want once", name, n)
		}
	}
	if n := count[`{"n": "held"}`]; n != 0 {
		t.Errorf("the row of the transaction the crash rolled back was published %d times", n)
	}
}
