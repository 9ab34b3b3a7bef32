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
	// seen holds a fingerprint of each row the stream decoded before the
	// repair ran: published by this run, or skipped as delivered before
	// (below the start; in exactly_once, committed in Kafka). Those rows
	// are in Kafka already and the repair leaves them out. In exactly_once
	// the stream starts early enough to decode every delivered row the
	// repair reads (hold.go); in at_least_once this only spares copies.
	seen map[uint64]struct{}
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
	// read is the rows the repair read, with those an earlier repair did:
	// once its transaction commits, all are in Kafka (repair.found).
	read offsets.RepairedRows
	// publishedAny: the repair published a row; without one, the rows it
	// read were the stream's and need no Kafka commit of its own.
	publishedAny bool
	// in is the tracked transaction the repair's rows joined, until it
	// commits: a reconnect that aborts it aborts the repair too.
	in *offsets.Txn
}

func newBackfill(g gapInfo) *backfill {
	return &backfill{gapInfo: g, seen: map[uint64]struct{}{}, seed: maphash.MakeSeed()}
}

// quiet reports whether no repair is pending or skips rows the stream
// decodes: the stream's transactions then decode the same events on every
// run, and may be committed in parts.
func (b *backfill) quiet() bool { return b == nil || b.done && b.published == nil }

// pending reports whether the repair has yet to be handed over.
func (b *backfill) pending() bool { return b != nil && !b.done }

// due reports whether the stream has reached the gap: a transaction that
// commits at or after its start. The repair's Kafka transaction then ends
// past Since, and every one before it at or before Since (a transaction
// whose commit record straddles Since takes the repair in, ends), so in
// exactly_once a committed position past Since says the repair committed.
func (b *backfill) due(final lsn.LSN) bool { return b.pending() && final >= b.Since }

// ends reports whether a transaction ending at end, handed over before the
// repair, would commit a position past Since: the repair joins it.
func (b *backfill) ends(end lsn.LSN) bool { return b.pending() && end > b.Since }

// idle reports whether a keepalive at pos, between transactions, is past
// the gap (strictly: the repair alone then commits pos).
func (b *backfill) idle(pos lsn.LSN) bool { return b.pending() && pos > b.Since }

// note fingerprints a row the stream decoded before the repair.
func (b *backfill) note(ev *decode.Event) {
	if b.pending() && !ev.ID.Null {
		b.seen[b.fingerprint(ev)] = struct{}{}
	}
}

// undo forgets a repair whose transaction a reconnect aborted: it runs
// again when the stream comes back to the gap.
func (b *backfill) undo(txn *offsets.Txn) {
	if b != nil && b.in != nil && b.in == txn {
		b.done, b.in, b.published = false, nil, nil
	}
}

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

// runBackfill publishes the gap's rows, in the snapshot order, as events
// of txn: the transaction the stream reached the gap with (the repair's
// rows go first), or one of their own. The caller commits txn; the rows and
// the position after them then go in one Kafka transaction in exactly_once.
// Rows the stream decoded before (seen) are left out. A lost connection
// (the server restarting) drops the stream's session and returns
// errSessionDropped: the stream waits for the repair, and a server's
// shutdown waits for the stream (replication.Stream.Drop). The new
// session's Reset aborts txn with the rows published so far, and the repair
// runs again when the stream reaches the gap, retried as the stream
// reconnects: with backoff, for ever.
func (w *processor) runBackfill(ctx, produceCtx context.Context, b *backfill, txn *offsets.Txn) error {
	p := w.p
	b.published = map[uint64]struct{}{}
	var n, skipped int
	keep := func(ev *decode.Event) bool {
		if _, ok := b.seen[b.fingerprint(ev)]; ok && !ev.ID.Null {
			skipped++
			return false
		}
		b.record(ev)
		return true
	}
	p.b.repairing(true) // exactly_once after a restore's runbook (readback_repair.go)
	defer p.b.repairing(false)
	// Said before the rows go: a stop or a lost connection can cut the
	// repair after some of them, which are copies in at_least_once.
	p.log.Info("publishing the rows written while the outbox was outside the publication", "since", b.Since, "xmin", b.Xmin)
	g, again, err := w.readBackfill(ctx, produceCtx, txn, &n, keep, b.gapInfo)
	if err != nil {
		if !again || !replication.Transient(err) || ctx.Err() != nil || p.conn.drop == nil {
			return err
		}
		p.log.Warn("the gap repair lost its connection; the stream connects again and the repair reads the table "+
			"again when it reaches the gap", "err", err, "published", n)
		p.conn.drop()
		return errSessionDropped
	}
	b.clearAt = g.ClearAt
	b.read = readRows(b.gapInfo, g.Read)
	found := p.b.repaired()
	b.publishedAny = n > found
	b.done, b.in = true, txn
	p.b.holdUntil(b.clearAt)
	p.log.Warn("published the rows written while the outbox was outside the publication",
		"rows", n-found, "since", b.Since, "transactions", g.Transactions, "skipped_as_delivered", skipped, "found_in_kafka", found)
	return nil
}

// readBackfill is one read of the gap's rows, each published when keep says
// so; n counts the published ones. again: the read failed, not a publish
// (keep noted the row before its publish failed: never read past it).
func (w *processor) readBackfill(ctx, produceCtx context.Context, txn *offsets.Txn, n *int, keep func(*decode.Event) bool,
	gi gapInfo) (g replication.Gap, again bool, err error) {
	p := w.p
	rows, g, err := p.cfg.Source.GapRows(ctx, gi.Xmin, gi.Repaired, gi.Finished, rowSpecs(p.cfg), func(xids []int64) {
		p.log.Warn("the gap repair waits for transactions that were open when it began: one may hold rows written while "+
			"the outbox was outside the publication (see pg_stat_activity.backend_xid, pg_prepared_xacts)", "xids", xids)
	})
	if err != nil {
		return g, true, err
	}
	defer rows.Close()
	k, err := w.publishRows(produceCtx, rows, txn, time.Now(), func(t metrics.TableEvents) prometheus.Counter { return t.Backfilled }, keep)
	*n += k
	return g, err != nil && rows.Err() != nil, err
}

// readRows is what a repair of g read (read), with the rows of the
// repairs before it, g.Repaired, which it left out. One range up to the
// newer read's Below takes in, too, rows neither read: those were written
// outside any gap (a gap's rows are at or above its bound, and a repair
// waits for the gap's writers before it reads), so the stream delivers
// them and no repair needs to. Listed ids below that Below fall in it.
func readRows(g gapInfo, read offsets.RepairedRows) offsets.RepairedRows {
	if g.Repaired.IsZero() {
		return read
	}
	r := offsets.RepairedRows{Xmin: min(read.Xmin, g.Repaired.Xmin), Below: read.Below}
	var ids []int64
	for _, x := range append(offsets.SplitXids(g.Repaired.Xids), offsets.SplitXids(read.Xids)...) {
		if uint64(x) >= r.Below {
			ids = append(ids, x)
		}
	}
	if len(ids) <= offsets.MaxRepairedXids {
		r.Xids = offsets.JoinXids(ids)
	}
	return r
}

// handedOver reports whether txn, just handed over, is the repair's
// transaction (once: it forgets it).
func (b *backfill) handedOver(txn *offsets.Txn) bool {
	if b == nil || b.in == nil || b.in != txn {
		return false
	}
	b.in = nil
	return true
}

// publishRows publishes rows read from the tables as events of txn, stamped
// at: their commit times are gone. count picks the counter of each row's
// table; keep (nil: all) says whether to publish each row.
func (w *processor) publishRows(ctx context.Context, rows *replication.Rows, txn *offsets.Txn, at time.Time,
	count func(metrics.TableEvents) prometheus.Counter, keep func(*decode.Event) bool) (int, error) {
	var rec router.Record
	n := 0
	for rows.Next() {
		ev, err := rows.Event()
		if err != nil {
			return n, err
		}
		if keep != nil && !keep(&ev) {
			continue
		}
		if err := w.publish(ctx, txn, router.Source{Commit: at}, &ev, nil, &rec); err != nil {
			return n, err
		}
		count(w.tables[ev.Table]).Inc()
		n++
	}
	return n, rows.Err()
}
