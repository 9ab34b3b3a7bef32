package config

// Example returns a commented configuration file that sets every key to its
// default, plus example values for the two required keys (postgres.dsn and
// kafka.brokers). It is what docs and outbox-cdc.yaml show; a test keeps it in
// step with Default.
func Example() string { return example }

const example = `# outbox-cdc configuration.
#
# Every key can be overridden by an environment variable named OUTBOX_CDC_
# followed by the key path upper-cased, dots replaced by underscores:
# postgres.dsn -> OUTBOX_CDC_POSTGRES_DSN,
# outbox.columns.aggregate_id -> OUTBOX_CDC_OUTBOX_COLUMNS_AGGREGATE_ID.
# Lists are comma-separated (OUTBOX_CDC_KAFKA_BROKERS=k1:9092,k2:9092) and
# maps are key=value pairs (OUTBOX_CDC_KAFKA_TOPICS=order=orders.v1,user=users).
# The environment wins over this file. Durations take a unit: 500ms, 1s, 2m.

postgres:
  # Required. libpq connection string, URL or keyword form
  # (host=127.0.0.1 user=app dbname=app). The role needs REPLICATION and
  # SELECT on the outbox table. Prefer a password from ~/.pgpass or PGPASSWORD
  # over one written here.
  dsn: postgres://app@127.0.0.1:5432/app
  # File holding the role's password, read at start (trailing newline
  # removed); not allowed together with a password in the DSN. TLS is set in
  # the DSN: ?sslmode=verify-full&sslrootcert=/etc/outbox-cdc/pg-ca.pem
  # (docs/security.md).
  password_file: ""
  # Logical replication slot (pgoutput), created if missing: [a-z0-9_], 1-63.
  slot: outbox_cdc
  # Publication, created FOR TABLE <outbox.table> WITH (publish = 'insert')
  # if missing.
  publication: outbox_cdc
  # Longest time between standby status updates: 10ms to 30s, well below the
  # server's wal_sender_timeout.
  status_interval: 1s
  # Longest wait between reconnection attempts: 100ms to 10m.
  reconnect_backoff_max: 30s
  # Replay window: confirm to PostgreSQL only up to the acknowledged position
  # minus this duration ("24h") or size ("2GB"), so outbox-cdc replay can go
  # back that far. "0" keeps no extra WAL.
  retain: "0"
  # A non-transactional logical message written this often lets the slot
  # advance when the database has no other writes; 0 disables it.
  heartbeat_interval: 10s
  # Log a warning when the slot holds more WAL than this; 0 disables it.
  retained_wal_warn_bytes: 1073741824   # 1 GiB
  # WAL data read from the slot and not yet handled, in bytes (besides
  # kafka.max_buffered_bytes); at least 1 MiB. A larger row goes alone.
  queue_bytes: 67108864   # 64 MiB
  # Reconnect when nothing arrived from the server for this long (a half-open
  # connection); the server is asked for a reply after half of it. 1s to 1h.
  receive_timeout: 60s

outbox:
  # "schema.table", or "table" for public.table. Names are as stored in the
  # catalog (case-sensitive).
  table: public.outbox
  # Column that holds each part of the record. Debezium-style tables use
  # aggregate_type: aggregatetype, aggregate_id: aggregateid, event_type: type.
  columns:
    id: id                          # header "id"
    aggregate_type: aggregate_type  # header "aggregate_type", topic placeholder
    aggregate_id: aggregate_id      # record key
    event_type: event_type          # header "event_type"
    payload: payload                # record value; NULL gives a tombstone
  # Extra columns sent as headers named after the column (NULL omitted).
  # Not allowed: id, event_type, aggregate_type (those headers always exist).
  header_columns: []
  # Table-less outbox: transactional pg_logical_emit_message(true, prefix, ...)
  # messages with this prefix are events too (docs/guide.md). "" disables it.
  message_prefix: ""

kafka:
  # Required. Seed brokers, host:port.
  brokers: [127.0.0.1:9092]
  # Topic template. {aggregate_type} is the only placeholder.
  topic: outbox.event.{aggregate_type}
  # aggregate_type -> fixed topic; wins over the template.
  # Example: {order: orders.v1, user: users}
  topics: {}
  # Rows that can never be published go here, with an "error" header.
  dlq_topic: outbox.dlq
  client_id: outbox-cdc
  # Backpressure: reading the WAL pauses while this many records, or this many
  # bytes (at least 1 MiB; a larger record is dead-lettered), await an ack.
  max_buffered_records: 10000
  max_buffered_bytes: 67108864      # 64 MiB
  # How long to wait for more records before sending a batch: 0 to 1m.
  linger: 0s
  # How long the broker may take to answer a produce request: 100ms to 15m.
  request_timeout: 30s
  # How long a stop waits for records in flight, from the moment it begins
  # (also with the broker down): 1s to 15m. The rest is sent after restart.
  drain_timeout: 30s
  # none, gzip, snappy, lz4 or zstd.
  compression: none
  # Create a missing topic when its first record comes, unless the broker
  # forbids auto-creation (auto.create.topics.enable=false); false never
  # creates topics. Created topics get these settings (-1: broker default).
  auto_create_topics: true
  topic_partitions: -1
  topic_replication_factor: -1        # production: 3
  # How long records wait for a missing topic before they are dead-lettered.
  unknown_topic_timeout: 2m0s
  # Encryption of broker connections (docs/security.md). The other tls keys
  # may only be set when enabled is true.
  tls:
    enabled: false
    ca_file: ""         # PEM CA bundle for the brokers' certificates; "" = system roots
    cert_file: ""       # PEM client certificate, with key_file (mutual TLS)
    key_file: ""        # its unencrypted PEM private key
    server_name: ""     # name to verify instead of each broker's host
    insecure_skip_verify: false   # tests only; logs a warning
  # Authentication (docs/security.md). Give the password through
  # OUTBOX_CDC_KAFKA_SASL_PASSWORD or password_file rather than here.
  sasl:
    mechanism: ""       # "", PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    username: ""
    password: ""
    password_file: ""   # read at start, trailing newline removed

http:
  # /metrics, /healthz and /readyz. "" disables; :9187 listens on every
  # interface.
  listen: 127.0.0.1:9187

log:
  level: info    # debug, info, warn or error
  format: text   # text or json

checkpoint:
  # Where the acknowledged position is saved: table (in the source database,
  # created if missing), file, or none. On start, anything at or below it is
  # skipped, so a PostgreSQL crash that moves the slot back republishes nothing.
  store: table
  table: outbox_cdc.checkpoints
  file: ""

snapshot:
  # none: publish what is committed after the slot is created. pending: when
  # the slot is created, first publish the rows already in the table (read in
  # the slot's exported snapshot: no gap, no duplicate), optionally filtered.
  mode: none
  filter: ""   # e.g. status = 'PENDING'
  # Snapshot rows (and rows of a gap repair) go out in the order of this
  # column, the key breaking ties; "" is created_at when the table has it,
  # else the primary key.
  order_by: ""
`
