package pipeline

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// RetentionConfig is outbox.retention and its pacing (internal/config/retention.go).
type RetentionConfig struct {
	After     time.Duration // delete delivered rows older than this; 0: never
	BatchSize int           // rows per DELETE, each its own transaction
	DutyCycle float64       // share of the time spent deleting (0, 1]
	Interval  time.Duration // how often a round starts
	// PartitionWidth and PartitionsAhead: the partitions made of a
	// partitioned outbox (partitions.go).
	PartitionWidth  time.Duration
	PartitionsAhead int
}

// run deletes each outbox table's delivered rows past the
// retention (the rule: package retention), until ctx ends. It runs beside
// the stream of a run with a guard (not a replay), and deletes only while
// this process streams from the slot.
func (r *retentionLoop) run(ctx context.Context) {
	cfg := r.p.cfg.Retention
	srcs := r.p.cfg.Source.Tables()
	tables := make([]*retentionTable, len(srcs))
	for i, s := range srcs {
		name := s.Schema + "." + s.Table
		tables[i] = &retentionTable{r: replication.NewRetainer(s), name: name,
			deleted: r.p.m.Retention.Deleted.WithLabelValues(name), created: r.p.m.Retention.PartitionsCreated.WithLabelValues(name),
			dropped: r.p.m.Retention.PartitionsDropped.WithLabelValues(name)}
		defer tables[i].r.Close(ctx)
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		r.readHold(ctx)
		for _, tb := range tables {
			if ctx.Err() != nil {
				return
			}
			r.round(ctx, tb)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// retentionLoop runs outbox.retention beside the stream, and owns the lost
// slots' repair hold as this process last read it (replication.Holds): the
// setup stores one (lostSlotHold), the loop reads it again every round.
type retentionLoop struct {
	p        *Pipeline          // read-only: the configuration, the positions, the repair
	holds    *replication.Holds // nil without a holds table
	holdXids atomic.Pointer[retention.Hold]
	holdRead atomic.Bool // the last read of the holds succeeded
	// holdFailing: the holds' reads fail and that was logged (the loop only).
	holdFailing bool
}

// retentionTable is one table's retainer and the readings waiting for the
// acknowledged position (retention loop only).
type retentionTable struct {
	r        *replication.Retainer
	name     string
	readings []retention.Reading
	deleted  prometheus.Counter
	created  prometheus.Counter
	dropped  prometheus.Counter
	overlaps map[time.Time]time.Time // windows found to be another partition's, and when (partitions.go)
	blocked  string                  // the last reason nothing was deleted (its key), logged once
}

// state is what the rule needs besides the readings.
func (r *retentionLoop) state() retention.State {
	return retention.State{
		Owner:   r.p.conn.up.Load(),
		Session: r.p.conn.sessions.Load(),
		// exactly_once: outcomes reach the tracker after the Kafka commit;
		// after a reconnect, only what the server is proven to hold.
		Acked:    r.p.history.confirmable(r.p.confirmable()),
		Gap:      r.p.rep.blocksRetention(),
		Snapshot: !r.p.prog.snapDone.Load(),
		Hold:     r.hold(),
		HoldRead: r.holds == nil || r.holdRead.Load(),
	}
}

// hold is the lost slot's repair hold (replication.Holds) as last
// read: zero for none.
func (r *retentionLoop) hold() retention.Hold {
	if h := r.holdXids.Load(); h != nil {
		return *h
	}
	return retention.Hold{}
}

// setHold records the hold the holds table holds.
func (r *retentionLoop) setHold(h retention.Hold) {
	switch old := r.holdXids.Swap(&h); {
	case old != nil && *old == h, old == nil && !h.Set():
	case !h.Set():
		r.p.log.Info("retention: the lost slot's repair hold is cleared (verify --repair ran)")
	case r.p.cfg.Retention.After > 0:
		r.p.log.Warn("retention: " + repairHeld(h))
	}
}

// readHold reads the hold again: verify --repair clears it while the
// connector runs, another instance may have set one. Until a read succeeds
// again after a failure nothing is deleted (retention.State.HoldRead): the
// last hold read may be older than the one stored.
func (r *retentionLoop) readHold(ctx context.Context) {
	if r.holds == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, _, err := r.holds.Load(rctx)
	if err != nil {
		r.holdRead.Store(false)
		if !r.holdFailing && ctx.Err() == nil {
			r.holdFailing = true // logged once per run of failures
			r.p.log.Warn("retention: could not read the lost slots' repair holds; nothing is deleted until a read succeeds", "err", err)
		}
		return
	}
	r.holdFailing = false
	r.setHold(h)
	r.holdRead.Store(true)
}

// repairHeld says why a hold keeps rows.
func repairHeld(h retention.Hold) string {
	return fmt.Sprintf("the slot was lost and created again: rows of transactions %d to %d may never have been delivered, "+
		"whatever their created_at, and are kept until outbox-cdc verify --repair completes (it reads them whatever --since says)",
		h.From, h.Below-1)
}

// round reads the table's figures, takes a reading, and deletes
// in paced batches what the rule allows. Errors are logged: a failed round
// deletes less, never more, and the next one tries again.
func (r *retentionLoop) round(ctx context.Context, tb *retentionTable) {
	if st, err := tb.r.Stats(ctx); err != nil {
		if ctx.Err() == nil {
			r.p.log.Warn("retention: could not read the table's size and oldest row; the round goes on", "table", tb.name, "err", err)
		}
	} else {
		r.setTableStats(tb.name, st)
	}
	if !r.p.conn.up.Load() {
		return // a standby, or the stream is down: its positions are not the slot's
	}
	session := r.p.conn.sessions.Load() // before the reading: a session that began meanwhile drops it
	x, err := tb.r.Read(ctx)
	if err != nil {
		r.roundError(ctx, tb, "take a reading", err)
		return
	}
	x.Epoch.Session = session
	tb.readings = append(tb.readings, x)
	d, kept := retention.Decide(tb.readings, r.state())
	tb.readings = kept
	partitioned, err := tb.r.Partitioned(ctx)
	if err != nil {
		r.roundError(ctx, tb, "look up the table", err)
		return
	}
	if partitioned {
		r.partitionRound(ctx, tb, d) // partitions.go
		return
	}
	if !d.Delete {
		r.logBlocked(tb, d.Why)
		return
	}
	cfg := r.p.cfg.Retention
	var total int64
	for ctx.Err() == nil {
		// The state may change between batches (a gap found, the slot lost,
		// a reconnect: the decision was made in the session before).
		if why := retention.Blocked(r.state()); why != "" {
			r.logBlocked(tb, why)
			break
		}
		if r.p.conn.sessions.Load() != session {
			break
		}
		start := time.Now()
		d.Keep = d.Keep.Merge(r.hold()) // verify never widens it, a restart's setup may have
		n, busy, err := tb.r.Delete(ctx, d, cfg.After, cfg.BatchSize)
		if err != nil {
			r.roundError(ctx, tb, "delete", err)
			break
		}
		if busy {
			r.logBlocked(tb, "verify holds the table's lock")
			break
		}
		tb.blocked = ""
		total += n
		tb.deleted.Add(float64(n))
		if n < int64(cfg.BatchSize) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(retention.Pace(time.Since(start), cfg.DutyCycle)):
		}
	}
	if total > 0 {
		r.p.log.Debug("retention: deleted delivered rows", "table", tb.name, "rows", total, "below_xid", d.Below)
	}
}

func (r *retentionLoop) setTableStats(table string, st replication.TableStats) {
	age := 0.0
	if !st.Oldest.IsZero() {
		age = max(0, time.Since(st.Oldest).Seconds())
	}
	r.p.m.Retention.OldestRow.WithLabelValues(table).Set(age)
	r.p.m.Retention.TableBytes.WithLabelValues(table).Set(float64(st.Bytes))
}

func (r *retentionLoop) roundError(ctx context.Context, tb *retentionTable, what string, err error) {
	if ctx.Err() == nil {
		r.p.log.Warn("retention: could not "+what+"; nothing more is deleted this round", "table", tb.name, "err", err)
	}
}

// logBlocked logs why nothing is deleted, once per reason: at debug level
// but for another slot that holds retention back, which only its owner or
// an administrator can move (or drop, if it is abandoned).
func (r *retentionLoop) logBlocked(tb *retentionTable, why string) {
	key := why
	if strings.HasPrefix(why, "waiting for slot ") {
		key, _, _ = strings.Cut(why, " (") // the slot, not the position it confirmed
	}
	if key == tb.blocked {
		return
	}
	tb.blocked = key
	if strings.HasPrefix(why, "waiting for slot ") {
		r.p.log.Warn("retention: holding back for another logical slot of the database; drop it if it is abandoned",
			"table", tb.name, "why", why)
		return
	}
	r.p.log.Debug("retention: holding back", "table", tb.name, "why", why)
}

// unackedInterval is how often the oldest unacknowledged event's age is set.
const unackedInterval = time.Second

// unackedLoop sets outbox_cdc_oldest_unacknowledged_event_age_seconds (its
// only writer) from the commit times of decoded transactions.
func unackedLoop(ctx context.Context, g interface{ Set(float64) }, c *offsets.CommitTimes, acked func() lsn.LSN) {
	every(ctx, unackedInterval, func() { g.Set(unackedAge(time.Now(), c, acked())) })
}

// unackedAge is how long the oldest decoded transaction above the
// acknowledged watermark has waited; 0 when none waits.
func unackedAge(now time.Time, c *offsets.CommitTimes, acked lsn.LSN) float64 {
	at, ok := c.After(acked)
	if !ok {
		return 0
	}
	return max(0, now.Sub(at).Seconds())
}

// lostSlotHold stores the hold on the rows a lost slot may never have
// delivered (replication.Holds), read after the slot was created again: the
// transactions that commit after the checkpoint c have ids at or above its
// floor (zero, unknown: every id), and those that committed before the new
// slot streams have ids below the primary's next one now. stored is false
// when it could not be stored and outbox.retention is off (an error
// otherwise): the caller keeps a hold by time in the checkpoint, which a
// later start with retention turns into one by transaction.
func (r *retentionLoop) lostSlotHold(ctx context.Context, c offsets.Checkpoint) (h retention.Hold, stored bool, err error) {
	if r.holds == nil {
		return retention.Hold{}, false, nil
	}
	next, err := r.holds.NextXid(ctx)
	if err == nil {
		h = retention.Hold{From: c.Floor, Below: next}
		err = r.holds.Add(ctx, h, repairHold(c))
	}
	if err != nil {
		if r.p.cfg.Retention.After > 0 {
			return h, false, fmt.Errorf("save the lost slot's repair hold: %w", err)
		}
		r.p.log.Warn("could not save the lost slot's repair hold in its table; keeping a hold by time in the checkpoint "+
			"(outbox.retention is off, so nothing is deleted now)", "err", err)
		return h, false, nil
	}
	r.setHold(h)
	return h, true, nil
}
