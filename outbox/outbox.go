// Package outbox writes events for outbox-cdc inside the caller's PostgreSQL
// transaction, so an event exists exactly when the business change it
// describes is committed.
//
// Two ways to write an event:
//
//   - Write inserts a row into the outbox table (sql/outbox.sql in the
//     repository, TableDDL here). outbox-cdc publishes every committed insert.
//   - Emit writes no row: it calls pg_logical_emit_message(true, prefix,
//     content) in the same transaction. The message is part of the
//     transaction in the WAL (it disappears with a rollback) and outbox-cdc
//     publishes it when the connector's outbox.message_prefix equals the
//     Writer's prefix. Nothing accumulates in a table, so nothing needs
//     cleaning up. The content format is documented on Emit.
//
// Both produce the same Kafka record: topic from aggregate_type, key =
// aggregate_id, headers id, event_type, aggregate_type (plus extra headers),
// value = payload, timestamp = commit time.
//
// Payload values (Event.Payload):
//
//	nil, []byte(nil), json.RawMessage(nil)  tombstone (NULL payload, nil record value)
//	json.RawMessage                         JSON text, validated
//	[]byte                                  raw bytes, sent as they are
//	anything else                           marshalled with encoding/json
//
// A payload whose JSON is null (a typed nil such as (*Order)(nil), or
// json.RawMessage("null")) is refused with ErrInvalidEvent by Write and
// Emit alike: it is ambiguous between a value and a tombstone, and a
// tombstone deletes the key on a compacted topic.
//
// (A Go string is therefore sent as a JSON string, quotes included; pass JSON
// text you already have as json.RawMessage.)
//
// With Config.Contracts set, Write and Emit check the payload against the
// event type's contract before writing it: a payload that does not fit is a
// *ContractViolation and nothing is written (package outbox/contracts checks
// against a schema registry, as the connector's contracts.* do).
//
// A Writer is safe for concurrent use. The package-level Write and Emit use a
// Writer with the contract's defaults (table public.outbox, columns id,
// aggregate_type, aggregate_id, event_type, payload; prefix "outbox").
package outbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// TableDDL creates the contract's outbox table with the default names and
// its index on created_at (which verify --since and cleanup select by). It is
// sql/outbox.sql (a test keeps the two equal).
const TableDDL = `CREATE TABLE IF NOT EXISTS outbox (
  id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregate_type text        NOT NULL,
  aggregate_id   text        NOT NULL,
  event_type     text        NOT NULL,
  payload        jsonb,
  created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON outbox (created_at);`

// Defaults, as in the outbox-cdc contract.
const (
	DefaultTable  = "public.outbox"
	DefaultPrefix = "outbox"
)

// ErrInvalidEvent is wrapped by every error about an Event's content.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// Event is one outbox event.
type Event struct {
	// ID is the event id, sent as the record's "id" header; consumers
	// deduplicate on it. Empty: the Writer generates one (a UUID v7 by
	// default, see Config.NewID).
	ID string
	// AggregateType selects the topic (kafka.topic template, kafka.topics).
	AggregateType string
	// AggregateID is the record key: events of one aggregate keep their
	// order in one partition.
	AggregateID string
	// EventType is sent as the "event_type" header.
	EventType string
	// Payload is the record value; see the package documentation.
	Payload any
	// Headers are extra values. For Write, the map is column → value: each
	// entry is written to that column of the outbox table (the connector sends
	// it as a header when the column is listed in outbox.header_columns). For
	// Emit, the map is header name → value, sent in the message as text (see
	// Emit). nil values are skipped.
	Headers map[string]any
	// Version is the aggregate's version after this change (the seeds'
	// aggregateVersion), for consumers that drop an event older than what
	// they have applied (inbox.Consumer.ApplyVersion). 0: none. Write stores
	// it in the column aggregate_version (add it to the table as bigint and to
	// the connector's outbox.header_columns); Emit sends it as the header
	// aggregate_version.
	Version int64
}

// withVersion returns e's headers with e.Version as the aggregate_version
// entry; the caller's map is not modified.
func withVersion(e Event) (map[string]any, error) {
	if e.Version == 0 {
		return e.Headers, nil
	}
	if _, ok := e.Headers[wire.HeaderAggregateVersion]; ok {
		return nil, fmt.Errorf("%w: both Version and Headers[%q] set", ErrInvalidEvent, wire.HeaderAggregateVersion)
	}
	h := make(map[string]any, len(e.Headers)+1)
	maps.Copy(h, e.Headers)
	h[wire.HeaderAggregateVersion] = e.Version
	return h, nil
}

// Columns names the outbox table's columns. Empty fields take the contract's
// names (id, aggregate_type, aggregate_id, event_type, payload). Names are
// exact catalog names (case-sensitive), as in the connector's
// outbox.columns.* keys.
type Columns struct {
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       string
}

// DebeziumColumns are the column names of a Debezium-style outbox table
// (configure the connector with outbox.columns.aggregate_type: aggregatetype,
// outbox.columns.aggregate_id: aggregateid, outbox.columns.event_type: type).
var DebeziumColumns = Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload"}

// Config configures a Writer. The zero value is the contract's defaults.
type Config struct {
	// Table is "schema.table", or "table" meaning public.table, as the
	// connector's outbox.table. Default public.outbox.
	Table string
	// Columns maps the event's fields to columns.
	Columns Columns
	// Prefix is the logical message prefix Emit uses; it must equal the
	// connector's outbox.message_prefix. Default "outbox".
	Prefix string
	// NewID generates the id of an event that has none. Default: UUID v7
	// (time-ordered, which keeps the primary key index compact). NewV4 is
	// the random alternative.
	NewID func() (string, error)
	// TraceColumn, when set, is the column (or, for Emit, the header) that
	// receives the W3C trace context of the ctx passed to Write or Emit;
	// configure the connector's outbox.trace_column with the same name. An
	// event written without a span in ctx, or with its own value for the
	// column in Headers, is left as it is. Uses the OpenTelemetry API only:
	// the application's SDK decides what a span is.
	TraceColumn string
	// Contracts, when set, checks every payload before it is written (see
	// Checker); a payload it refuses is never inserted or emitted. nil: no
	// check (the connector's contracts.* still apply).
	Contracts Checker
}

// NewV7 returns a new UUID v7 string, the default event id.
func NewV7() (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// NewV4 returns a new random UUID v4 string.
func NewV4() (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

// Writer writes events to one outbox table (Write) or as logical messages
// with one prefix (Emit). Create it once with New and share it.
type Writer struct {
	table   string // quoted, schema-qualified
	cols    [5]string
	colSet  map[string]bool
	insert  string // INSERT for events without extra columns
	prefix  string
	newID   func() (string, error)
	columns Columns
	// traceColumn receives the caller's trace context (Config.TraceColumn).
	traceColumn string
	contracts   Checker // Config.Contracts
}

var defaultWriter = func() *Writer {
	w, err := New(Config{})
	if err != nil {
		panic(err)
	}
	return w
}()

// New validates cfg and returns a Writer.
func New(cfg Config) (*Writer, error) {
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	c := cfg.Columns
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&c.ID, "id")
	def(&c.AggregateType, "aggregate_type")
	def(&c.AggregateID, "aggregate_id")
	def(&c.EventType, "event_type")
	def(&c.Payload, "payload")
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.NewID == nil {
		cfg.NewID = NewV7
	}

	schema, table, ok := strings.Cut(cfg.Table, ".")
	if !ok {
		schema, table = "public", cfg.Table
	}
	if schema == "" || table == "" || strings.Contains(table, ".") {
		return nil, fmt.Errorf("outbox: table %q: want schema.table or table", cfg.Table)
	}
	names := []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}
	w := &Writer{
		table:   pgx.Identifier{schema, table}.Sanitize(),
		colSet:  make(map[string]bool, len(names)),
		prefix:  cfg.Prefix,
		newID:   cfg.NewID,
		columns: c,

		traceColumn: cfg.TraceColumn,
		contracts:   cfg.Contracts,
	}
	for i, n := range names {
		if w.colSet[n] {
			return nil, fmt.Errorf("outbox: column %q is mapped twice", n)
		}
		w.colSet[n] = true
		w.cols[i] = pgx.Identifier{n}.Sanitize()
	}
	if w.colSet[cfg.TraceColumn] {
		return nil, fmt.Errorf("outbox: trace column %q is one of the mapped columns", cfg.TraceColumn)
	}
	w.insert = w.insertSQL(nil)
	return w, nil
}

// Columns returns the column names the Writer uses, defaults filled in.
func (w *Writer) Columns() Columns { return w.columns }

// Prefix returns the logical message prefix Emit uses.
func (w *Writer) Prefix() string { return w.prefix }

func (w *Writer) insertSQL(extra []string) string {
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(w.table)
	b.WriteString(" (")
	b.WriteString(strings.Join(w.cols[:], ", "))
	for _, c := range extra {
		b.WriteString(", ")
		b.WriteString(pgx.Identifier{c}.Sanitize())
	}
	b.WriteString(") VALUES ($1, $2, $3, $4, $5")
	for i := range extra {
		b.WriteString(", $")
		b.WriteString(strconv.Itoa(6 + i))
	}
	b.WriteString(")")
	return b.String()
}

// Write inserts e into the outbox table inside tx. The event is published
// when, and only if, tx commits.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, e Event) error {
	var err error
	if e.Headers, err = withVersion(e); err != nil {
		return err
	}
	e.Headers = w.withTrace(ctx, e.Headers)
	id, err := w.prepare(&e)
	if err != nil {
		return err
	}
	payload, err := payloadBytes(e.Payload)
	if err != nil {
		return err
	}
	if err := w.checkContract(&e, payload); err != nil {
		return err
	}
	args := []any{id, e.AggregateType, e.AggregateID, e.EventType, payload}
	sql := w.insert
	if len(e.Headers) > 0 {
		cols := slices.Sorted(maps.Keys(e.Headers))
		var extra []string
		for _, c := range cols {
			if w.colSet[c] {
				return fmt.Errorf("%w: header column %q is one of the mapped columns", ErrInvalidEvent, c)
			}
			if c == "" {
				return fmt.Errorf("%w: empty header column name", ErrInvalidEvent)
			}
			if e.Headers[c] == nil {
				continue // the column's default (usually NULL: no header)
			}
			extra = append(extra, c)
			args = append(args, e.Headers[c])
		}
		sql = w.insertSQL(extra)
	}
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("outbox: insert event %s: %w", id, err)
	}
	return nil
}

// Message is the content Emit writes, documented on wire.Message: the
// connector reads the same type.
type Message = wire.Message

// Emit writes e as a transactional logical message inside tx instead of a
// table row:
//
//	SELECT pg_logical_emit_message(true, <prefix>, <content>::bytea)
//
// The message is in the WAL only if tx commits, in the transaction's order
// relative to table inserts. content is the JSON object described on
// Message. The payload is encoded as:
//
//	nil, []byte(nil), json.RawMessage(nil)  omitted (tombstone)
//	json.RawMessage                         "payload": the JSON value (validated, compacted)
//	[]byte                                  "payload_base64": the bytes, std base64 (byte-exact)
//	anything else                           "payload": encoding/json of the value
//
// Header values are sent as text: string as is, []byte as its bytes,
// time.Time as RFC 3339 with nanoseconds, fmt.Stringer by String, anything
// else as fmt.Sprint; nil values are skipped. The connector publishes the
// message only when its outbox.message_prefix equals the Writer's prefix.
func (w *Writer) Emit(ctx context.Context, tx pgx.Tx, e Event) error {
	e.Headers = w.withTrace(ctx, e.Headers)
	content, err := w.EncodeMessage(e)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(true, $1::text, $2::bytea)`, w.prefix, content); err != nil {
		return fmt.Errorf("outbox: emit event: %w", err)
	}
	return nil
}

// EncodeMessage returns the content Emit would write for e (generating the id
// when e has none), after Config.Contracts' check. It is exported for tests
// and for writers that call pg_logical_emit_message themselves.
func (w *Writer) EncodeMessage(e Event) ([]byte, error) {
	var err error
	if e.Headers, err = withVersion(e); err != nil {
		return nil, err
	}
	id, err := w.prepare(&e)
	if err != nil {
		return nil, err
	}
	m := Message{ID: &id, AggregateType: &e.AggregateType, AggregateID: &e.AggregateID, EventType: &e.EventType}
	var checked []byte // the payload as the connector will read it, for Config.Contracts
	switch p := e.Payload.(type) {
	case nil:
	case json.RawMessage:
		if p != nil {
			if !json.Valid(p) {
				return nil, fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)
			}
			if err := notNull(p); err != nil {
				return nil, err
			}
			m.Payload, checked = p, p
		}
	case []byte:
		if p != nil {
			s := base64.StdEncoding.EncodeToString(p)
			m.PayloadBase64 = &s
			checked = p
		}
	default:
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("%w: marshal payload: %v", ErrInvalidEvent, err)
		}
		if err := notNull(b); err != nil {
			return nil, err
		}
		m.Payload, checked = b, b
	}
	if err := w.checkContract(&e, checked); err != nil {
		return nil, err
	}
	for name, v := range e.Headers {
		if name == "" || wire.Reserved(name) {
			return nil, fmt.Errorf("%w: header name %q is reserved or empty", ErrInvalidEvent, name)
		}
		if v == nil {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(e.Headers))
		}
		m.Headers[name] = headerText(v)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("outbox: encode message: %w", err)
	}
	return b, nil
}

func headerText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case time.Time:
		return v.Format(time.RFC3339Nano)
	case fmt.Stringer:
		return v.String()
	default:
		return fmt.Sprint(v)
	}
}

// prepare validates e and returns its id, generating one when empty.
func (w *Writer) prepare(e *Event) (string, error) {
	switch {
	case e.AggregateType == "":
		return "", fmt.Errorf("%w: empty AggregateType", ErrInvalidEvent)
	case e.AggregateID == "":
		return "", fmt.Errorf("%w: empty AggregateID", ErrInvalidEvent)
	case e.EventType == "":
		return "", fmt.Errorf("%w: empty EventType", ErrInvalidEvent)
	}
	if e.ID != "" {
		return e.ID, nil
	}
	id, err := w.newID()
	if err != nil {
		return "", fmt.Errorf("outbox: generate event id: %w", err)
	}
	return id, nil
}

// payloadBytes converts a payload to the value bound to the payload column:
// nil (NULL) or bytes. pgx sends bytes as they are to json, jsonb, text and
// bytea columns.
func payloadBytes(p any) ([]byte, error) {
	switch p := p.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if p == nil {
			return nil, nil
		}
		if !json.Valid(p) {
			return nil, fmt.Errorf("%w: payload is not valid JSON", ErrInvalidEvent)
		}
		return p, notNull(p)
	case []byte:
		return p, nil
	default:
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("%w: marshal payload: %v", ErrInvalidEvent, err)
		}
		return b, notNull(b)
	}
}

// notNull refuses a payload whose JSON is null (a typed nil pointer, map or
// slice, json.RawMessage("null")). Write would store a JSON null value and
// Emit a tombstone, which deletes the key on a compacted topic: rather than
// two meanings, neither. A tombstone is an untyped nil payload.
func notNull(b []byte) error {
	if string(bytes.TrimSpace(b)) == "null" {
		return fmt.Errorf("%w: payload is JSON null (a typed nil?): pass a nil payload for a tombstone", ErrInvalidEvent)
	}
	return nil
}

// Write inserts e into public.outbox (contract column names) inside tx.
func Write(ctx context.Context, tx pgx.Tx, e Event) error { return defaultWriter.Write(ctx, tx, e) }

// Emit writes e as a transactional logical message with prefix "outbox"
// inside tx (see Writer.Emit for the format).
func Emit(ctx context.Context, tx pgx.Tx, e Event) error { return defaultWriter.Emit(ctx, tx, e) }
