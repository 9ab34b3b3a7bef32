// Package retention decides which outbox rows the connector may delete.
//
// The rule (docs/operations.md, "Outbox retention"): a round takes a Reading
// on the primary in one statement, hence one snapshot S: the snapshot's xmin
// X and then the WAL insert position W. A transaction whose id precedes X
// was no longer running when S was taken, so if it committed, its commit
// record was inserted before S, and so ends at or before W (PostgreSQL
// inserts the commit record before it leaves the proc array:
// xact.c RecordTransactionCommit, then ProcArrayEndTransaction). Once the
// acknowledged position (the gated watermark; in exactly_once the position
// committed to Kafka) is at or past W, every row whose xmin precedes X is
// delivered, and may be deleted once it is older than the retention.
//
// That holds only while every position compared belongs to one history and
// the stream decoded every row committed below it, so a reading is used
// only with the readings and the session it shares an Epoch with, every
// other logical slot of the database bounds the position too (another
// consumer needs its rows), and a lost slot's Hold keeps the transactions
// no slot streamed. Nothing is assumed about clocks: "older" only decides
// how long a delivered row stays, never whether an undelivered one goes.
package retention

import (
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Reading is what one round reads on the primary, in one statement.
type Reading struct {
	At   time.Time // the connector's clock when the reading returned
	WAL  lsn.LSN   // pg_current_wal_insert_lsn(), read after the snapshot was taken
	Xmin uint64    // pg_snapshot_xmin(pg_current_snapshot()), a 64-bit xid
	// Next is the snapshot's xmax: every xid assigned so far is below it,
	// so every live row's xid is within Next - 2^31 .. Next.
	Next  uint64
	Epoch Epoch
	// Slots are the other logical slots of the database, read in the same
	// statement: their consumers need the rows they have not confirmed.
	Slots []Slot
}

// Epoch is what a reading's positions and xids are comparable within: one
// cluster, one timeline, one connection of the retainer (a reconnect may
// reach a server restored under the same timeline) and one session of the
// stream (the acknowledged position is compared with positions of the
// server that session checked).
type Epoch struct {
	SystemID string
	Timeline uint32
	Conn     uint64
	Session  uint64
}

// Slot is another logical slot of the database and the position its
// consumer confirmed (zero: none yet, which holds every row back).
type Slot struct {
	Name      string
	Confirmed lsn.LSN
}

// Hold is a range of 64-bit xids [From, Below) whose rows may never have
// been delivered: a lost slot's (the transactions that committed after the
// last checkpoint and before the new slot streams). Below zero: no hold;
// From zero: unknown (a checkpoint that recorded no floor), every xid below
// Below.
type Hold struct {
	From, Below uint64
}

// Set reports whether h holds anything.
func (h Hold) Set() bool { return h.Below != 0 }

// Merge is the smallest hold covering both.
func (h Hold) Merge(o Hold) Hold {
	switch {
	case !h.Set():
		return o
	case !o.Set():
		return h
	}
	return Hold{From: min(h.From, o.From), Below: max(h.Below, o.Below)}
}

// State is what the pipeline knows besides the readings.
type State struct {
	// Owner: this process streams from the slot (a standby waiting for it
	// must not delete: its position is not the active connector's).
	Owner bool
	// Session counts the stream's sessions: a reading taken in another one
	// is not compared with the acknowledged position.
	Session uint64
	// Acked is the position everything below is acknowledged at: the gated
	// watermark (at_least_once) or the committed Kafka position
	// (exactly_once), capped while a reconnect decodes again.
	Acked lsn.LSN
	// Gap: a gap is recorded or its repair has not been acknowledged; the
	// repair reads rows back from the table.
	Gap bool
	// Snapshot: the initial snapshot is not done; it reads rows too.
	Snapshot bool
	// Hold: the lost slot's repair hold (replication/holds.go); HoldRead
	// false: the last read of it failed, so a hold stored since may be
	// missing from Hold.
	Hold     Hold
	HoldRead bool
}

// maxXidSpan bounds how far a reading's or a hold's xid may lie behind the
// newest reading's Next when it is compared with rows' 32-bit xmin
// (replication/retention.go, modulo 2^32): half the 2^31 that wraparound
// protection keeps every live xid within.
const maxXidSpan = 1 << 30

// keep is how many readings wait for the acknowledged position at most;
// under a stall the oldest are dropped (a newer one serves as well, later).
const keep = 64

// Decision is what a round may do.
type Decision struct {
	// Delete: rows older than the retention whose xmin precedes Below, and
	// outside Keep, may be deleted. Why says why not, when Delete is false.
	Delete bool
	Below  uint64
	Keep   Hold
	Why    string
}

// Decide returns what may be deleted now, and the readings still worth
// keeping (the one used and those the bound has not reached, oldest first).
// readings are in the order they were taken; the newest decides the epoch
// and the other slots.
func Decide(readings []Reading, s State) (Decision, []Reading) {
	if len(readings) == 0 {
		return Decision{Why: "no reading yet"}, nil
	}
	newest := readings[len(readings)-1]
	var fresh []Reading
	for _, r := range readings {
		if r.Epoch == newest.Epoch && r.Epoch.Session == s.Session && newest.Next-r.Xmin < maxXidSpan {
			fresh = append(fresh, r)
		}
	}
	bound, why := Bound(s.Acked, newest.Slots)
	// The newest reading the bound reached; older readings vouch for fewer
	// rows, so they are dropped. It is kept: later rounds use it for rows
	// that reach the retention while the position stalls.
	best := -1
	for i, r := range fresh {
		if r.WAL <= bound {
			best = i
		}
	}
	var d Decision
	rest := fresh
	if best >= 0 {
		d = Decision{Delete: true, Below: fresh[best].Xmin, Keep: s.Hold}
		rest = fresh[best:]
	} else {
		d.Why = "waiting for " + why + " to reach a reading"
	}
	if len(rest) > keep { // the newest, and the one used if any
		newer := rest[len(rest)-keep+1:]
		if best >= 0 {
			rest = append([]Reading{rest[0]}, newer...)
		} else {
			rest = rest[len(rest)-keep:]
		}
	}
	if why := Blocked(s); why != "" {
		d = Decision{Why: why}
	} else if h := s.Hold; h.Set() && (newest.Next-h.Below >= maxXidSpan || h.From != 0 && newest.Next-h.From >= maxXidSpan) {
		d = Decision{Why: fmt.Sprintf("the lost slot's hold on xids [%d, %d) is too far back to compare with rows' xids: "+
			"run outbox-cdc verify --repair", h.From, h.Below)}
	}
	return d, append([]Reading(nil), rest...)
}

// Bound is the position every consumer acknowledged: the lower of acked
// and each other slot's confirmed position, and what it is ("the
// acknowledged position", or the slot holding it back).
func Bound(acked lsn.LSN, slots []Slot) (lsn.LSN, string) {
	b, why := acked, "the acknowledged position"
	for _, sl := range slots {
		if sl.Confirmed < b {
			b, why = sl.Confirmed, fmt.Sprintf("slot %s (another consumer of the database, confirmed at %v)", sl.Name, sl.Confirmed)
		}
	}
	return b, why
}

// Blocked says why nothing may be deleted whatever the readings ("": not
// blocked). The pipeline asks again before each batch of a round.
func Blocked(s State) string {
	switch {
	case !s.Owner:
		return "not streaming from the slot"
	case s.Snapshot:
		return "the initial snapshot is not done"
	case s.Gap:
		return "a gap is recorded and its repair not acknowledged"
	case !s.HoldRead:
		return "the lost slots' repair holds could not be read"
	}
	return ""
}

// Pace returns how long to rest after a batch that took took, so that
// deleting takes at most duty of the time (0 < duty <= 1).
func Pace(took time.Duration, duty float64) time.Duration {
	if duty >= 1 || duty <= 0 {
		return 0
	}
	return time.Duration(float64(took) * (1 - duty) / duty)
}
