package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// snapshot publishes the rows already in the outbox table, read in the
// snapshot the new slot exported: exactly what was committed before the
// slot's first change, so there is neither a gap nor a duplicate at the
// cut-over. It returns once every row is acknowledged, before streaming.
func (w *processor) snapshot(ctx, produceCtx context.Context, snap *replication.ExportedSnapshot) error {
	p := w.p
	defer snap.Close(context.WithoutCancel(ctx))
	rows, err := p.cfg.Source.SnapshotRows(ctx, snap, rowSpecs(p.cfg))
	if err != nil {
		return err
	}
	defer rows.Close()

	txn := p.tracker.Begin()
	// One pseudo-transaction, which exactly_once may commit in parts
	// (split.go): a crash in between takes the snapshot again, and its
	// read-back finds what the parts committed (eos.go startReadBack).
	p.b.begin(0, snap.ConsistentPoint, true)
	at := p.plan.snapshotAt
	if at.IsZero() {
		at = time.Now() // no checkpoint store: nothing is taken again
	}
	n, err := w.publishRows(produceCtx, rows, txn, at, func(t metrics.TableEvents) prometheus.Counter { return t.Snapshot }, nil)
	if err != nil {
		return err
	}
	p.tracker.Commit(txn, snap.ConsistentPoint)
	p.b.end(snap.ConsistentPoint)
	p.log.Info("snapshot rows produced; waiting for acknowledgements", "rows", n)

	for p.tracker.InFlight() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if cs := p.plan.checkpoints; cs != nil {
		// Replace: the marker this run saved before creating the slot is
		// the one to overwrite, whatever position it held.
		if err := cs.Replace(ctx, offsets.Checkpoint{LSN: max(p.tracker.Acked(), snap.ConsistentPoint), SnapshotDone: true}); err != nil {
			return fmt.Errorf("snapshot: save checkpoint: %w", err)
		}
	}
	p.prog.snapDone.Store(true)
	p.log.Info("snapshot published", "rows", n, "consistent_point", snap.ConsistentPoint)
	return nil
}
