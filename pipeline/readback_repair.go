package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// The gap repair under a read-back: exactly_once after a restore whose
// runbook forgot the position, with a gap still recorded in the restored
// checkpoint. The repair before the restore published the gap's rows and
// committed, and the proof of it (the position) is gone; the stream may
// resume past the gap and decode none of the delivered rows the repair
// reads again (every row at or above the gap's bound, some delivered long
// before the read-back's first event, whose time is now). So the repair's
// rows are looked up one by one, over a window from the slot's restart (or
// an hour back): a row found is not published again; a row missing is
// published and ends nothing, for the repair is an order exception
// already (table order at the gap, backfill.go).

// repairing switches inKafka to the repair's rule while on.
func (b *readBack) repairing(on bool) {
	if b != nil {
		b.repair = on
	}
}

// repaired returns how many of the repair's rows were found in Kafka, and
// lets go of what a finished read-back read for them.
func (b *readBack) repaired() int {
	if b == nil {
		return 0
	}
	if b.done {
		b.held, b.loaded = fingerprints{}, nil
	}
	n := b.repairFound
	b.repairFound = 0
	return n
}

// repairRow reports whether the repair's rec is in Kafka already.
func (b *readBack) repairRow(ctx context.Context, rec *router.Record) (bool, error) {
	if b.full {
		return false, nil // a read passed maxHeld: copies, never a loss
	}
	from := b.floor
	if from.IsZero() {
		from = time.Now().Add(-readBackMargin)
	}
	from = from.Add(-b.margin)
	if b.loaded == nil || b.since.IsZero() || from.Before(b.since) {
		// Read again from further back: a superset of what was held.
		b.since, b.held, b.loaded = from, fingerprints{}, map[string]bool{}
	}
	if !b.loaded[rec.Topic] {
		if err := b.load(ctx, rec.Topic); errors.Is(err, errReadBackFull) {
			b.log.Warn("exactly-once: the read-back would hold too many records; the gap repair publishes its rows, some may be published twice",
				"topic", rec.Topic, "max_records", b.maxHeld)
			b.cut, b.full = true, true
			b.held, b.loaded = fingerprints{}, nil
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	if !b.holds(rec) {
		return false, nil
	}
	b.repairFound++
	return true, nil
}
