package integration

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestStoppedChangeLongTransactionCopiesInOrder: at_least_once. A
// transaction elsewhere in the cluster stays open (L), so the guard's bound
// stays at or below L's id. Row 1 (id above L) is delivered and the
// checkpoint passes it. An event whose topic does not exist holds the
// acknowledged position; row 2 is delivered behind it, and the guard
// vouches past 2. The checkpoint is saved below 2, with the bound (<= L)
// and verified past 2. While stopped, the outbox leaves the publication and
// comes back, and 3 is written. With the repair placed at verified
// (f99436c) the restart's stream sent 2 again first, then the repair read
// every row at or above the bound; 1, below the checkpoint, not decoded by
// this run, went again after 2: 1 2 2 1 3 4 (review11). At the start, the
// repair's copies lead the replayed tail: 1 2 1 2 3 4.
func TestStoppedChangeLongTransactionCopiesInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := newStoppedEnv(ctx, t, "r11alo", "", false)

	// The slot is created before L opens (creating it waits for running transactions).
	p := startRetention(t, e.cfgPath)
	// L: a long transaction elsewhere; the guard's bound stays at or below it.
	long := pgConnect(t, e.dsn)
	ltx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var xidL uint64
	if err := ltx.QueryRow(ctx, "SELECT txid_current()").Scan(&xidL); err != nil {
		t.Fatal(err)
	}

	before1 := currentLSN(t, e.conn)
	e.write(t, "1")
	after1 := currentLSN(t, e.conn)
	waitFor(t, time.Minute, "1 delivered", func() bool { return e.seen(t, "1") })
	waitFor(t, time.Minute, "a checkpoint past 1", func() bool { l, _ := e.savedStream(); return l > before1 })

	e.hold(t)
	e.write(t, "2")
	after2 := currentLSN(t, e.conn)
	waitFor(t, time.Minute, "2 delivered", func() bool { return e.seen(t, "2") })
	waitFor(t, 30*time.Second, "a checkpoint below 2 that records verified past 2", func() bool {
		l, st := e.savedStream()
		return l < after2 && len(st) == 1 && st[0].Verified >= after2
	})
	l, st := e.savedStream()
	t.Logf("checkpoint %v, state %+v, L %d, after1 %v after2 %v", l, st, xidL, after1, after2)
	p.kill()
	if err := ltx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	e.flapWhileStopped(t, "3")
	p = startRetention(t, e.cfgPath)
	e.write(t, "4")
	waitFor(t, time.Minute, "4 delivered", func() bool { return e.seen(t, "4") })
	stopClean(t, p)
	if !strings.Contains(p.output(), "published the rows written while the outbox was outside the publication") {
		t.Fatalf("the restart did not repair the gap:\n%s", p.output())
	}
	got := e.values(t)
	checkCopiesInOrder(t, got, 4, p.output())
	t.Logf("aggregate g: %v", got)
}
