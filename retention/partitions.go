package retention

import "time"

// Window is a partition's range [From, To).
type Window struct{ From, To time.Time }

// Ahead returns the partitions that should exist at now: the one holding
// now and ahead more, each width wide, aligned on multiples of width since
// the Unix epoch (UTC midnight for a day). Creating ahead means an insert
// never finds no partition while the connector runs (a default partition,
// if any, takes rows when it stops for longer).
func Ahead(now time.Time, width time.Duration, ahead int) []Window {
	start := now.UTC().Truncate(width) // Truncate works on absolute time: epoch-aligned
	out := make([]Window, 0, ahead+1)
	for i := range ahead + 1 {
		from := start.Add(time.Duration(i) * width)
		out = append(out, Window{From: from, To: from.Add(width)})
	}
	return out
}

// Behind reports whether every row a partition can hold is past the
// retention at now: its upper bound is at or before now - retention (the
// partition constraint keeps created_at below it). Whether its rows are
// delivered is the reading's to decide, row by row.
func Behind(w Window, now time.Time, retention time.Duration) bool {
	return !w.To.After(now.Add(-retention))
}
