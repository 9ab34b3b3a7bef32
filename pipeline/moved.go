package pipeline

import (
	"context"
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// movedDatabase reports whether a checkpoint of another database system
// belongs to this very database, carried to a new cluster with its data:
// pg_upgrade gives the new cluster a system identifier of its own (PG docs,
// pg_upgrade) and copies the tables, the history marks among them. A random
// 63-bit mark (replication/marks.go) that the connector wrote there is in
// no other database. Refusing such a checkpoint would send the operator to
// delete it, and with it what the rows committed since are owed: the start
// instead treats the stream as lost (useMovedCheckpoint).
func (su *starter) movedDatabase(ctx context.Context, l loaded) (bool, error) {
	p := su.p
	c, src := l.ckpt, p.cfg.Source
	if c.Mark == 0 || p.cfg.MarksTable == "" || c.Database != l.srv.Database || c.Slot != src.Slot {
		return false, nil
	}
	found, err := replication.NewMarks(src, p.cfg.MarksTable).Present(ctx, c.Mark)
	if err != nil || !found {
		return false, err
	}
	p.log.Warn("the checkpoint was written on another database system that held this database (pg_upgrade, or a copy of "+
		"its data): its positions mean nothing on this cluster, so the stream after it counts as lost",
		"checkpoint", c.LSN, "checkpoint_system", c.SystemID, "system", l.srv.SystemID, "history_mark", c.Mark)
	return true, nil
}

// useMovedCheckpoint starts from the slot, created by this run or carried
// over. pg_upgrade keeps a logical slot (PostgreSQL 17 on) only when it has
// consumed every write before the old cluster stopped, and only the
// connector's confirmation consumes it: a kept slot after a clean stop (the
// checkpoint says so) at or past its position lost nothing. Otherwise every
// row that exists now is held from retention until verify --repair: which
// of them the old cluster's stream delivered is not known here (xids survive
// pg_upgrade, not a copy of the data, so the checkpoint's floor is not used).
func (su *starter) useMovedCheckpoint(ctx context.Context, pl *plan, res replication.SetupResult, l *loaded) error {
	p := su.p
	c := l.ckpt
	if !res.Created && c.Clean && res.Confirmed >= c.LSN {
		p.log.Info("resuming from the slot the new database system kept (pg_upgrade): the connector stopped cleanly "+
			"before, and the slot had consumed everything", "slot", p.cfg.Source.Slot, "slot_start", res.Confirmed, "checkpoint", c.LSN)
		if err := pl.checkpoints.Replace(ctx, offsets.Checkpoint{LSN: res.Confirmed, SnapshotDone: true}); err != nil {
			return fmt.Errorf("save checkpoint: %w", err)
		}
		l.have = false
		return nil
	}
	c.Floor = 0
	hold, stored, err := p.ret.lostSlotHold(ctx, c)
	if err != nil {
		return err
	}
	p.log.Warn("starting from the slot on the new database system; rows committed after the checkpoint on the old one may "+
		"never have been delivered: see repair", "slot", p.cfg.Source.Slot, "slot_created", res.Created,
		"slot_start", res.Confirmed, "repair", p.repairCommand(c), "retention_keeps_xids_below", hold.Below)
	saved := offsets.Checkpoint{LSN: res.Confirmed, SnapshotDone: res.Snapshot == nil}
	if !stored {
		saved.RepairSince = repairHold(c)
	}
	if err := pl.checkpoints.Replace(ctx, saved); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	l.have = false
	return nil
}
