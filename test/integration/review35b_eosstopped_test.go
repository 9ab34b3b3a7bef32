package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReview35bStoppedChangeRepairTwiceEOS: exactly_once. The outbox leaves
// the publication and comes back while the connector is stopped, with rows
// written in between. The next start finds the stream state changed
// (streamChangedWhileStopped) and repairs: the repair's rows commit in
// Kafka with a position past the gap. The gap (and the new stream state)
// reach the checkpoint only with the next save, which the checkpoint loop
// makes only after acknowledged events, up to 200 ms later (here: held back
// by a row lock on the checkpoint, as a slow or unanswering server would).
// A SIGKILL in that window leaves the old checkpoint: the next start finds
// the same change again, places a new gap at its own start (past the
// committed position: the "repair committed" check of exactly_once.go does
// not apply to a gap found this way) and publishes the gap's rows again:
// read_committed sees them twice.
//
// Two ways the kill meets the save: the save never reached the server, or
// the server completes it once the lock goes. The second one found the
// gap saved with its position below the one committed in Kafka, and the
// next start took the repair for committed: the rows were lost.
func TestReview35bStoppedChangeRepairTwiceEOS(t *testing.T) {
	for _, never := range []bool{true, false} {
		t.Run(fmt.Sprintf("save_never_sent=%v", never), func(t *testing.T) { stoppedChangeKilledBeforeSave(t, never) })
	}
}

func stoppedChangeKilledBeforeSave(t *testing.T, never bool) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	slot := fmt.Sprintf("rv35beos%v", never)
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	cfgPath := eosConfig(t, dsn, slot, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("rv35beos%d", dbCounter.Add(1))
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

	// While stopped: a migration takes the outbox out and puts it back.
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-0") })
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-1") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")

	// The checkpoint's row is busy for a while (a slow save).
	ltx := lockCheckpoint(ctx, t, dsn, slot)
	p = startProc(t, cfgPath, addr, false)
	// The repair commits in Kafka (before the fix), or the stream waits for
	// the save the lock holds back (after it); then SIGKILL, before the
	// checkpoint could record the gap or the new state.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !(visible("gap-0") == 1 && visible("gap-1") == 1) {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.kill()
	logs = append(logs, p.output())
	// A save the lock holds inside the server commits once the lock goes,
	// unless it is ended: a save never sent.
	if never {
		endLockWaiters(ctx, t, conn)
	}
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	p = startProcess(t, cfgPath, addr)
	committed(t, conn, func(tx pgx.Tx) { row(tx, "after") })
	waitFor(t, time.Minute, "after visible", func() bool { return visible("after") == 1 })
	stopClean(t, p)
	logs = append(logs, p.output())
	for _, name := range []string{"before", "gap-0", "gap-1", "after"} {
		if n := visible(name); n != 1 {
			t.Errorf("%s: %d copies for read_committed, want 1", name, n)
		}
	}
}
