package pipeline

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/decode"
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
	// published holds a fingerprint of each row the backfill published:
	// the stream decodes some of them too (those written while the table
	// was in the publication), and they are delivered already. Only those
	// rows are skipped, never a whole transaction: its table-less events
	// (outbox.message_prefix) are not in the table, and a row inserted in a
	// SAVEPOINT carries the subtransaction's id, not the one the stream
	// gives the transaction.
	published map[uint64]struct{}
	seed      maphash.Seed
	// clearAt is past the commit of every row read: a transaction the
	// stream decodes from there on holds none of them.
	clearAt lsn.LSN
}

// due reports whether the stream has reached the gap: a transaction that
// commits at or after its start, or a keepalive past it between
// transactions.
func (b *backfill) due(pos lsn.LSN) bool { return b != nil && !b.done && pos >= b.Since }

// delivered reports whether the backfill published ev, a row of the
// transaction that commits at final, already.
func (b *backfill) delivered(final lsn.LSN, ev *decode.Event) bool {
	if b == nil || b.published == nil || final >= b.clearAt {
		return false
	}
	_, ok := b.published[b.fingerprint(ev)]
	return ok
}

// record notes that the backfill published ev. A row without an id is not
// noted: a second copy (dead-lettered) beats skipping another such row.
func (b *backfill) record(ev *decode.Event) {
	if !ev.ID.Null {
		b.published[b.fingerprint(ev)] = struct{}{}
	}
}

// passed forgets the rows once the stream dispatched everything up to pos.
func (b *backfill) passed(pos lsn.LSN) {
	if b != nil && b.published != nil && pos >= b.clearAt {
		b.published = nil
	}
}

// fingerprint identifies a row: its table, id, aggregate and type, as the
// table read and the stream both give them (text). A 64-bit hash (random
// seed per run), as verify's: a decoded row outside the backfill that
// collides with one of its n rows (about n·m/2⁶⁴ for m such rows, and
// only rows committed before clearAt are looked up) would be skipped; a
// row whose columns changed since it was written is not, and goes twice.
func (b *backfill) fingerprint(ev *decode.Event) uint64 {
	var h maphash.Hash
	h.SetSeed(b.seed)
	h.Write(binary.LittleEndian.AppendUint32(nil, uint32(ev.Table)))
	for _, v := range [...]decode.Value{ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType} {
		if v.Null {
			h.WriteByte(0)
			continue
		}
		h.WriteByte(1) // then the length: no two splits of the bytes hash alike
		h.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(v.Bytes))))
		h.Write(v.Bytes)
	}
	return h.Sum64()
}

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
	b.published, b.seed, b.clearAt = map[uint64]struct{}{}, maphash.MakeSeed(), g.ClearAt
	n, err := p.publishRows(produceCtx, rows, txn, time.Now(), func(t metrics.TableEvents) prometheus.Counter { return t.Backfilled }, b.record)
	if err != nil {
		return err
	}
	p.tracker.Commit(txn, end)
	p.endTxn(end)
	b.done = true
	// Once the watermark passes every backfilled row's commit, the gap is
	// repaired.
	p.gapClear.Store(uint64(g.ClearAt))
	p.log.Warn("published the rows written while the outbox was outside the publication",
		"rows", n, "since", b.Since, "transactions", len(g.Xids))
	return nil
}

// publishRows publishes rows read from the tables as events of txn, stamped
// at: their commit times are gone. count picks the counter of each row's
// table; each (nil: none) is told of each row published.
func (p *Pipeline) publishRows(ctx context.Context, rows *replication.Rows, txn *offsets.Txn, at time.Time,
	count func(metrics.TableEvents) prometheus.Counter, each func(*decode.Event)) (int, error) {
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
		if each != nil {
			each(&ev)
		}
		count(p.tableMetrics[ev.Table]).Inc()
		n++
	}
	return n, rows.Err()
}
