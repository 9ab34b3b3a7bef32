package metrics

import "github.com/prometheus/client_golang/prometheus"

// TableLabel labels the per-event metrics with the outbox table
// ("schema.table") an event came from; its values are the configured
// tables, so the cardinality is the configuration's.
const TableLabel = "table"

// TableEvents are the per-event metrics of one outbox table.
type TableEvents struct {
	Published, DeadLettered, Parked prometheus.Counter
	CommitToAck                     prometheus.Observer
	// Snapshot and Backfilled count rows read from the table (snapshot,
	// gap repair) as they are produced.
	Snapshot, Backfilled prometheus.Counter
}

// Table returns the per-event metrics of the outbox table named table
// (schema.table), creating its series at zero so that every configured
// table is exported before its first event.
func (m *Metrics) Table(table string) TableEvents {
	return TableEvents{
		Published:    m.Published.WithLabelValues(table),
		DeadLettered: m.DeadLettered.WithLabelValues(table),
		Parked:       m.Parked.WithLabelValues(table),
		CommitToAck:  m.CommitToAck.WithLabelValues(table),
		Snapshot:     m.SnapshotEvents.WithLabelValues(table),
		Backfilled:   m.BackfilledEvents.WithLabelValues(table),
	}
}
