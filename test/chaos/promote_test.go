package chaos

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// pgPromoteBehind makes a physical standby of the primary, cuts its WAL
// receiver so that it lacks the next 1–4 s of commits (asynchronous
// replication), crashes the primary, promotes the standby and points the
// suite's PostgreSQL proxy (the connector's only way to the server) and
// its own connections at it. The run goes on with the new primary: later
// pg-* faults hit it.
//
// Below PostgreSQL 17 the promoted server has no logical slot: the running
// connector must stop (it had read the old timeline past the fork, or finds
// no slot); the suite starts it again, which creates a slot at the new
// primary's position and prints the lost slot's repair (verify --repair),
// which the suite runs. In the exactly_once run the start in between must
// refuse the position committed to Kafka on the old timeline past the fork.
// The writers are paused from the crash until then.
func (r *run) pgPromoteBehind(ctx context.Context, f *faultRecord) (string, error) {
	old := env.pg
	// Bounded: the make chaos run of 2026-12-02 hung 9 minutes in the second
	// promotion's StartStandby (a standby of the promoted server never got
	// ready); a fault must fail, not eat the budget.
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	sb, err := testenv.StartStandby(sctx, old, testenv.StandbyOptions{})
	cancel()
	if err != nil {
		return "", fmt.Errorf("standby of the current primary: %w", err)
	}
	if r.firstPrimary == nil {
		r.firstPrimary = old
		r.t.Cleanup(r.unpromote) // after the standbys' Close (cleanups run last first)
	}
	r.t.Cleanup(func() { _ = sb.Close() })
	synced := time.Now()
	sleepCtx(ctx, r.between(200*time.Millisecond, time.Second)) // the standby streams under load
	failover := sb.Major() >= 17
	if failover {
		if err := r.waitSlotSynced(ctx, sb); err != nil {
			return "", err
		}
	}
	lag := r.lagBeforeCut(ctx, sb.Major()) // lostslot_test.go
	defer env.brokerProxy.Heal()
	if err := sb.CutReplication(ctx); err != nil {
		return "", err
	}
	behind := r.between(time.Second, 4*time.Second)
	sleepCtx(ctx, behind) // commits the standby never receives

	r.ledger.gate.Lock()
	defer r.ledger.gate.Unlock()
	in := r.conn.current()
	if err := old.Crash(); err != nil {
		return "", err
	}
	// Only now: until Crash returned the sampler may still read the old
	// primary. A synchronized failover slot goes on with the old stream.
	f.Rewound, f.NewStream = time.Now(), !failover
	if err := sb.Promote(ctx); err != nil {
		return "", err
	}
	if err := resetConninfo(ctx, sb); err != nil {
		return "", err
	}
	env.pg = sb
	addr := "127.0.0.1:" + strconv.Itoa(sb.Port())
	orig := "127.0.0.1:" + strconv.Itoa(old.Port())
	if m := pgMoved.Load(); m != nil {
		orig = m[0] // a second promotion: the DSNs still name the first primary
	}
	pgMoved.Store(&[2]string{orig, addr})
	env.pgProxy.SetTarget(addr)
	env.pgProxy.Drop() // connections to the dead primary
	env.pgProxy.Heal()
	undone, seen, err := r.undoLedger(ctx)
	if err != nil {
		return "", err
	}
	desc := fmt.Sprintf("standby (PostgreSQL %s) streamed %v, cut off %v before the primary's crash, promoted: %d events undone (%d of them consumed)",
		sb.Version(), time.Since(synced).Round(time.Millisecond), behind, undone, seen)
	if failover {
		return r.followedPromotion(ctx, f, in, seen, desc)
	}
	if lag > 0 {
		desc += fmt.Sprintf("; the Kafka proxy stalled from %v before the cut (the connector lagged)", lag)
		return r.afterLaggingPromotion(ctx, f, in, desc) // lostslot_test.go
	}
	return r.afterRewind(ctx, f, fPGPromote, reasonAfterPromote, in, wantPromoted, true, opsExitTimeout, desc)
}

// resetConninfo drops the empty primary_conninfo CutReplication left in the
// promoted server's postgresql.auto.conf: a standby of it copies that file,
// which overrides the primary_conninfo StartStandby writes, and never
// streams ("the database system is starting up" until the timeout).
func resetConninfo(ctx context.Context, pg *testenv.Postgres) error {
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("promoted server: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "ALTER SYSTEM RESET primary_conninfo"); err != nil {
		return fmt.Errorf("promoted server: reset primary_conninfo: %w", err)
	}
	return nil
}

// waitSlotSynced waits until the standby holds the connector's slot as a
// synchronized failover slot that survives a promotion (synced and not
// temporary: docs/operations.md, "Failover").
func (r *run) waitSlotSynced(ctx context.Context, sb *testenv.Postgres) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, sb.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var synced, temporary bool
		err := conn.QueryRow(ctx, "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = $1", r.conn.slot).Scan(&synced, &temporary)
		if err == nil && synced && !temporary {
			return nil
		}
		if !sleepCtx(ctx, 50*time.Millisecond) { // poll interval of the standby's slot sync
			return fmt.Errorf("slot %s not synchronized to the standby within a minute (synced %v, temporary %v, %v)", r.conn.slot, synced, temporary, err)
		}
	}
}

// followedPromotion: on PostgreSQL 17+ with a failover slot and
// synchronized_standby_slots, the connector published nothing the standby
// lacked (seen: undone events consumed) and follows the promotion on the
// synchronized slot without stopping (docs/operations.md, "Failover").
func (r *run) followedPromotion(ctx context.Context, f *faultRecord, in *incarnation, seen int, desc string) (string, error) {
	if seen > 0 {
		r.opsFailed(fPGPromote, "%d events the standby never received reached Kafka although synchronized_standby_slots names it", seen)
	}
	t := time.NewTimer(15 * time.Second) // long enough for the reconnect (backoff up to 1s) and its checks
	defer t.Stop()
	select {
	case <-in.done:
		r.opsFailed(fPGPromote, "connector #%d stopped after the promotion although the promoted server has its failover slot: %v", in.N, in.err)
		next, err := r.conn.start(ctx, reasonAfterPromote)
		if next != nil {
			f.restarted = next.Start
		}
		return desc + "; connector stopped", err
	case <-t.C:
	case <-ctx.Done():
		return desc, ctx.Err()
	}
	return desc + fmt.Sprintf("; connector #%d followed the promotion on the synchronized failover slot", in.N), nil
}

// unpromote gives the package its first server back once the run is over:
// the other tests of the package use env.pg and the proxy.
func (r *run) unpromote() {
	first := r.firstPrimary
	env.pg = first
	pgMoved.Store(nil)
	env.pgProxy.SetTarget("127.0.0.1:" + strconv.Itoa(first.Port()))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := first.Restart(ctx); err != nil {
		r.t.Logf("chaos: restart the first primary after the run: %v", err)
		return
	}
	conn, err := pgx.Connect(ctx, first.DSN("postgres"))
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	// Its standby's physical slot would keep WAL for ever.
	_, _ = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_type = 'physical' AND NOT active")
}
