package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestExactlyOnceSlotAdvancesWithStreamBound: in exactly_once the slot and
// the checkpoint are held back for the guard's bound of the checkpoint last
// saved (pipeline/hold.go), and a save records a later bound only when the
// position moved: the two waited for each other, and the slot stayed at its
// first position for good (the long exactly_once chaos run: a slot stuck
// for minutes, then 22,854 events sent again and a catch-up that never
// ended). Writes go on past a long transaction that ends; the slot and the
// checkpoint must move past them.
func TestExactlyOnceSlotAdvancesWithStreamBound(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "eosadv"
	dropSlotAtEnd(t, dsn, slot)
	addr := freeAddr(t)
	cfgPath := eosConfig(t, dsn, slot, addr)
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProcess(t, cfgPath, addr)

	// A transaction elsewhere keeps the guard's bound low while the first
	// rows go, then ends.
	long, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close(context.Background())
	ltx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ltx.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	agg := "eosadv" + runID
	insertRows(t, conn, "outbox", agg, 5)
	time.Sleep(time.Second)
	if err := ltx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		insertRows(t, conn, "outbox", agg, 5)
		time.Sleep(300 * time.Millisecond)
	}
	end := currentLSN(t, conn)
	waitFor(t, time.Minute, "the slot and the checkpoint past the rows", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn >= $2",
			slot, end) == 1 && checkpointLSN(t, conn, slot) >= end
	})
	stopClean(t, p)
}
