package replication

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// The SQL parts of a gap repair's filter (Source.gap): which rows, by the
// full id of the transaction that wrote them.

// xid8 is the full (64-bit) id of the transaction that wrote a row, from its
// 32-bit xmin and ref, a full transaction id at least as new as any row's:
// the epoch is ref's, or the one before when that would put the row after
// ref.
func xid8(ref uint64) string {
	full := "(" + strconv.FormatUint(ref&^0xffffffff, 10) + " + xmin::text::bigint)"
	return fmt.Sprintf("(%s - CASE WHEN %s > %d THEN 4294967296 ELSE 0 END)", full, full, ref)
}

// xidList is offsets.RepairedRows.Xids (the only text the repaired rows'
// filter puts in SQL).
var xidList = regexp.MustCompile(`^([0-9]+(,[0-9]+)*)?$`)

// leaveOut is the filter's part that leaves out the rows an earlier repair
// read (offsets.RepairedRows.Has).
func leaveOut(ref uint64, done offsets.RepairedRows) string {
	if done.IsZero() {
		return ""
	}
	x := xid8(ref)
	f := fmt.Sprintf(" AND NOT (%s >= %d AND %s < %d", x, done.Xmin, x, done.Below)
	if done.Xids != "" {
		f += fmt.Sprintf(" OR %s = ANY('{%s}'::bigint[])", x, done.Xids)
	}
	return f + ")"
}

// leaveOutFinished is the filter's part that leaves out the transactions
// that had ended before the gap (offsets.FinishedTxns; Open validated: an
// id list, xidList). A row's id is its current version's: an UPDATE or a
// rewrite after the reading gives it an id that had not ended then, so
// such a row is read.
func leaveOutFinished(ref uint64, f offsets.FinishedTxns) string {
	if f.IsZero() {
		return ""
	}
	x := xid8(ref)
	return fmt.Sprintf(" AND NOT (%s < %d AND NOT %s = ANY('{%s}'::bigint[]))", x, f.Xmax, x, f.Open)
}

// xidFilter selects the rows written by transactions at or after xmin8.
func xidFilter(ref, xmin8 uint64) string { return fmt.Sprintf("%s >= %d", xid8(ref), xmin8) }
