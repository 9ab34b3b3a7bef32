// Package config loads, defaults and validates the outbox-cdc configuration.
//
// The configuration is layered: built-in defaults (Default), then an optional
// YAML file, then environment variables named OUTBOX_CDC_<KEY>, where <KEY> is
// the dotted key path upper-cased with dots replaced by underscores
// (postgres.dsn → OUTBOX_CDC_POSTGRES_DSN). Later layers win.
//
// Every problem — an unknown key, a value of the wrong type, a value out of
// range — is reported as a FieldError naming the key; Load and Validate
// collect all of them into one *ValidationError. Every error Load returns for
// bad configuration (including an unreadable or malformed file) matches
// errors.Is(err, ErrInvalid); the command maps that to exit code 2.
//
// Names of tables and columns are exact catalog names as PostgreSQL stores
// them (unquoted SQL identifiers are stored lower-case); they are compared
// case-sensitively with what the replication stream reports.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix starts the name of every environment variable this package reads.
const EnvPrefix = "OUTBOX_CDC_"

// EnvConfigPath names the environment variable that holds the path of the
// config file. The caller reads it (Load ignores it).
const EnvConfigPath = EnvPrefix + "CONFIG"

// envTestPrefix starts variables reserved for tests; Load ignores them.
const envTestPrefix = EnvPrefix + "TEST_"

// TopicPlaceholder is the only placeholder allowed in kafka.topic; it is
// replaced by the row's aggregate_type.
const TopicPlaceholder = "{aggregate_type}"

// Config is the whole outbox-cdc configuration.
type Config struct {
	Postgres Postgres `koanf:"postgres"`
	Outbox   Outbox   `koanf:"outbox"`
	Kafka    Kafka    `koanf:"kafka"`
	HTTP     HTTP     `koanf:"http"`
	Log      Log      `koanf:"log"`
	// Checkpoint is where the acknowledged position is saved (docs/operations.md).
	Checkpoint Checkpoint `koanf:"checkpoint"`
	// Snapshot says what to do with rows already in the outbox when the slot
	// is first created.
	Snapshot Snapshot `koanf:"snapshot"`
}

// Checkpoint configures the durable acknowledged position.
type Checkpoint struct {
	// Store is table (in the source database), file, or none.
	Store string `koanf:"store"`
	// Table is schema.table of the checkpoint table, created if missing.
	Table string `koanf:"table"`
	// File is the checkpoint file when Store is file.
	File string `koanf:"file"`
}

// Snapshot configures the initial backlog.
type Snapshot struct {
	// Mode is none (start at the slot's creation) or pending (first publish
	// the rows already in the table, read in the slot's exported snapshot).
	Mode string `koanf:"mode"`
	// Filter is an optional SQL predicate for pending, e.g. status = 'PENDING'.
	Filter string `koanf:"filter"`
	// OrderBy is a column the snapshot rows are published in the order of,
	// the primary key breaking ties; "" orders by created_at when the table
	// has it, else by the primary key. The gap repair uses the same order.
	OrderBy string `koanf:"order_by"`
}

// Postgres is the replication source.
type Postgres struct {
	// DSN is a libpq connection string, URL (postgres://user@host/db) or
	// keyword (host=... user=...) form. Required. Never print it: use
	// RedactDSN.
	DSN string `koanf:"dsn"`
	// PasswordFile names a file holding the password of the DSN's role, read
	// at start (a trailing newline is removed). It is mutually exclusive with
	// a password in the DSN. The password goes into the connection settings
	// only, never into the DSN string. See FilePassword.
	PasswordFile string `koanf:"password_file"`
	// Slot is the logical replication slot (pgoutput), created if missing.
	Slot string `koanf:"slot"`
	// Publication is created FOR TABLE <outbox.table> if missing.
	Publication string `koanf:"publication"`
	// StatusInterval is the longest time between two standby status updates.
	// It must stay well below the server's wal_sender_timeout (default 60s).
	StatusInterval time.Duration `koanf:"status_interval"`
	// ReconnectBackoffMax caps the delay between reconnection attempts.
	ReconnectBackoffMax time.Duration `koanf:"reconnect_backoff_max"`
	// Retain keeps a replay window: the slot is confirmed only up to the
	// acknowledged position minus this duration ("24h") or byte size
	// ("2GB"); "0" keeps nothing extra. See RetainWindow.
	Retain string `koanf:"retain"`
	// HeartbeatInterval is how often a non-transactional logical message is
	// written so the slot advances on a database with no other writes; 0
	// disables it.
	HeartbeatInterval time.Duration `koanf:"heartbeat_interval"`
	// RetainedWALWarnBytes logs a warning when the slot holds more WAL.
	RetainedWALWarnBytes int64 `koanf:"retained_wal_warn_bytes"`
	// QueueBytes bounds the WAL data read from the slot and not yet handled
	// (besides the producer's buffer); a larger single message goes alone.
	QueueBytes int64 `koanf:"queue_bytes"`
	// ReceiveTimeout gives up a replication connection on which nothing
	// arrived for this long (a half-open connection) and reconnects; after
	// half of it the server is asked for a reply.
	ReceiveTimeout time.Duration `koanf:"receive_timeout"`
}

// Outbox describes the outbox table.
type Outbox struct {
	// Table is "schema.table", or "table" meaning public.table.
	Table string `koanf:"table"`
	// Columns maps the record parts to column names.
	Columns Columns `koanf:"columns"`
	// HeaderColumns are extra columns sent as record headers (header name =
	// column name, value = the column's text form, NULL omitted). A mapped
	// column (aggregate_id, payload, …) may be listed; the names id,
	// event_type and aggregate_type may not, because the connector always
	// sends headers with those names.
	HeaderColumns []string `koanf:"header_columns"`
	// MessagePrefix enables the table-less outbox: transactional logical
	// messages (pg_logical_emit_message) with this prefix are events too.
	// Empty disables it.
	MessagePrefix string `koanf:"message_prefix"`
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
	// Brokers are the seed brokers, each host:port. Required.
	Brokers []string `koanf:"brokers"`
	// Topic is the topic template; TopicPlaceholder is replaced by the
	// aggregate_type. Without a placeholder every event goes to one topic.
	Topic string `koanf:"topic"`
	// Topics maps an aggregate_type to a fixed topic; it wins over Topic.
	Topics map[string]string `koanf:"topics"`
	// DLQTopic receives the rows that can never be published.
	DLQTopic string `koanf:"dlq_topic"`
	// ClientID is the Kafka client.id.
	ClientID string `koanf:"client_id"`
	// MaxBufferedRecords bounds the records produced but not yet acknowledged
	// (backpressure: reading the WAL pauses when it is reached).
	MaxBufferedRecords int `koanf:"max_buffered_records"`
	// MaxBufferedBytes bounds the bytes of those records. A single record
	// larger than this cannot be produced and goes to the DLQ, so it must be
	// at least MinBufferedBytes.
	MaxBufferedBytes int64 `koanf:"max_buffered_bytes"`
	// ProducerLinger is how long a partition waits for more records before
	// sending a batch (0: send at once, latency first).
	ProducerLinger time.Duration `koanf:"linger"`
	// RequestTimeout bounds how long the broker may take to answer a produce
	// request.
	RequestTimeout time.Duration `koanf:"request_timeout"`
	// Compression is the batch codec: none, gzip, snappy, lz4 or zstd.
	Compression string `koanf:"compression"`
	// DrainTimeout bounds how long a stop waits for records in flight; it
	// starts when the stop begins, so a stop with the broker down and the
	// buffer full ends after it. What is not acknowledged by then is sent
	// again after the restart.
	DrainTimeout time.Duration `koanf:"drain_timeout"`
	// AutoCreateTopics creates a missing topic (with TopicPartitions and
	// TopicReplicationFactor) when its first record comes, unless the broker
	// forbids auto-creation (auto.create.topics.enable=false).
	AutoCreateTopics bool `koanf:"auto_create_topics"`
	// TopicPartitions is the partition count of created topics; -1 uses the
	// broker's num.partitions.
	TopicPartitions int `koanf:"topic_partitions"`
	// TopicReplicationFactor is the replication factor of created topics;
	// -1 uses the broker's default.replication.factor. Production: 3.
	TopicReplicationFactor int `koanf:"topic_replication_factor"`
	// UnknownTopicTimeout is how long records wait for a missing topic to
	// appear before they go to the dead-letter topic.
	UnknownTopicTimeout time.Duration `koanf:"unknown_topic_timeout"`
	// TLS configures the encryption of broker connections.
	TLS KafkaTLS `koanf:"tls"`
	// SASL configures the authentication of broker connections.
	SASL KafkaSASL `koanf:"sasl"`
}

// KafkaTLS configures TLS towards the brokers (docs/security.md).
type KafkaTLS struct {
	// Enabled dials every broker with TLS. The other keys of the section
	// may only be set when it is true.
	Enabled bool `koanf:"enabled"`
	// CAFile is a PEM bundle of the certificate authorities that sign the
	// brokers' certificates; "" uses the system's roots.
	CAFile string `koanf:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate (chain) and its
	// unencrypted private key, for brokers that require client
	// authentication (ssl.client.auth=required). Both or neither.
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
	// ServerName is the name the broker certificates are checked against;
	// "" uses the host of each broker address.
	ServerName string `koanf:"server_name"`
	// InsecureSkipVerify accepts any broker certificate. Tests only: it
	// allows a man in the middle, and a warning is logged at start.
	InsecureSkipVerify bool `koanf:"insecure_skip_verify"`
}

// SASL mechanisms accepted by kafka.sasl.mechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// KafkaSASL configures SASL authentication towards the brokers
// (docs/security.md). Never print Password: the String, GoString, LogValue
// and MarshalJSON methods redact it.
type KafkaSASL struct {
	// Mechanism is "" (no SASL), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `koanf:"mechanism"`
	Username  string `koanf:"username"`
	// Password is the password itself; prefer PasswordFile or the
	// environment variable OUTBOX_CDC_KAFKA_SASL_PASSWORD.
	Password string `koanf:"password"`
	// PasswordFile names a file holding the password, read at start (a
	// trailing newline is removed). Mutually exclusive with Password.
	PasswordFile string `koanf:"password_file"`
}

// HTTP is the metrics and health endpoint.
type HTTP struct {
	// Listen is host:port for /metrics, /healthz and /readyz; "" disables
	// the endpoint. Port 0 picks a free port.
	Listen string `koanf:"listen"`
}

// Log configures the process log.
type Log struct {
	Level  string `koanf:"level"`  // debug, info, warn or error
	Format string `koanf:"format"` // text or json
}

// Default values. They are also documented by Example.
const (
	DefaultSlot                 = "outbox_cdc"
	DefaultPublication          = "outbox_cdc"
	DefaultStatusInterval       = time.Second
	DefaultReconnectBackoffMax  = 30 * time.Second
	DefaultTable                = "public.outbox"
	DefaultTopic                = "outbox.event." + TopicPlaceholder
	DefaultDLQTopic             = "outbox.dlq"
	DefaultClientID             = "outbox-cdc"
	DefaultMaxBufferedRecords   = 10000
	DefaultMaxBufferedBytes     = 64 << 20
	DefaultLinger               = 0
	DefaultRequestTimeout       = 30 * time.Second
	DefaultDrainTimeout         = 30 * time.Second
	DefaultCompression          = "none"
	DefaultUnknownTopicTimeout  = 2 * time.Minute
	DefaultHTTPListen           = "127.0.0.1:9187"
	DefaultLogLevel             = "info"
	DefaultLogFormat            = "text"
	DefaultHeartbeatInterval    = 10 * time.Second
	DefaultRetainedWALWarnBytes = 1 << 30
	DefaultQueueBytes           = 64 << 20
	DefaultReceiveTimeout       = 60 * time.Second
	DefaultCheckpointTable      = "outbox_cdc.checkpoints"
)

// Default returns the built-in defaults. The required keys (postgres.dsn and
// kafka.brokers) are empty, so Default().Validate() fails.
func Default() Config {
	return Config{
		Postgres: Postgres{
			Slot:                 DefaultSlot,
			Publication:          DefaultPublication,
			StatusInterval:       DefaultStatusInterval,
			ReconnectBackoffMax:  DefaultReconnectBackoffMax,
			Retain:               "0",
			HeartbeatInterval:    DefaultHeartbeatInterval,
			RetainedWALWarnBytes: DefaultRetainedWALWarnBytes,
			QueueBytes:           DefaultQueueBytes,
			ReceiveTimeout:       DefaultReceiveTimeout,
		},
		Outbox: Outbox{
			Table: DefaultTable,
			Columns: Columns{
				ID:            "id",
				AggregateType: "aggregate_type",
				AggregateID:   "aggregate_id",
				EventType:     "event_type",
				Payload:       "payload",
			},
			HeaderColumns: []string{},
		},
		Kafka: Kafka{
			Topic:              DefaultTopic,
			Topics:             map[string]string{},
			DLQTopic:           DefaultDLQTopic,
			ClientID:           DefaultClientID,
			MaxBufferedRecords: DefaultMaxBufferedRecords,
			MaxBufferedBytes:   DefaultMaxBufferedBytes,
			ProducerLinger:     DefaultLinger,
			RequestTimeout:     DefaultRequestTimeout,
			DrainTimeout:       DefaultDrainTimeout,
			Compression:        DefaultCompression,

			AutoCreateTopics:       true,
			TopicPartitions:        -1,
			TopicReplicationFactor: -1,
			UnknownTopicTimeout:    DefaultUnknownTopicTimeout,
		},
		HTTP:       HTTP{Listen: DefaultHTTPListen},
		Log:        Log{Level: DefaultLogLevel, Format: DefaultLogFormat},
		Checkpoint: Checkpoint{Store: "table", Table: DefaultCheckpointTable},
		Snapshot:   Snapshot{Mode: "none"},
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

// TopicFor returns the topic for an event of the given aggregate type: the
// kafka.topics entry if there is one, else the kafka.topic template with the
// placeholder replaced. The result may still be a name Kafka rejects (an
// aggregate type with a space, say); CheckTopicName tells.
func (k Kafka) TopicFor(aggregateType string) string {
	if t, ok := k.Topics[aggregateType]; ok {
		return t
	}
	return strings.ReplaceAll(k.Topic, TopicPlaceholder, aggregateType)
}

// String renders the effective configuration as YAML with the DSN password
// and kafka.sasl.password redacted. It is safe to log.
func (c Config) String() string { return render(&c) }

// String renders the section with the DSN password redacted, so that
// printing a Postgres value never leaks it.
func (p Postgres) String() string {
	return fmt.Sprintf("{dsn: %s, password_file: %s, slot: %s, publication: %s, status_interval: %s, reconnect_backoff_max: %s}",
		RedactDSN(p.DSN), p.PasswordFile, p.Slot, p.Publication, p.StatusInterval, p.ReconnectBackoffMax)
}

// GoString keeps %#v from printing the DSN password.
func (p Postgres) GoString() string { return "config.Postgres" + p.String() }

// LogValue keeps slog from printing the DSN password.
func (p Postgres) LogValue() slog.Value {
	c := Config{Postgres: p}
	return c.LogValue().Group()[0].Value // postgres is the first section
}

// MarshalJSON keeps encoding/json from printing the DSN password.
func (p Postgres) MarshalJSON() ([]byte, error) {
	c := Config{Postgres: p}
	return json.Marshal(asMap(&c, schemaTree)["postgres"])
}

// MarshalJSON encodes the configuration keyed by the configuration keys,
// durations as text (1s), the DSN password and kafka.sasl.password redacted.
func (c Config) MarshalJSON() ([]byte, error) { return json.Marshal(asMap(&c, schemaTree)) }

// LogValue logs the configuration as groups keyed by the configuration
// keys, with the DSN password and kafka.sasl.password redacted.
func (c Config) LogValue() slog.Value { return slog.GroupValue(logAttrs(&c, schemaTree)...) }

// ErrInvalid matches, with errors.Is, every error that means "the
// configuration is bad" (exit code 2): a *ValidationError and a *FileError.
var ErrInvalid = errors.New("invalid configuration")

// FileError is a config file that cannot be read or parsed. It matches
// ErrInvalid and, through Err, the underlying cause (fs.ErrNotExist, …).
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string {
	msg := e.Err.Error()
	var pe *fs.PathError
	if errors.As(e.Err, &pe) {
		msg = pe.Err.Error() // the path is already in front
	}
	return "config file " + e.Path + ": " + msg
}

// Unwrap exposes both ErrInvalid and the cause.
func (e *FileError) Unwrap() []error { return []error{ErrInvalid, e.Err} }

// Load builds the configuration from the defaults, the YAML file at path (none
// if path is ""), and the OUTBOX_CDC_* variables in environ (os.Environ() in
// production), in that order, then validates it. Any error it returns for bad
// configuration matches errors.Is(err, ErrInvalid): a *FileError when the file
// cannot be read or is not YAML, else a *ValidationError listing every
// problem at once (unknown keys with a suggestion, wrong types, invalid
// values). On error the returned *Config is nil.
func Load(path string, environ []string) (*Config, error) {
	k := koanf.New(".")
	var problems []FieldError
	if path != "" {
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			return nil, &FileError{Path: path, Err: err}
		}
		problems = append(problems, checkKeys("", k.Raw())...)
	}

	var envProblems []FieldError
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			key, v, fe := fromEnv(name, value)
			if fe != nil {
				envProblems = append(envProblems, *fe)
			}
			return key, v
		},
	}), nil)
	if err != nil { // the env provider does not fail; keep the check anyway
		return nil, fmt.Errorf("reading environment: %w", err)
	}
	problems = append(problems, envProblems...)

	cfg := Default()
	problems = append(problems, decode(k.Raw(), &cfg)...)

	reported := make(map[string]bool, len(problems))
	for _, p := range problems {
		reported[p.Key] = true
	}
	var ve *ValidationError
	if errors.As(cfg.Validate(), &ve) {
		for _, p := range ve.Fields {
			if !reported[p.Key] && !reported[parentKey(p.Key)] {
				problems = append(problems, p)
			}
		}
	}
	if len(problems) > 0 {
		return nil, &ValidationError{Fields: problems}
	}
	return &cfg, nil
}

// parentKey strips an index or map key: kafka.brokers[1] → kafka.brokers,
// kafka.topics["x"] → kafka.topics.
func parentKey(key string) string {
	if i := strings.IndexByte(key, '['); i > 0 {
		return key[:i]
	}
	return key
}

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
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"kB", 1000}, {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"TB", 1000 * 1000 * 1000 * 1000}, {"B", 1}}
	mult, num := int64(1), s
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			mult, num = u.mult, strings.TrimSpace(strings.TrimSuffix(s, u.suffix))
			break
		}
	}
	n, perr := strconv.ParseInt(num, 10, 64)
	if perr != nil || n < 0 || n > (1<<62)/mult {
		return 0, 0, errors.New("not a duration (30m, 24h) or a byte size (512MB, 2GiB)")
	}
	return 0, n * mult, nil
}
