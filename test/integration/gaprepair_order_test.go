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

// TestGapRepairAtLeastOnceCopiesInOrder: in at_least_once, what the repair
// of a publication gap publishes again comes as a replayed tail in the
// original order (contract, guarantee 4). A transaction that took an id
// before the rows holds the gap's bound below all of them, so the repair
// reads rows delivered long before the gap (r*); the restart's stream,
// resuming behind the gap (the last saves were lost, as in a crash),
// replays newer rows of the same aggregate (s*) before it reaches the gap.
// Leaving those out of the repair sent the old copies alone, after s*, and
// then jumped ahead to the gap's rows (long chaos seed
// 10167240380432169663: 19 keys).
func TestGapRepairAtLeastOnceCopiesInOrder(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot, early = "gapcopies", "gapcopies_early"
	cfgPath := writeConfig(t, yamlFor(t, dsn, slot, "outbox: {table: public.outbox}"))
	dropSlotAtEnd(t, dsn, early)
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	row, _ := gapWriters(ctx, t, slot)
	var order []string // every row, in commit order (one aggregate, one writer)
	write := func(name string) {
		committed(t, conn, func(tx pgx.Tx) { row(tx, name) })
		order = append(order, name)
	}
	long := beginLong(ctx, t, dsn, slot, 9, 0)
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

	var seq []string
	for _, r := range got {
		seq = append(seq, strings.TrimSuffix(strings.TrimPrefix(string(r.Value), `{"n": "`), `"}`))
	}
	if why := replayedInOrder(order, seq); why != "" {
		t.Fatalf("%s\nread (key g, one partition): %s", why, strings.Join(seq, " "))
	}
}

// replayedInOrder checks one aggregate's records against its rows in commit
// order: each record is the row after the previous one, or one already
// read (a replayed tail starting), and every row is read.
func replayedInOrder(order, read []string) string {
	idx := map[string]int{}
	for i, n := range order {
		idx[n] = i
	}
	last, hi := -1, -1
	for k, n := range read {
		i, ok := idx[n]
		switch {
		case !ok:
			return fmt.Sprintf("record %d: %q was never written", k, n)
		case i == last+1, i <= hi:
		default:
			return fmt.Sprintf("record %d: %s after %s (the newest read before it: %s)", k, n, order[max(last, 0)], order[max(hi, 0)])
		}
		last, hi = i, max(hi, i)
	}
	if hi != len(order)-1 {
		return fmt.Sprintf("read up to %s of %d rows", order[max(hi, 0)], len(order))
	}
	return ""
}
