package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReview35cStandbyStaleSaveEOS: exactly_once, two instances on one
// slot. The standby B loads the checkpoint in setup, then waits in
// waitSlotFree while A streams. A moves the checkpoint on and stops
// cleanly; while both are stopped the outbox leaves the publication and
// comes back, with rows written in between. B then starts from the
// checkpoint it loaded long before (stale), finds the change
// (streamChangedWhileStopped) and saves before streaming
// (checkpointer.beforeStream): the save is older than A's and the store answers
// ErrStale, which saveCheckpointAs reports as wrote=true; the stream starts
// with the gap and the new stream state recorded nowhere. B repairs and
// commits in Kafka. Its later saves (held back here by a row lock, as a
// slow server would; without it the hold keeps them below A's position)
// never record the gap either. After a SIGKILL the next start finds A's
// checkpoint (old stream state, no gap), finds the same change again and
// publishes the gap's rows a second time: read_committed sees 2 copies.
// (Fixed: an exactly_once standby now waits for the slot before it reads
// the checkpoint, and a pre-stream save refused as stale stops the run.)
func TestReview35cStandbyStaleSaveEOS(t *testing.T) {
	for _, lock := range []bool{true, false} {
		t.Run(fmt.Sprintf("slow_save=%v", lock), func(t *testing.T) { standbyStaleSave(t, lock) })
	}
}

func standbyStaleSave(t *testing.T, lock bool) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	slot := fmt.Sprintf("rv35cstale%v", lock)
	addrA, addrB := freeAddr(t), freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	cfgA := eosConfig(t, dsn, slot, addrA)
	cfgB := eosConfig(t, dsn, slot, addrB)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("rv35cstale%d", dbCounter.Add(1))
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
	ckpt := func() (lsn string, gap *string, stream string) {
		var s *string
		if err := conn.QueryRow(ctx, "SELECT lsn::text, gap_since::text, stream_state FROM outbox_cdc.checkpoints WHERE slot = $1", slot).
			Scan(&lsn, &gap, &s); err != nil {
			t.Fatalf("read checkpoint: %v", err)
		}
		if s != nil {
			stream = *s
		}
		return lsn, gap, stream
	}

	a := startProcess(t, cfgA, addrA)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
	waitFor(t, time.Minute, "before visible", func() bool { return visible("before") == 1 })
	time.Sleep(time.Second)
	l0, _, _ := ckpt()

	// The standby: it loads the checkpoint, then waits for the slot.
	b := startProc(t, cfgB, addrB, false)
	waitFor(t, time.Minute, "the standby waiting for the slot", func() bool {
		if b.proc.Exited() {
			t.Fatalf("standby exited: %v\n%s", b.proc.Err(), b.output())
		}
		return strings.Contains(b.output(), "another connector streams from the slot")
	})
	// Held where it waits (a slow host), while A goes on.
	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		committed(t, conn, func(tx pgx.Tx) { row(tx, fmt.Sprintf("mid-%d", i)) })
	}
	waitFor(t, time.Minute, "mid visible", func() bool { return visible("mid-4") == 1 })
	waitFor(t, time.Minute, "A's checkpoint past the one the standby loaded", func() bool {
		l, _, _ := ckpt()
		var past bool
		_ = conn.QueryRow(ctx, "SELECT $1::pg_lsn > $2::pg_lsn", l, l0).Scan(&past)
		return past
	})
	stopClean(t, a)
	logs = append(logs, a.output())
	lA, _, streamA := ckpt()
	t.Logf("standby loaded %s; A stopped at %s", l0, lA)

	// While both are stopped: the outbox leaves the publication and comes
	// back; one writer stays open across it, so the repair waits for it.
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-0") })
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-1") })
	open := pgConnect(t, dsn)
	held, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	row(held, "gap-held")
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")

	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	probe := pgConnect(t, dsn)
	waitRepairWaits(ctx, t, probe, b, 2*time.Minute)
	lB, gB, streamB := ckpt()
	t.Logf("with the standby streaming (before its repair): checkpoint %s gap=%v same stream state as A's=%v", lB, gB, streamB == streamA)
	if !strings.Contains(b.output(), "connector started") {
		t.Fatalf("standby not started:\n%s", b.output())
	}
	// A slow save from here on.
	locker := pgConnect(t, dsn)
	ltx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lock {
		if _, err := ltx.Exec(ctx, "SELECT 1 FROM outbox_cdc.checkpoints WHERE slot = $1 FOR UPDATE", slot); err != nil {
			t.Fatal(err)
		}
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the repair committed in Kafka", func() bool {
		if b.proc.Exited() {
			t.Fatalf("standby exited: %v\n%s", b.proc.Err(), b.output())
		}
		return visible("gap-0") == 1 && visible("gap-1") == 1 && visible("gap-held") == 1
	})
	if !lock {
		// No slow save: B runs on for a while, writing as it would.
		committed(t, conn, func(tx pgx.Tx) { row(tx, "during-b") })
		waitFor(t, time.Minute, "during-b visible", func() bool { return visible("during-b") == 1 })
		time.Sleep(5 * time.Second)
		var confirmed string
		_ = conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed)
		lR, gR, sR := ckpt()
		t.Logf("B ran 5s after its repair: checkpoint %s gap=%v same stream state as A's=%v slot confirmed %s", lR, gR, sR == streamA, confirmed)
	}
	b.kill()
	logs = append(logs, b.output())
	endLockWaiters(ctx, t, conn)
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lK, gK, streamK := ckpt()
	t.Logf("after the kill: checkpoint %s gap=%v same stream state as A's=%v", lK, gK, streamK == streamA)

	c := startProcess(t, cfgA, addrA)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "after") })
	waitFor(t, time.Minute, "after visible", func() bool { return visible("after") == 1 })
	stopClean(t, c)
	logs = append(logs, c.output())
	names := []string{"before", "mid-0", "mid-4", "gap-0", "gap-1", "gap-held", "after"}
	if !lock {
		names = append(names, "during-b")
	}
	for _, name := range names {
		if n := visible(name); n != 1 {
			t.Errorf("%s: %d copies for read_committed, want 1", name, n)
		}
	}
}
