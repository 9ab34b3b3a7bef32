package pipeline

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// backfill is the repair of a gap: rows written while the outbox was outside
// the publication (removed from it, or dropped and created again) were never
// decoded, and PostgreSQL will not decode them on a second read either. They
// are still in the table. A restart after the fix reads them there and
// publishes them where the stream reaches the gap, so per aggregate they
// come after everything the stream delivered before the gap.
type backfill struct {
	gapInfo
	done bool
	// skip holds the transaction ids whose rows were backfilled: the stream
	// decodes some of them too (those written while the table was in the
	// publication), and they are delivered already.
	skip map[uint32]bool
}

// due reports whether the stream has reached the gap: a transaction that
// commits at or after its start, or a keepalive past it between
// transactions.
func (b *backfill) due(pos lsn.LSN) bool { return b != nil && !b.done && pos >= b.Since }

// delivered reports whether the backfill published the rows of transaction
// xid already.
func (b *backfill) delivered(xid uint32) bool { return b != nil && b.done && b.skip[xid] }

// runBackfill publishes the gap's rows as one tracked pseudo-transaction
// ending at end (the last position dispatched, so the watermark cannot pass
// the stream), in the snapshot order.
func (p *Pipeline) runBackfill(ctx, produceCtx context.Context, b *backfill, end lsn.LSN) error {
	rows, g, err := p.cfg.Source.GapRows(ctx, b.Xmin, p.rowSpecs())
	if err != nil {
		return err
	}
	defer rows.Close()
	txn := p.tracker.Begin()
	n, err := p.publishRows(produceCtx, rows, txn, time.Now(), func(t metrics.TableEvents) prometheus.Counter { return t.Backfilled })
	if err != nil {
		return err
	}
	p.tracker.Commit(txn, end)
	p.endTxn(end)
	b.done, b.skip = true, g.Xids
	// Once the watermark passes every backfilled row's commit, the gap is
	// repaired.
	p.gapClear.Store(uint64(g.ClearAt))
	p.log.Warn("published the rows written while the outbox was outside the publication",
		"rows", n, "since", b.Since, "transactions", len(b.skip))
	return nil
}

// publishRows publishes rows read from the tables as events of txn, stamped
// at: their commit times are gone. count picks the counter of each row's
// table.
func (p *Pipeline) publishRows(ctx context.Context, rows *replication.Rows, txn *offsets.Txn, at time.Time,
	count func(metrics.TableEvents) prometheus.Counter) (int, error) {
	var rec router.Record
	n := 0
	for rows.Next() {
		ev, err := rows.Event()
		if err != nil {
			return n, err
		}
		if err := p.publish(ctx, txn, router.Source{Commit: at}, &ev, nil, &rec); err != nil {
			return n, err
		}
		count(p.tableMetrics[ev.Table]).Inc()
		n++
	}
	return n, rows.Err()
}
