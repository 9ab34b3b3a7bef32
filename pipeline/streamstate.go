package pipeline

import (
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// What the stream's completeness depends on travels with every checkpoint
// (offsets.Checkpoint.Stream and Floor): PostgreSQL decodes an insert only
// if its table was in the publication when the insert was written, and
// nothing in the stream tells a restart that the table left it and came
// back while the connector was stopped (a migration, a deploy). The guard
// watches it while the connector runs; the checkpoint carries it across a
// stop.

// streamState is how each table stands in the publication, as the guards
// vouch for it (they stop the connector on any change while it runs).
func (g *guards) streamState() []offsets.TableStream {
	out := make([]offsets.TableStream, len(g.gs))
	for i, one := range g.gs {
		m := one.Start()
		out[i] = offsets.TableStream{Table: g.srcs[i].Schema + "." + g.srcs[i].Table, RelID: m.RelID,
			PubOID: m.PubOID, PubXmin: m.PubXmin, PubRelID: m.PubRelID, Xmin: one.Xmin()}
		if e, ok := one.Vouched(); ok {
			out[i].Xmin, out[i].Verified = e.Below, e.By
		}
	}
	return out
}

// savedChange is what changedSince found.
type savedChange struct {
	why  string
	xmin uint64 // the lowest bound of the changed tables' rows the stream may lack
	// ended: every transaction below xmin had ended by this position (the
	// lowest of the changed tables' Verified); 0: unknown.
	ended lsn.LSN
}

// changedSince compares the state saved with a checkpoint with the one the
// guards found at start, and says what changed (why "": nothing, or
// nothing recorded: a checkpoint of an older version, a table new to the
// config).
func (g *guards) changedSince(saved []offsets.TableStream) savedChange {
	return changedTables(saved, g.streamState())
}

func changedTables(saved, now []offsets.TableStream) (c savedChange) {
	for _, s := range saved {
		for _, n := range now {
			if n.Table != s.Table {
				continue
			}
			if w := streamChange(s, n); w != "" {
				if c.why == "" {
					c = savedChange{why: n.Table + ": " + w, xmin: s.Xmin, ended: s.Verified}
				}
				c.xmin = min(c.xmin, s.Xmin)
				if s.Verified == 0 || c.ended == 0 {
					c.ended = 0
				} else {
					c.ended = min(c.ended, s.Verified)
				}
			}
		}
	}
	return c
}

// streamChange says how a table's state changed between two readings.
func streamChange(was, now offsets.TableStream) string {
	switch {
	case now.RelID != was.RelID:
		return "the table was dropped and created again (or renamed and replaced)"
	case now.PubOID != was.PubOID:
		return "the publication was dropped and created again"
	case now.PubRelID != was.PubRelID:
		return "the table was removed from the publication and added again"
	case now.PubXmin != was.PubXmin:
		return "the publication was altered (ALTER PUBLICATION ... SET)"
	}
	return ""
}

// floor is the highest floor any table's guard knows for pos (every one
// bounds the same cluster's transactions).
func (g *guards) floor(pos lsn.LSN) uint64 {
	var f uint64
	for _, one := range g.gs {
		f = max(f, one.Floor(pos))
	}
	return f
}

// finished is what the reading behind pos of the guard that found the gap
// knew of the ended transactions; offsets.MaxRepairedXids bounds the list
// saved, past it: unknown. Unknown with several tables: one guard's good
// readings vouch for its own table only, and a change to another table,
// held invisible by a synchronous standby, can look ended at them while
// that table's reading failed (review15).
func (g *guards) finished(pos lsn.LSN) offsets.FinishedTxns {
	if len(g.gs) > 1 {
		return offsets.FinishedTxns{}
	}
	var best replication.Finished
	for _, one := range g.gs {
		if f, ok := one.Finished(pos); ok && f.Xmax > best.Xmax {
			best = f
		}
	}
	if best.Xmax == 0 || len(best.Open) > offsets.MaxRepairedXids {
		return offsets.FinishedTxns{}
	}
	open := make([]int64, len(best.Open))
	for i, x := range best.Open {
		open[i] = int64(x)
	}
	return offsets.FinishedTxns{Xmax: best.Xmax, Open: offsets.JoinXids(open)}
}

// seedFloor gives every guard the floor saved with the start's checkpoint.
func (g *guards) seedFloor(at lsn.LSN, xmin uint64) {
	for _, one := range g.gs {
		one.SeedFloor(at, xmin)
	}
}

// changeWhileStopped compares the state the checkpoint c saved with the
// one the guards found at start: a change means rows written while a table
// was outside the publication were never decoded, and the repair reads them
// back from the table (repair.decide, backfill.go) before anything retention
// may delete. Their transactions committed after c, so their ids are at or
// above the bound the guard had when c was saved, which in exactly_once the
// checkpoint was held back for (hold.go): the stream then decodes again
// every delivered row the repair reads, and leaves it out. Nil: no change.
func changeWhileStopped(pl *plan, c *offsets.Checkpoint, exactlyOnce bool) *stoppedChange {
	ch := pl.guard.changedSince(c.Stream)
	if ch.why == "" {
		return nil
	}
	// Since is where the repair goes: at the run's start, not the older
	// checkpoint; in exactly_once at or past the position committed to
	// Kafka (the start may be below it: the history proves less, and what
	// lies between is read back). Nothing then commits to Kafka past Since
	// before the repair does (backfill.due), so a committed position past
	// Since at a later start says the repair committed (repair.decide).
	since := max(c.LSN, pl.start, pl.readings.committed)
	xmin := stoppedBound(ch.xmin, pl.guard.floor(since), exactlyOnce)
	if exactlyOnce {
		since = stoppedSince(since, ch.ended)
	}
	return &stoppedChange{why: ch.why, since: since, xmin: xmin, saved: ch.xmin}
}

// stoppedSince moves the repair of a change found at start, in
// exactly_once, to where every transaction below its bound had ended
// (ended; 0: unknown), when that is past since. The checkpoint and the
// position committed to Kafka can trail it (a Kafka transaction waits
// behind an event), and a transaction below the bound committed in between,
// never committed to Kafka, was decoded after a repair at since, behind the
// later rows of its aggregate the repair published: a first delivery out
// of order (chaos seed 8825403953442955520). The change came after the
// guard vouched for that position (it stops the connector on a change while
// it runs), so every row the repair is for commits past it; the rows at or
// above the bound that commit before it are decoded (the hold, hold.go) and
// left out. Not in at_least_once: there is no hold, so a delivered row at
// or above the bound below the start would go again after the stream's
// replay up to that position, out of order (review11); the repair stays at
// the start, ahead of the replay, and reads from the floor (stoppedBound).
func stoppedSince(since, ended lsn.LSN) lsn.LSN { return max(since, ended) }

// stoppedBound is the bound of the repair of a change found at start, from
// the bound saved with the checkpoint and the floor of the repair's
// position (every transaction committing after it has an id at or above
// it; 0: unknown). The saved bound covers every row the change kept from
// the stream, but the checkpoint can trail it: a transaction delivered
// before the stop, committed past the checkpoint with an id below the
// bound (its acknowledgement waited behind another event), is decoded
// again after the repair published the later rows of its aggregate, a
// copy out of the original order. So at_least_once reads from the floor:
// the repair then holds every transaction past its position and the
// stream skips them (rows below it committed earlier go again, as copies).
// exactly_once keeps the saved bound: the start is held back for that one
// alone (hold.go), and a row below it committed before the start would be
// published twice; the repair goes where those below it had ended
// (stoppedSince).
func stoppedBound(saved, floor uint64, exactlyOnce bool) uint64 {
	if exactlyOnce || floor == 0 {
		return saved
	}
	return min(saved, floor)
}
