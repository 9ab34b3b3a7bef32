package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReview35bSchemaPublicationOpenWriter: the outbox is a member of the
// publication through FOR TABLES IN SCHEMA (supported: docs/operations.md,
// "Changes while the connector is stopped"). The schema leaves the
// publication while the connector runs (the guard stops it, recording the
// gap); a transaction inserts while it is out and stays open across the
// fix (ALTER PUBLICATION ... ADD TABLES IN SCHEMA). The repair's wait
// (replication/gapwait.go) bounds the writers to wait for by the newest
// xmin of pg_publication_rel / pg_publication / pg_class; ADD TABLES IN
// SCHEMA writes none of them (it writes pg_publication_namespace), so the
// bound lies below the gap and the repair does not wait: its snapshot
// misses the open transaction's row, and the stream never decodes it
// (written while the schema was out). The row was lost; the repair now
// waits for every transaction below the next id when the table is a member
// through its schema.
func TestReview35bSchemaPublicationOpenWriter(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "rv35bschema"
	exec1(t, dsn, "CREATE PUBLICATION "+slot+" FOR TABLES IN SCHEMA public WITH (publish = 'insert', publish_via_partition_root = true)")
	cfgPath := writeConfig(t, yamlFor(t, dsn, slot, "outbox: {table: public.outbox}"))
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	row, _ := gapWriters(ctx, t, slot)
	var open *pgx.Conn
	var held pgx.Tx
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
		consumeN(t, []string{topicFor(slot)}, 1, time.Minute, 0)
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLES IN SCHEMA public")
		// Written while the schema is out, still open when the fix commits.
		open = pgConnect(t, dsn)
		var err error
		if held, err = open.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		row(held, "held")
	})
	if code != 1 {
		t.Fatalf("exit %d, want 1 (the outbox left the publication):\n%s", code, out)
	}
	t.Logf("first run exit %d: %s", code, lastLines(out, 5))
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-0") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLES IN SCHEMA public")

	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, false, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	defer func() {
		if t.Failed() {
			t.Logf("after the fix:\n%s", p.output())
		}
	}()
	// The repair waits for "held" (before the fix it read the table at
	// once, and "held" was lost).
	probe := pgConnect(t, dsn)
	waitRepairWaits(ctx, t, probe, p, time.Minute)
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed(t, conn, func(tx pgx.Tx) { row(tx, "after") })
	got := consumeUntilValue(t, topicFor(slot), `{"n": "after"}`, 2*time.Minute)
	stopClean(t, p)
	count := map[string]int{}
	for _, r := range got {
		count[string(r.Value)]++
	}
	for _, name := range []string{"before", "gap-0", "held", "after"} {
		if n := count[fmt.Sprintf(`{"n": %q}`, name)]; n == 0 {
			t.Errorf("%s never published (committed row, lost)", name)
		}
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
