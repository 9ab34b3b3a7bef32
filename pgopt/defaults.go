// Package pgopt holds the defaults of what the configuration states about
// the PostgreSQL side (postgres.*), as kafkaopt does for Kafka: the
// configuration, the stream and the pipeline read them from here, so each
// is written once. It imports nothing of the driver.
package pgopt

import "time"

const (
	// DefaultStatusInterval is postgres.status_interval: the longest time
	// between two standby status updates.
	DefaultStatusInterval = time.Second
	// DefaultBackoffMax is postgres.reconnect_backoff_max.
	DefaultBackoffMax = 30 * time.Second
	// DefaultQueueBytes bounds the WAL data waiting between the stream and
	// the processor (postgres.queue_bytes).
	DefaultQueueBytes = 64 << 20
	// DefaultQueueMessages bounds the WAL messages waiting there.
	DefaultQueueMessages = 1024
	// DefaultReceiveTimeout ends a silent replication connection
	// (postgres.receive_timeout), as PostgreSQL's own wal_receiver_timeout.
	DefaultReceiveTimeout = 60 * time.Second
	// DefaultHeartbeatInterval is postgres.heartbeat_interval.
	DefaultHeartbeatInterval = 10 * time.Second
	// DefaultRetainedWALWarn is postgres.retained_wal_warn_bytes.
	DefaultRetainedWALWarn = 1 << 30
	// DefaultMonitorInterval is how often the slot's statistics are read.
	DefaultMonitorInterval = 10 * time.Second
	// DefaultPasswordCommandTimeout is postgres.password_command_timeout.
	DefaultPasswordCommandTimeout = 10 * time.Second
)
