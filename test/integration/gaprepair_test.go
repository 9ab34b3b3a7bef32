package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestGapRepairSkipsOnlyWhatItPublished: the gap repair publishes the rows
// PostgreSQL never decoded and skips, in the transactions the stream
// decodes too, only those rows. Table-less events (outbox.message_prefix)
// of a transaction that also wrote a row during the gap are not rows the
// repair read: they are published. A row inserted inside a SAVEPOINT
// carries the subtransaction's id, not the transaction's: written after the
// fix, it is decoded by the stream and read by the repair, and goes once.
// A row of a rolled-back subtransaction goes nowhere.
func TestGapRepairSkipsOnlyWhatItPublished(t *testing.T) {
	dsn := newDatabase(t)
	if major := serverMajor(t, dsn); major < 14 {
		t.Skipf("outbox.message_prefix needs PostgreSQL 14; server is %d", major)
	}
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "gapmsg"
	cfgPath := writeConfig(t, yamlFor(t, dsn, slot, "outbox: {table: public.outbox, message_prefix: outbox}"))
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Every event has aggregate g: one partition, so once the last one is
	// read everything produced before it is there too.
	row, msg := gapWriters(ctx, t, slot)
	sql := func(tx pgx.Tx, q string) {
		t.Helper()
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
		consumeN(t, []string{topicFor(slot)}, 1, time.Minute, 0)
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	})
	if code != 1 || !strings.Contains(out, "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, out)
	}
	// In the gap: rows the stream never decodes, messages it does.
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-row-1"); msg(tx, "gap-msg-1") })
	committed(t, conn, func(tx pgx.Tx) { msg(tx, "gap-msg-2"); row(tx, "gap-row-2") })
	committed(t, conn, func(tx pgx.Tx) { msg(tx, "gap-msg-only") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	// After the fix, before the restart: decoded by the stream and read by
	// the repair.
	committed(t, conn, func(tx pgx.Tx) { sql(tx, "SAVEPOINT s"); row(tx, "sp-only"); sql(tx, "RELEASE SAVEPOINT s") })
	committed(t, conn, func(tx pgx.Tx) {
		row(tx, "sp-mixed-outer")
		sql(tx, "SAVEPOINT s")
		row(tx, "sp-mixed-inner")
		sql(tx, "RELEASE SAVEPOINT s")
	})
	committed(t, conn, func(tx pgx.Tx) {
		row(tx, "rb-outer")
		sql(tx, "SAVEPOINT s")
		row(tx, "rb-rolled-back")
		sql(tx, "ROLLBACK TO SAVEPOINT s")
		row(tx, "rb-after")
	})
	committed(t, conn, func(tx pgx.Tx) {
		sql(tx, "SAVEPOINT s")
		row(tx, "rb-only-rolled-back")
		sql(tx, "ROLLBACK TO SAVEPOINT s")
		msg(tx, "rb-only-msg")
	})
	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	defer func() {
		if t.Failed() {
			t.Logf("first run:\n%s\nafter the fix:\n%s", out, p.output())
		}
	}()
	// A message: the repair (which may run after this commit) never reads
	// it, so it comes after everything the stream decodes before it.
	committed(t, conn, func(tx pgx.Tx) { msg(tx, "last") })
	got := consumeUntilValue(t, topicFor(slot), `{"n": "last"}`, time.Minute)
	stopClean(t, p)

	count := map[string]int{}
	for _, r := range got {
		count[string(r.Value)]++
	}
	var problems []string
	for _, name := range []string{"before", "gap-row-1", "gap-msg-1", "gap-msg-2", "gap-row-2", "gap-msg-only",
		"sp-only", "sp-mixed-outer", "sp-mixed-inner", "rb-outer", "rb-after", "rb-only-msg", "last"} {
		v := fmt.Sprintf(`{"n": %q}`, name)
		n := count[v]
		delete(count, v)
		switch {
		case n == 0:
			problems = append(problems, name+" missing")
		case n > 1 && name != "before": // before: written after the gap's xmin, sent again (documented)
			problems = append(problems, fmt.Sprintf("%s %d times", name, n))
		}
	}
	for v, n := range count {
		problems = append(problems, fmt.Sprintf("unexpected %s (%d)", v, n))
	}
	slices.Sort(problems)
	if len(problems) > 0 {
		var read []string
		for _, r := range got {
			read = append(read, fmt.Sprintf("%d@%d %s", r.Partition, r.Offset, r.Value))
		}
		t.Fatalf("after the gap repair: %s\nread: %s", strings.Join(problems, "; "), strings.Join(read, ", "))
	}
}

// gapWriters returns what the gap tests write in a transaction: an outbox
// row, and a table-less event (prefix outbox), both of aggregate g (one
// partition) with payload {"n": name}.
func gapWriters(ctx context.Context, t *testing.T, aggType string) (row, msg func(tx pgx.Tx, name string)) {
	row = func(tx pgx.Tx, name string) {
		t.Helper()
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'g', 'E', $2)`, aggType, fmt.Sprintf(`{"n": %q}`, name)); err != nil {
			t.Fatalf("insert %s: %v", name, err)
		}
	}
	msg = func(tx pgx.Tx, name string) {
		t.Helper()
		ev := fmt.Sprintf(`{"id": %q, "aggregate_type": %q, "aggregate_id": "g", "event_type": "E", "payload": {"n": %q}}`,
			name, aggType, name)
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, 'outbox', $1)", ev); err != nil {
			t.Fatalf("emit %s: %v", name, err)
		}
	}
	return row, msg
}

// consumeUntilValue reads topic from the start until a record with value
// last arrives and returns the records up to it.
func consumeUntilValue(t *testing.T, topic, last string, timeout time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var recs []*kgo.Record
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("no record %s on %s within %v; read %d", last, topic, timeout, len(recs))
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if !done {
				recs = append(recs, r)
				done = string(r.Value) == last
			}
		})
		if done {
			return recs
		}
	}
}
