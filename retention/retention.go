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
// Nothing else is assumed about clocks: "older" only decides how long a
// delivered row stays, never whether an undelivered one goes.
package retention

import (
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Reading is what one round reads on the primary, in one snapshot.
type Reading struct {
	At   time.Time // the connector's clock when the reading returned
	WAL  lsn.LSN   // pg_current_wal_insert_lsn(), read after the snapshot was taken
	Xmin uint64    // pg_snapshot_xmin(pg_current_snapshot()), a 64-bit xid
}

// State is what the pipeline knows besides the readings.
type State struct {
	// Owner: this process streams from the slot (a standby waiting for it
	// must not delete: its position is not the active connector's).
	Owner bool
	// Acked is the position everything below is acknowledged at: the gated
	// watermark (at_least_once) or the committed Kafka position (exactly_once).
	Acked lsn.LSN
	// Gap: a gap is recorded or its repair has not been acknowledged; the
	// repair reads rows back from the table.
	Gap bool
	// Snapshot: the initial snapshot is not done; it reads rows too.
	Snapshot bool
	// Hold: rows created at or after it may never have been delivered: the
	// slot was lost and created again, and verify --repair has not covered
	// them yet (offsets.Checkpoint.RepairSince). Zero: none.
	Hold time.Time
}

// maxReadingAge bounds how old a reading may be when its Xmin is compared
// with rows' 32-bit xmin (replication/retention.go): far inside the 2^31
// transactions that wraparound protection keeps every live xid within.
const maxReadingAge = 10 * time.Minute

// keep is how many readings wait for the acknowledged position at most;
// under a stall the oldest are dropped (a newer one serves as well, later).
const keep = 64

// Decision is what a round may do.
type Decision struct {
	// Delete: rows older than the retention whose xmin precedes Below may
	// be deleted. Why says why not, when Delete is false.
	Delete bool
	Below  uint64
	Why    string
}

// Decide returns what may be deleted now, and the readings still worth
// keeping (the one used and those the acknowledged position has not
// reached, oldest first).
// readings are in the order they were taken.
func Decide(now time.Time, readings []Reading, s State) (Decision, []Reading) {
	var fresh []Reading
	for _, r := range readings {
		if now.Sub(r.At) <= maxReadingAge {
			fresh = append(fresh, r)
		}
	}
	// The newest reading the acknowledged position reached; older readings
	// vouch for fewer rows, so they are dropped. It is kept: later rounds
	// use it for rows that reach the retention while the position stalls.
	best := -1
	for i, r := range fresh {
		if r.WAL <= s.Acked {
			best = i
		}
	}
	var d Decision
	rest := fresh
	if best >= 0 {
		d = Decision{Delete: true, Below: fresh[best].Xmin}
		rest = fresh[best:]
	} else {
		d.Why = "waiting for the acknowledged position to reach a reading"
	}
	if len(rest) > keep { // the newest, and the one used if any
		newest := rest[len(rest)-keep+1:]
		if best >= 0 {
			rest = append([]Reading{rest[0]}, newest...)
		} else {
			rest = rest[len(rest)-keep:]
		}
	}
	if why := Blocked(s); why != "" {
		d = Decision{Why: why}
	}
	return d, append([]Reading(nil), rest...)
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
