package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// partitionRound makes the partitions that should exist ahead, then drops
// the partitions the connector made that are wholly past the retention and
// whose rows are all delivered (d: the rule's decision). Making ahead never
// waits for the rule: an insert with no partition to go to fails.
func (p *Pipeline) partitionRound(ctx context.Context, tb *retentionTable, d retention.Decision) {
	cfg := p.cfg.Retention
	now := time.Now()
	for _, w := range retention.Ahead(now, cfg.PartitionWidth, cfg.PartitionsAhead) {
		created, err := tb.r.CreatePartition(ctx, w.From, w.To)
		switch {
		case errors.Is(err, replication.ErrPartitionOverlap):
			if tb.overlaps == nil {
				tb.overlaps = map[time.Time]bool{}
			}
			if !tb.overlaps[w.From] {
				tb.overlaps[w.From] = true
				p.log.Warn("retention: not making a partition; the range is another's", "table", tb.name, "err", err)
			}
		case err != nil:
			p.roundError(ctx, tb, "create a partition", err)
			return
		case created:
			tb.created.Inc()
			p.log.Info("retention: partition created", "table", tb.name, "from", w.From, "to", w.To)
		}
	}
	if !d.Delete {
		p.logBlocked(tb, d.Why)
		return
	}
	parts, err := tb.r.Partitions(ctx)
	if err != nil {
		p.roundError(ctx, tb, "list partitions", err)
		return
	}
	for _, part := range parts {
		w := retention.Window{From: part.From, To: part.To}
		if !retention.Behind(w, now, cfg.After) {
			continue
		}
		if hold := p.retentionState().Hold; retention.Held(w, hold) {
			p.logBlocked(tb, repairHeld(hold))
			continue
		}
		// The state may change between partitions (a gap found, the slot lost).
		if why := retention.Blocked(p.retentionState()); why != "" {
			p.logBlocked(tb, why)
			return
		}
		done, err := tb.r.DropPartition(ctx, part, d.Below)
		switch {
		case err != nil:
			p.roundError(ctx, tb, "drop a partition", err)
			return
		case done:
			tb.dropped.Inc()
			p.log.Info("retention: partition dropped", "table", tb.name, "partition", part.Name, "from", part.From, "to", part.To)
		default:
			p.logBlocked(tb, "partition "+part.Name+" holds rows not delivered yet")
		}
	}
}
