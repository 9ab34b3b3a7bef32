// Package metrics holds the Prometheus metrics the contract names. Each
// connector owns one Metrics with its own registry, so tests can run several.
package metrics

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are updated by the pipeline and served at /metrics. Each metric
// has one writer, so it has one definition: two writers with different
// readings make a gauge jump between them at each write.
type Metrics struct {
	Registry *prometheus.Registry

	// Published, DeadLettered, Parked and CommitToAck count events by the
	// outbox table they came from (label table, tables.go).
	Published    *prometheus.CounterVec
	DeadLettered *prometheus.CounterVec
	Parked       *prometheus.CounterVec // dlq.mode quarantine
	Quarantined  prometheus.Gauge
	Redrives     *prometheus.CounterVec // by result: redriven, skipped, failed
	ConfirmedLSN prometheus.Gauge
	ReceivedLSN  prometheus.Gauge
	LagBytes     prometheus.Gauge // written by the slot monitor only (replication.SlotInfo.LagBytes)
	InFlight     prometheus.Gauge
	CommitToAck  *prometheus.HistogramVec
	Connected    prometheus.Gauge
	Reconnects   prometheus.Counter
	Transactions prometheus.Counter

	RetainedWAL   prometheus.Gauge
	SlotWALStatus *prometheus.GaugeVec
	// SlotFailoverReady is written by the slot monitor only
	// (replication.FailoverState.Ready).
	SlotFailoverReady prometheus.Gauge
	CheckpointLSN     prometheus.Gauge
	CheckpointErrors  prometheus.Counter
	SnapshotEvents    *prometheus.CounterVec // by outbox table (tables.go)
	BackfilledEvents  *prometheus.CounterVec // by outbox table (tables.go)
	FatalErrors       *prometheus.CounterVec
	MessagesIgnored   *prometheus.CounterVec // logical decoding messages not published, by prefix (pipeline/messages.go)
	// TraceContextInvalid and TraceSpansDropped: trace.go.
	TraceContextInvalid prometheus.Counter
	TraceSpansDropped   prometheus.Counter
	// Retention: retention.go.
	Retention Retention
	// ContractsWaiting is 1 while the processor waits for the schema
	// registry to resolve an event's subject (contracts.*); written by the
	// pipeline's contract gate only (pipeline/contracts.go).
	ContractsWaiting prometheus.Gauge
	// Contracts: the contract violations and the registry client
	// (contracts.go).
	Contracts Contracts

	start     time.Time
	lastEvent atomic.Int64 // unix nanoseconds of the last acknowledged event
}

// EventAcked records when the last event was acknowledged.
func (m *Metrics) EventAcked(t time.Time) { m.lastEvent.Store(t.UnixNano()) }

// WALStatuses are the values of pg_replication_slots.wal_status.
var WALStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// SetWALStatus sets the one-hot slot_wal_status gauge.
func (m *Metrics) SetWALStatus(status string) {
	for _, s := range WALStatuses {
		v := 0.0
		if s == status {
			v = 1
		}
		m.SlotWALStatus.WithLabelValues(s).Set(v)
	}
}

// New creates and registers every metric.
func New() *Metrics {
	ns := "outbox_cdc"
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_published_total",
			Help: "Outbox events acknowledged by the broker on their destination topic, by outbox table."}, []string{TableLabel}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_dead_lettered_total",
			Help: "Outbox events that could never be published and were acknowledged on the dead-letter topic, by outbox table."}, []string{TableLabel}),
		Parked: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_parked_total",
			Help: "Outbox events of quarantined aggregates acknowledged on the parking topic, by outbox table."}, []string{TableLabel}),
		Quarantined: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "quarantined_aggregates",
			Help: "Aggregates quarantined after a dead letter: their later events are parked."}),
		Redrives: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "redrives_total",
			Help: "Quarantines the connector lifted (redriven, skipped) or failed to lift (failed) on an outbox-cdc redrive request."}, []string{"result"}),
		ConfirmedLSN: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "confirmed_lsn",
			Help: "Last LSN confirmed (flushed) to PostgreSQL, as a number."}),
		ReceivedLSN: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "received_lsn",
			Help: "Highest WAL position received from PostgreSQL, as a number."}),
		LagBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "replication_lag_bytes",
			Help: "WAL not yet confirmed by the slot: the server's WAL position (replay position on a standby) minus confirmed_flush_lsn, in bytes, " +
				"read from pg_replication_slots every 10 s (the lag of outbox-cdc status). " +
				"Only acknowledged positions are confirmed, so it grows while Kafka or the stream is down; " +
				"with postgres.retain it includes the replay window."}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "inflight_events",
			Help: "Events produced and not yet acknowledged."}),
		CommitToAck: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "commit_to_ack_seconds",
			Help:    "Time from the transaction's commit in PostgreSQL to the broker's acknowledgement, by outbox table.",
			Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{TableLabel}),
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "connected",
			Help: "1 while the replication stream is established, else 0."}),
		Reconnects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "reconnects_total",
			Help: "Replication connections re-established after a loss."}),
		Transactions: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "transactions_total",
			Help: "Source transactions received (with or without outbox events)."}),
	}
	m.RetainedWAL = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "slot_retained_wal_bytes",
		Help: "WAL the replication slot keeps from removal: current WAL position minus restart_lsn."})
	m.SlotWALStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "slot_wal_status",
		Help: "pg_replication_slots.wal_status of the slot: 1 for the current status."}, []string{"status"})
	m.SlotFailoverReady = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "slot_failover_ready",
		Help: "1 when a standby can take the slot over: a failover slot (PostgreSQL 17+) and an active physical slot in synchronized_standby_slots."})
	m.CheckpointLSN = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "checkpoint_lsn",
		Help: "Last acknowledged position saved to the checkpoint store, as a number."})
	m.CheckpointErrors = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "checkpoint_errors_total",
		Help: "Failed checkpoint saves (each means more duplicates after a PostgreSQL crash, never loss)."})
	m.SnapshotEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "snapshot_events_total",
		Help: "Rows published from the initial snapshot (snapshot.mode pending), by outbox table."}, []string{TableLabel})
	m.BackfilledEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "backfilled_events_total",
		Help: "Rows read back from the outbox table after it had been outside the publication (gap repair), by outbox table."}, []string{TableLabel})
	m.FatalErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "fatal_errors_total",
		Help: "Errors that stopped the connector, by reason (slot_missing, slot_or_publication_missing, slot_invalidated, timeline_fork, server_rewound, outbox_left_stream, schema_mismatch, delivery, contract, other)."}, []string{"reason"})
	m.MessagesIgnored = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "logical_messages_ignored_total",
		Help: "Logical decoding messages seen and not published (another prefix than outbox.message_prefix, or not transactional), by prefix."}, []string{"prefix"})
	m.ContractsWaiting = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "contracts_waiting",
		Help: "1 while an event waits for the schema registry to resolve its subject (registry unreachable, subject not cached): nothing after it is published or confirmed; else 0."})
	m.start = time.Now()
	m.addTrace(ns)
	m.addRetention(ns)
	m.addContracts(ns)
	sinceLast := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "seconds_since_last_event",
		Help: "Seconds since the last event was acknowledged (since start when none yet)."}, func() float64 {
		last := m.start
		if n := m.lastEvent.Load(); n != 0 {
			last = time.Unix(0, n)
		}
		return time.Since(last).Seconds()
	})
	m.Registry.MustRegister(m.Parked, m.Quarantined, m.Redrives, m.ContractsWaiting)
	m.Registry.MustRegister(m.Published, m.DeadLettered, m.ConfirmedLSN, m.ReceivedLSN, m.LagBytes, m.InFlight,
		m.CommitToAck, m.Connected, m.Reconnects, m.Transactions,
		m.RetainedWAL, m.SlotWALStatus, m.SlotFailoverReady, m.CheckpointLSN, m.CheckpointErrors, m.SnapshotEvents, m.BackfilledEvents, m.FatalErrors, m.MessagesIgnored, sinceLast,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}
