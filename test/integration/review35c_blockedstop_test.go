package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReview35cBlockedStartStopsClean: exactly_once, a change while stopped,
// and the checkpoint's row busy (a store that does not answer): the start
// waits for the pre-stream save (checkpointer.beforeStream). A SIGTERM then ends the
// run at once with exit 0, and the next start (store answering again)
// repairs the gap once.
func TestReview35cBlockedStartStopsClean(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	slot := "rv35cblocked"
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	cfgPath := eosConfig(t, dsn, slot, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("rv35cblk%d", dbCounter.Add(1))
	topic := topicFor(agg)
	row, _ := gapWriters(ctx, t, agg)
	conn := pgConnect(t, dsn)
	var logs []string
	defer func() {
		if t.Failed() {
			t.Logf("connector logs:\n%s", strings.Join(logs, "\n----\n"))
		}
	}()
	visible := func(name string) int { return copiesOf(t, topic, name) }
	p := startProcess(t, cfgPath, addr)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
	waitFor(t, time.Minute, "before visible", func() bool { return visible("before") == 1 })
	stopClean(t, p)
	logs = append(logs, p.output())

	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-0") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")

	locker := pgConnect(t, dsn)
	ltx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ltx.Exec(ctx, "SELECT 1 FROM outbox_cdc.checkpoints WHERE slot = $1 FOR UPDATE", slot); err != nil {
		t.Fatal(err)
	}
	p = startProc(t, cfgPath, addr, false)
	waitFor(t, 2*time.Minute, "the start waiting for its save", func() bool {
		if p.proc.Exited() {
			t.Fatalf("exited: %v\n%s", p.proc.Err(), p.output())
		}
		return strings.Contains(p.output(), "the gap found at start is not saved yet")
	})
	began := time.Now()
	err = p.proc.Stop(30 * time.Second)
	logs = append(logs, p.output())
	if err != nil {
		t.Errorf("SIGTERM while the start waits for its save: %v (after %v)", err, time.Since(began))
	}
	t.Logf("stopped %v after SIGTERM", time.Since(began))
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	p = startProcess(t, cfgPath, addr)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "after") })
	waitFor(t, time.Minute, "after visible", func() bool { return visible("after") == 1 })
	stopClean(t, p)
	logs = append(logs, p.output())
	for _, name := range []string{"before", "gap-0", "after"} {
		if n := visible(name); n != 1 {
			t.Errorf("%s: %d copies for read_committed, want 1", name, n)
		}
	}
}
