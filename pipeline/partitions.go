package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// overlapRecheck is how long a range found to be another partition's is
// left alone before creating it is tried again (that partition may have
// been dropped since).
const overlapRecheck = time.Hour

// partitionRound makes the partitions that should exist ahead, then drops
// the partitions the connector made that are wholly past the retention and
// whose rows are all delivered (d: the rule's decision). Making ahead never
// waits for the rule: an insert with no partition to go to fails.
func (r *retentionLoop) partitionRound(ctx context.Context, tb *retentionTable, d retention.Decision) {
	cfg := r.p.cfg.Retention
	now := time.Now()
	for _, w := range retention.Ahead(now, cfg.PartitionWidth, cfg.PartitionsAhead) {
		// Creating a partition locks the root against the application's
		// inserts, also when it fails on an overlap: a range found to be
		// another partition's is tried again only after overlapRecheck.
		if at, ok := tb.overlaps[w.From]; ok && now.Sub(at) < overlapRecheck {
			continue
		}
		created, err := tb.r.CreatePartition(ctx, w.From, w.To)
		switch {
		case errors.Is(err, replication.ErrPartitionOverlap):
			if tb.overlaps == nil {
				tb.overlaps = map[time.Time]time.Time{}
			}
			if _, warned := tb.overlaps[w.From]; !warned {
				r.p.log.Warn("retention: not making a partition; the range is another's", "table", tb.name, "err", err)
			}
			tb.overlaps[w.From] = now
		case err != nil:
			r.roundError(ctx, tb, "create a partition", err)
			return
		case created:
			tb.created.Inc()
			r.p.log.Info("retention: partition created", "table", tb.name, "from", w.From, "to", w.To)
		}
	}
	if !d.Delete {
		r.logBlocked(tb, d.Why)
		return
	}
	session := r.p.conn.sessions.Load()
	parts, err := tb.r.Partitions(ctx)
	if err != nil {
		r.roundError(ctx, tb, "list partitions", err)
		return
	}
	for _, part := range parts {
		w := retention.Window{From: part.From, To: part.To}
		if !retention.Behind(w, now, cfg.After) {
			continue
		}
		// A hold is by transaction, which a partition's range does not
		// bound: every partition stays until verify --repair lifts it.
		if hold := r.state().Hold; hold.Set() {
			r.logBlocked(tb, repairHeld(hold))
			return
		}
		// The state may change between partitions (a gap found, the slot
		// lost, a reconnect: the decision was made in the session before).
		if why := retention.Blocked(r.state()); why != "" || r.p.conn.sessions.Load() != session {
			r.logBlocked(tb, why)
			return
		}
		done, err := tb.r.DropPartition(ctx, part, d.Below)
		switch {
		case err != nil:
			r.roundError(ctx, tb, "drop a partition", err)
			return
		case done:
			tb.dropped.Inc()
			r.p.log.Info("retention: partition dropped", "table", tb.name, "partition", part.Name, "from", part.From, "to", part.To)
		default:
			r.logBlocked(tb, "partition "+part.Name+" holds rows not delivered yet")
		}
	}
}
