package metrics

import "github.com/prometheus/client_golang/prometheus"

// Retention holds the outbox table metrics (outbox.retention and the
// waiting events); the retention loop (pipeline/retention.go) writes the
// table gauges and the counter, the unacknowledged-age loop the last one.
type Retention struct {
	Deleted    *prometheus.CounterVec // by outbox table
	OldestRow  *prometheus.GaugeVec   // seconds, by outbox table
	TableBytes *prometheus.GaugeVec   // by outbox table
	// PartitionsCreated and PartitionsDropped: a partitioned outbox's
	// partitions the connector made ahead and dropped behind, by table.
	PartitionsCreated, PartitionsDropped *prometheus.CounterVec
	// OldestUnacked: seconds since the oldest decoded transaction not yet
	// acknowledged committed; zero when nothing waits.
	OldestUnacked prometheus.Gauge
}

// addRetention creates and registers the retention metrics.
func (m *Metrics) addRetention(ns string) {
	m.Retention = Retention{
		Deleted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "outbox_rows_deleted_total",
			Help: "Delivered outbox rows deleted past outbox.retention, by outbox table."}, []string{TableLabel}),
		OldestRow: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "outbox_oldest_row_age_seconds",
			Help: "Age of the outbox table's oldest row by its created_at, on the database's clock (0 when empty), read each retention round, by outbox table."}, []string{TableLabel}),
		TableBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "outbox_table_bytes",
			Help: "pg_total_relation_size of the outbox table (heap, indexes, TOAST), read each retention round, by outbox table."}, []string{TableLabel}),
		PartitionsCreated: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "outbox_partitions_created_total",
			Help: "Partitions of a partitioned outbox table the connector created ahead (outbox.partition_width, outbox.partitions_ahead), by outbox table."}, []string{TableLabel}),
		PartitionsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "outbox_partitions_dropped_total",
			Help: "Partitions the connector made that it detached and dropped once wholly past outbox.retention and delivered, by outbox table."}, []string{TableLabel}),
		OldestUnacked: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "oldest_unacknowledged_event_age_seconds",
			Help: "Seconds since the oldest decoded transaction not yet acknowledged by Kafka committed (within 10 ms); 0 when nothing waits. WAL not yet decoded is in replication_lag_bytes."}),
	}
	r := m.Retention
	m.Registry.MustRegister(r.Deleted, r.OldestRow, r.TableBytes, r.PartitionsCreated, r.PartitionsDropped, r.OldestUnacked)
}
