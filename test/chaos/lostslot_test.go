package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// A lost slot with undelivered commits. Half the pg-promote-behind faults
// of the at_least_once run below PostgreSQL 17 stall the Kafka proxy 1–2 s
// before the standby is cut off, until the connector exits on the
// promotion: the standby holds commits the connector decoded but never
// delivered, and the slot the next start creates begins past them. Only the
// lost slot's repair can publish them, and retention must keep them until
// it has (docs/operations.md, "What blocks deletion"); the backdated ones
// among them (slow_test.go: created_at hours before the printed --since)
// are the hard case. Every one of them must reach Kafka (the loss check,
// and verify after the run).

// lagBeforeCut stalls the Kafka proxy, half the time when the fault may
// lag, and returns how long before the cut it did (0: it did not). The
// stall lasts until the lagging connector has exited (healAfterExit).
func (r *run) lagBeforeCut(ctx context.Context, major int) time.Duration {
	if exactlyOnce() || major >= 17 || r.rng.IntN(2) == 0 {
		// exactly_once must refuse a committed position past the fork,
		// which a stall keeps before it; 17+ follows a failover slot.
		return 0
	}
	d := r.between(time.Second, 2*time.Second)
	env.brokerProxy.Stall()
	sleepCtx(ctx, d) // commits the connector decodes and cannot deliver
	return d
}

// afterLaggingPromotion kills the connector that lagged (it cannot stop
// while Kafka stalls: what it decoded and did not deliver dies with it),
// ends the stall and follows pg-promote-behind's runbook: a start creates
// the slot, the suite runs the printed repair. The table-less events not
// delivered by then have no row to repair from: each is noted (slotLost)
// and, if no copy of it ever reaches Kafka, counted lost with the slot
// instead of lost.
func (r *run) afterLaggingPromotion(ctx context.Context, f *faultRecord, in *incarnation, desc string) (string, error) {
	if in != nil && !in.exited() {
		if _, err := r.conn.kill(); err != nil {
			return desc, err
		}
		f.Kills++
		desc += fmt.Sprintf("; connector #%d killed", in.N)
	}
	// The stalled links still hold what it sent: close them, or healing
	// would deliver it after all.
	env.brokerProxy.Drop()
	env.brokerProxy.Heal()
	if r.slotLost == nil {
		r.slotLost = map[string]string{}
	}
	n := 0
	for _, e := range r.ledger.all() {
		if _, seen := r.live.seenAt(e.ID); e.Message && !seen && r.slotLost[e.ID] == "" {
			r.slotLost[e.ID] = fmt.Sprintf("%s (%s seq %d, committed %s)", e.ID, e.Agg, e.Seq, e.Committed.Format("15:04:05.000"))
			n++
		}
	}
	desc += fmt.Sprintf("; %d table-less events not delivered", n)
	return r.afterRewind(ctx, f, fPGPromote, reasonAfterPromote, nil, wantPromoted, true, opsExitTimeout, desc)
}

// withoutSlotLost leaves out of the loss check the table-less events noted
// by afterLaggingPromotion that have no copy, counts them, and adds them to
// the seqs the order checks step over.
func (o *observation) withoutSlotLost(rep *Report, events []event, copies map[string][]copyRec, byID map[string]*event, dead deadSeqs) []event {
	if len(o.SlotLost) == 0 {
		return events
	}
	gone := map[string]string{}
	out := make([]event, 0, len(events))
	for _, e := range events {
		if at := o.SlotLost[e.ID]; at != "" && len(copies[e.ID]) == 0 {
			gone[e.ID] = at
			rep.SlotLostMessages = append(rep.SlotLostMessages, at)
			continue
		}
		out = append(out, e)
	}
	dead.add(byID, gone, nil)
	return out
}

// waitStreamed waits until the connector's slot has confirmed the WAL
// position read now: with the writers paused, nothing it decoded is in
// flight after that, and a repair's verify takes nothing in flight for
// missing. (Waiting for every committed event instead would wait for the
// lost window's rows, which only the repair publishes.)
func (r *run) waitStreamed(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var end, confirmed lsn.LSN
	var err error
	for {
		var conn *pgx.Conn
		if conn, err = pgx.Connect(ctx, direct(r.dsn)); err == nil {
			var s string
			if end == 0 {
				if err = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err == nil {
					end, err = lsn.Parse(s)
				}
			}
			if err == nil {
				// NULL (no slot yet) reads as "0/0".
				err = conn.QueryRow(ctx, "SELECT coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1), '0/0')::text",
					r.conn.slot).Scan(&s)
			}
			if err == nil {
				confirmed, err = lsn.Parse(s)
			}
			conn.Close(context.Background())
		}
		if err == nil && end != 0 && confirmed >= end {
			return nil
		}
		if !sleepCtx(ctx, 100*time.Millisecond) { // poll interval of the slot's position
			return fmt.Errorf("slot %s confirmed %v, not the WAL end %v, after %v (last error %v)", r.conn.slot, confirmed, end, timeout, err)
		}
	}
}

// TestWithoutSlotLost: a table-less event a lost slot took is left out of
// the loss check and stepped over by the order check only while no copy
// of it exists.
func TestWithoutSlotLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		copied   bool
		wantLoss int // events left for the loss check, of 4
		wantNext int // the seq the order check expects after 2
	}{
		{"no copy", false, 3, 4},
		{"delivered after all", true, 4, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			e3 := f.byID["e3"]
			e3.Message = true
			f.events[2].Message = true
			if !tc.copied {
				delete(f.copies, "e3")
			}
			f.o.SlotLost = map[string]string{"e3": "e3 (a seq 3)"}
			rep, dead := &Report{}, deadSeqs{}
			left := f.o.withoutSlotLost(rep, f.events, f.copies, f.byID, dead)
			if len(left) != tc.wantLoss || dead.next("a", 2) != tc.wantNext || len(rep.SlotLostMessages) != 4-tc.wantLoss {
				t.Fatalf("left %d, next after 2 %d, counted %v", len(left), dead.next("a", 2), rep.SlotLostMessages)
			}
		})
	}
}
