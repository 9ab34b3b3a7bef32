// Package config loads, defaults and validates the outbox-cdc configuration;
// docs/configuration.md is the reference of its keys.
//
// The layers are the defaults (Default), an optional YAML file, then the
// environment variables OUTBOX_CDC_<KEY>, where <KEY> is the dotted key path
// upper-cased with dots replaced by underscores (postgres.dsn →
// OUTBOX_CDC_POSTGRES_DSN). Later layers win.
//
// Every problem (an unknown key, a value of the wrong type or out of range)
// is a FieldError naming the key; Load and Validate return all of them at
// once, joined into one error that prints a line each.
//
// Secrets have types of their own, DSN and kafkaopt.Secret, that print redacted
// whatever prints them, so a Config is safe to print or log.
//
// Names of tables and columns are exact catalog names (unquoted SQL
// identifiers are stored lower-case), compared case-sensitively with what the
// replication stream reports.
package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/pgopt"
	"github.com/outbox-cdc/outbox-cdc/router"
)

const (
	// EnvPrefix starts the name of every environment variable this package reads.
	EnvPrefix = "OUTBOX_CDC_"
	// EnvConfigPath names the variable that holds the path of the config
	// file. The caller reads it (Load ignores it).
	EnvConfigPath = EnvPrefix + "CONFIG"
	// envTestPrefix starts variables reserved for tests; Load ignores them.
	envTestPrefix = EnvPrefix + "TEST_"
)

// Config is the whole outbox-cdc configuration. The meaning, default and
// range of every key are in docs/configuration.md.
type Config struct {
	Postgres   Postgres   `koanf:"postgres"`
	Outbox     Outbox     `koanf:"outbox"`
	Kafka      Kafka      `koanf:"kafka"`
	HTTP       HTTP       `koanf:"http"`
	Log        Log        `koanf:"log"`
	Checkpoint Checkpoint `koanf:"checkpoint"` // where the acknowledged position is saved
	Snapshot   Snapshot   `koanf:"snapshot"`   // rows already in the outbox when the slot is created
	OTel       OTel       `koanf:"otel"`       // the connector's spans (OpenTelemetry)
	DLQ        DLQ        `koanf:"dlq"`        // what follows a dead letter (quarantine.go)
	Contracts  Contracts  `koanf:"contracts"`  // event schemas in a registry (contracts.go)
}

// Postgres is the replication source.
type Postgres struct {
	// DSN is a libpq connection string, URL or keyword form. Required.
	DSN DSN `koanf:"dsn"`
	// PasswordFile holds the password of the DSN's role, re-read at every
	// connection attempt (PasswordSource); not allowed with a password in
	// the DSN.
	PasswordFile string `koanf:"password_file"`
	// PasswordCommand is run (sh -c) at every connection attempt; its
	// standard output is the password (PasswordSource). Not with
	// PasswordFile nor a password in the DSN.
	PasswordCommand        string        `koanf:"password_command"`
	PasswordCommandTimeout time.Duration `koanf:"password_command_timeout"`
	// PrimaryDSN is the primary of a DSN that is a hot standby
	// (PostgreSQL 16+), where heartbeats, a missing publication and the
	// checkpoint table are written; "" when unset. postgres.password_file
	// applies to it too.
	PrimaryDSN          DSN           `koanf:"primary_dsn"`
	Slot                string        `koanf:"slot"`        // pgoutput slot, created if missing
	Publication         string        `koanf:"publication"` // created FOR TABLE <outbox.table> if missing
	StatusInterval      time.Duration `koanf:"status_interval"`
	ReconnectBackoffMax time.Duration `koanf:"reconnect_backoff_max"`
	// Retain is the replay window, a duration or a byte size (RetainWindow).
	Retain               string        `koanf:"retain"`
	HeartbeatInterval    time.Duration `koanf:"heartbeat_interval"` // 0 disables
	RetainedWALWarnBytes int64         `koanf:"retained_wal_warn_bytes"`
	QueueBytes           int64         `koanf:"queue_bytes"`
	ReceiveTimeout       time.Duration `koanf:"receive_timeout"`
	// FailoverSlot: auto, on or off; whether the slot is a failover slot
	// that standbys synchronize (PostgreSQL 17+).
	FailoverSlot string `koanf:"failover_slot"`
}

// Outbox describes the outbox table.
type Outbox struct {
	Table   string  `koanf:"table"` // "schema.table", or "table" meaning public.table
	Columns Columns `koanf:"columns"`
	// HeaderColumns are extra columns sent as record headers; not id,
	// event_type or aggregate_type, headers the connector always sends.
	HeaderColumns []string `koanf:"header_columns"`
	// MessagePrefix enables the table-less outbox (pg_logical_emit_message);
	// "" disables it.
	MessagePrefix string `koanf:"message_prefix"`
	// TraceColumn holds a W3C trace context (a traceparent, or Debezium's
	// tracingspancontext properties), sent as traceparent and tracestate
	// headers; "" for none.
	TraceColumn string `koanf:"trace_column"`
	// Debezium EventRouter equivalents (router.Config, internal/config/eventrouter.go).
	Fields                  []string `koanf:"fields"`           // column:header|envelope|partition[:alias]
	StandardHeaders         []string `koanf:"standard_headers"` // of id, event_type, aggregate_type
	SourceHeaders           []string `koanf:"source_headers"`   // of lsn, xid, commit_time
	TombstoneOnEmptyPayload bool     `koanf:"tombstone_on_empty_payload"`
	TimestampColumn         string   `koanf:"timestamp_column"` // record timestamp instead of the commit time
	// Tables lists several outbox tables (tables.go), each with the keys
	// above and kafka's routing keys as its defaults; not with Table.
	Tables []OutboxTable `koanf:"tables"`
	// Retention deletes delivered rows older than this from every outbox
	// table (0: never); the pacing keys go with it (retention.go).
	Retention          time.Duration `koanf:"retention"`
	RetentionBatchSize int           `koanf:"retention_batch_size"`
	RetentionDutyCycle float64       `koanf:"retention_duty_cycle"`
	RetentionInterval  time.Duration `koanf:"retention_interval"`
	// PartitionWidth and PartitionsAhead: the partitions retention makes
	// of a partitioned outbox.
	PartitionWidth  time.Duration `koanf:"partition_width"`
	PartitionsAhead int           `koanf:"partitions_ahead"`
}

// Columns maps each record part to the name of the column that holds it.
// Two parts may name the same column.
type Columns struct {
	ID            string `koanf:"id"`
	AggregateType string `koanf:"aggregate_type"`
	AggregateID   string `koanf:"aggregate_id"`
	EventType     string `koanf:"event_type"`
	Payload       string `koanf:"payload"`
}

// Kafka is the destination.
type Kafka struct {
	Brokers            []string          `koanf:"brokers"` // host:port each; required
	Topic              string            `koanf:"topic"`   // template with router.Placeholder
	Topics             map[string]string `koanf:"topics"`  // aggregate_type → topic; wins over Topic
	DLQTopic           string            `koanf:"dlq_topic"`
	ParkingTopic       string            `koanf:"parking_topic"` // quarantined aggregates' later events (dlq.mode quarantine)
	ClientID           string            `koanf:"client_id"`
	MaxBufferedRecords int               `koanf:"max_buffered_records"`
	// MaxBufferedBytes is at least 1 MiB: a larger record is dead-lettered.
	MaxBufferedBytes       int64         `koanf:"max_buffered_bytes"`
	ProducerLinger         time.Duration `koanf:"linger"`
	LatencyBudget          time.Duration `koanf:"latency_budget"` // 0: off (sink/budget.go); off when only kafka.linger is set
	RequestTimeout         time.Duration `koanf:"request_timeout"`
	Compression            string        `koanf:"compression"`
	DrainTimeout           time.Duration `koanf:"drain_timeout"`
	AutoCreateTopics       bool          `koanf:"auto_create_topics"`
	TopicPartitions        int           `koanf:"topic_partitions"`         // -1: the broker's default
	TopicReplicationFactor int           `koanf:"topic_replication_factor"` // -1: the broker's default
	UnknownTopicTimeout    time.Duration `koanf:"unknown_topic_timeout"`
	TLS                    KafkaTLS      `koanf:"tls"`
	SASL                   KafkaSASL     `koanf:"sasl"`
	// TopicRegex and TopicReplacement rewrite the built topic name (Debezium's route.topic.regex/replacement).
	TopicRegex       string `koanf:"topic_regex"`
	TopicReplacement string `koanf:"topic_replacement"`
	// Format is one of router.Formats; CloudEvents configures the
	// cloudevents-* ones.
	Format      string           `koanf:"format"`
	CloudEvents KafkaCloudEvents `koanf:"cloudevents"`

	// QuarantineTopic is compacted: the quarantined set (dlq.mode quarantine).
	QuarantineTopic string `koanf:"quarantine_topic"`
	// Delivery is at_least_once or exactly_once (delivery.go).
	Delivery string `koanf:"delivery"`
	// TransactionInterval bounds how long committed PostgreSQL transactions
	// wait to be committed in a Kafka transaction (exactly_once).
	TransactionInterval time.Duration `koanf:"transaction_interval"`
	// TransactionTimeout is the Kafka transaction timeout the connector's
	// transactions are opened with (exactly_once); a part that takes longer
	// is aborted by the broker and committed again in smaller parts.
	TransactionTimeout time.Duration `koanf:"transaction_timeout"`
	// PositionsTopic is the compacted topic the position is committed to
	// inside each Kafka transaction (exactly_once).
	PositionsTopic string `koanf:"positions_topic"`
}

// KafkaCloudEvents configures the CloudEvents record formats (router.CloudEvents).
type KafkaCloudEvents struct {
	Source      string `koanf:"source"`       // template with router.SourceDatabase, …
	ContentType string `koanf:"content_type"` // "": from the payload column's type
}

// KafkaTLS configures TLS towards the brokers (docs/security.md). The keys
// other than Enabled may only be set when it is true.
type KafkaTLS struct {
	Enabled            bool   `koanf:"enabled"`
	CAFile             string `koanf:"ca_file"`   // "": the system's roots
	CertFile           string `koanf:"cert_file"` // client certificate, with KeyFile
	KeyFile            string `koanf:"key_file"`
	ServerName         string `koanf:"server_name"`          // "": each broker's host
	InsecureSkipVerify bool   `koanf:"insecure_skip_verify"` // tests only; warned about
}

// Sink returns the settings the sink connects with (kafkaopt.TLS), nil when
// TLS is off.
func (t KafkaTLS) Sink() *kafkaopt.TLS {
	if !t.Enabled {
		return nil
	}
	return &kafkaopt.TLS{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
}

// KafkaSASL configures SASL authentication towards the brokers
// (docs/security.md).
type KafkaSASL struct {
	Mechanism    string          `koanf:"mechanism"` // "" (no SASL) or one of kafkaopt.Mechanisms
	Username     string          `koanf:"username"`
	Password     kafkaopt.Secret `koanf:"password"`
	PasswordFile string          `koanf:"password_file"` // not with Password; see Secret
	OAuth        KafkaOAuth      `koanf:"oauth"`         // with OAUTHBEARER
}

// HTTP is the metrics and health endpoint.
type HTTP struct {
	Listen string `koanf:"listen"` // host:port; "" disables
	// PProf serves net/http/pprof under /debug/pprof/ on Listen, to profile a
	// running connector (docs/performance.md).
	PProf bool `koanf:"pprof"`
	// PProfAnyAddress allows PProf on a listener that is not loopback: the
	// profiler shows heap contents (secrets included) and stacks to whoever
	// reaches the port, so that takes an explicit choice (and, in
	// Kubernetes, a NetworkPolicy: deploy/helm).
	PProfAnyAddress bool `koanf:"pprof_any_address"`
}

// Log configures the process log.
type Log struct {
	Level  string `koanf:"level"`  // debug, info, warn or error
	Format string `koanf:"format"` // text or json
}

// Checkpoint configures the durable acknowledged position.
type Checkpoint struct {
	Store string `koanf:"store"` // table, file or none
	Table string `koanf:"table"` // schema.table, with store table
	File  string `koanf:"file"`  // with store file
}

// Snapshot configures the initial backlog.
type Snapshot struct {
	Mode    string `koanf:"mode"`     // none or pending
	Filter  string `koanf:"filter"`   // SQL predicate, with pending
	OrderBy string `koanf:"order_by"` // column; "": created_at if present, else the key
}

// Default returns the built-in defaults. The required keys (postgres.dsn and
// kafka.brokers) are empty, so Default().Validate() fails.
func Default() Config {
	return Config{
		Postgres: Postgres{
			Slot: "outbox_cdc", Publication: "outbox_cdc",
			StatusInterval: pgopt.DefaultStatusInterval, ReconnectBackoffMax: pgopt.DefaultBackoffMax,
			Retain: "0", HeartbeatInterval: pgopt.DefaultHeartbeatInterval,
			RetainedWALWarnBytes: pgopt.DefaultRetainedWALWarn, QueueBytes: pgopt.DefaultQueueBytes,
			ReceiveTimeout: pgopt.DefaultReceiveTimeout, FailoverSlot: "auto",
			PasswordCommandTimeout: pgopt.DefaultPasswordCommandTimeout,
		},
		Outbox: Outbox{
			Table: "public.outbox",
			Columns: Columns{
				ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
				EventType: "event_type", Payload: "payload",
			},
			HeaderColumns: []string{},
			Fields:        []string{}, StandardHeaders: []string{"id", "event_type", "aggregate_type"}, SourceHeaders: []string{},
			Tables:             []OutboxTable{},
			RetentionBatchSize: DefaultRetentionBatchSize, RetentionDutyCycle: DefaultRetentionDutyCycle,
			RetentionInterval: DefaultRetentionInterval, PartitionWidth: DefaultPartitionWidth, PartitionsAhead: DefaultPartitionsAhead,
		},
		Kafka: Kafka{
			Topic: "outbox.event." + router.Placeholder, Topics: map[string]string{}, DLQTopic: "outbox.dlq", ParkingTopic: "outbox.parking",
			ClientID: "outbox-cdc", LatencyBudget: kafkaopt.DefaultLatencyBudget, MaxBufferedRecords: kafkaopt.DefaultMaxBufferedRecords, MaxBufferedBytes: 64 << 20,
			RequestTimeout: 30 * time.Second, DrainTimeout: kafkaopt.DefaultDrainTimeout, Compression: "none",
			AutoCreateTopics: true, TopicPartitions: -1, TopicReplicationFactor: -1,
			UnknownTopicTimeout: kafkaopt.DefaultUnknownTopicTimeout, SASL: KafkaSASL{OAuth: KafkaOAuth{Extensions: map[string]string{}}},
			Format: router.FormatPlain, CloudEvents: KafkaCloudEvents{Source: router.DefaultSource},
			QuarantineTopic: "outbox.quarantine",
			Delivery:        DeliveryAtLeastOnce, TransactionInterval: kafkaopt.DefaultTxnInterval, TransactionTimeout: kafkaopt.DefaultTxnTimeout, PositionsTopic: "outbox-cdc.positions",
		},
		HTTP:       HTTP{Listen: "127.0.0.1:9187"},
		Log:        Log{Level: "info", Format: "text"},
		Checkpoint: Checkpoint{Store: "table", Table: "outbox_cdc.checkpoints"},
		Snapshot:   Snapshot{Mode: "none"},
		DLQ:        DLQ{Mode: DLQQuarantine, MaxQuarantined: kafkaopt.DefaultMaxQuarantined},
		Contracts:  defaultContracts(),
	}
}

// SchemaTable splits Table into schema and table name; a Table without a
// schema is in "public". Call it on a validated Config.
func (o Outbox) SchemaTable() (schema, table string) {
	if s, t, ok := strings.Cut(o.Table, "."); ok {
		return s, t
	}
	return "public", o.Table
}

// Secret returns the SASL password: kafka.sasl.password, or the content of
// kafka.sasl.password_file read now.
func (s KafkaSASL) Secret() (string, error) {
	return passwordFrom("kafka.sasl.password_file", s.PasswordFile, string(s.Password))
}

func passwordFrom(key, file, inline string) (string, error) {
	if file == "" {
		return inline, nil
	}
	pw, err := kafkaopt.ReadSecretFile(file)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", key, file, err)
	}
	return string(pw), nil
}

// Warnings lists the settings of a valid configuration that are accepted
// but weaken security, as problems (Key and Problem) that do not stop it.
// The command line logs each one at start.
func (c *Config) Warnings() []FieldError {
	var out []FieldError
	t, s := c.Kafka.TLS, c.Kafka.SASL
	if t.Enabled && t.InsecureSkipVerify {
		out = append(out, FieldError{Key: "kafka.tls.insecure_skip_verify",
			Problem: "broker certificates are not verified: anyone on the network path can impersonate the brokers; set a CA with kafka.tls.ca_file instead"})
	}
	if s.Mechanism == kafkaopt.MechanismPlain && !t.Enabled {
		out = append(out, FieldError{Key: "kafka.sasl.mechanism",
			Problem: "SASL PLAIN without TLS sends the password in clear text; set kafka.tls.enabled: true"})
	}
	if s.Mechanism == kafkaopt.MechanismOAuthBearer && !t.Enabled {
		out = append(out, FieldError{Key: "kafka.sasl.mechanism",
			Problem: "OAUTHBEARER without TLS sends the bearer token in clear text; set kafka.tls.enabled: true"})
	}
	out = append(out, c.retentionWarnings()...) // retention.go
	out = append(out, c.contractsWarnings()...) // contracts.go
	return append(out, c.inboxIDWarnings()...)  // warn_inbox.go
}

// byteUnits are the suffixes of a byte size, "" for bytes.
var byteUnits = map[string]int64{"": 1, "B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

// RetainWindow parses postgres.retain: a duration ("30m", "24h") or a byte
// size ("512MB", "2GiB", "1048576"). "0" or "" means no window.
func RetainWindow(s string) (d time.Duration, bytes int64, err error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return 0, 0, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return 0, 0, errors.New("must not be negative")
		}
		return d, 0, nil
	}
	num := strings.TrimRight(s, "kKMGTiB")
	mult, ok := byteUnits[s[len(num):]]
	n, perr := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if !ok || perr != nil || n < 0 || n > (1<<62)/mult {
		return 0, 0, errors.New("not a duration (30m, 24h) or a byte size (512MB, 2GiB)")
	}
	return 0, n * mult, nil
}
