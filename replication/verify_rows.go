package replication

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// rangeFetch is how many rows one FETCH returns: the memory of a range read
// is one batch, whatever the number of rows.
const rangeFetch = 5000

// RangeRead reads the outbox rows whose time column lies in [since, until)
// (the rows `outbox-cdc verify` compares with Kafka), in the snapshot order,
// through a server-side cursor. Every pass (Start) reads the same rows: all
// run in one repeatable-read transaction of its own connection. Close ends
// it. Use it from one goroutine.
type RangeRead struct {
	conn    *pgx.Conn
	tx      pgx.Tx
	ctx     context.Context
	query   string
	args    []any
	headers []string
	format  decode.PayloadFormat
	extra   []string // Mapping.Columns
	// Column is the time column selecting the range: snapshot.order_by, or
	// created_at. Order is the full ORDER BY.
	Column string
	Order  []string

	cursor  bool // a cursor is open
	batch   pgx.Rows
	inBatch int
	done    bool
	err     error
}

// timeTypes are the column types a range of times can select by.
var timeTypes = map[string]bool{"timestamp with time zone": true, "timestamp without time zone": true, "date": true}

// ReadRange opens a range read. The time column is spec.OrderBy when set,
// else created_at; a table with neither, or with one that is not a
// timestamp, is refused with a *fault.PrerequisiteError naming the fix. A zero
// until means no upper bound; then the rows a lost slot's hold keeps
// (retention.Hold: by transaction, whatever their time) are read too.
func (s Source) ReadRange(ctx context.Context, spec RowSpec, since, until time.Time, held retention.Hold) (*RangeRead, error) {
	conn, err := s.DB.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("verify: connect: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("verify: begin: %w", err)
	}
	r := &RangeRead{conn: conn, tx: tx, ctx: ctx, headers: spec.Mapping.HeaderColumns, extra: spec.Mapping.Columns}
	if err := s.prepareRange(ctx, r, spec, since, until, held); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (s Source) prepareRange(ctx context.Context, r *RangeRead, spec RowSpec, since, until time.Time, held retention.Hold) error {
	table := s.qualified()
	col := spec.OrderBy
	if col == "" {
		col = "created_at"
	}
	var typ string
	err := r.tx.QueryRow(ctx, `SELECT coalesce((SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped), '')`, table, col).Scan(&typ)
	if err != nil {
		return fmt.Errorf("verify: column %s of %s: %w", col, table, err)
	}
	// Strip a precision: timestamp(3) with time zone.
	base := typ
	if i, j := strings.Index(typ, "("), strings.Index(typ, ")"); i >= 0 && j > i {
		base = typ[:i] + typ[j+1:]
	}
	switch {
	case typ == "" && spec.OrderBy == "":
		return &fault.PrerequisiteError{Problem: fmt.Sprintf("verify: %s has no created_at column to select rows by time", table),
			Fix: "set snapshot.order_by to a timestamp column the application sets at insert, or add one: " +
				"ALTER TABLE " + table + " ADD COLUMN created_at timestamptz NOT NULL DEFAULT now() (rows written before it get the time of the ALTER)"}
	case typ == "":
		return &fault.PrerequisiteError{Problem: fmt.Sprintf("verify: snapshot.order_by: %s has no column %s", table, col),
			Fix: "set snapshot.order_by to a timestamp column of the outbox table, or leave it empty to use created_at"}
	case !timeTypes[base]:
		return &fault.PrerequisiteError{Problem: fmt.Sprintf("verify: column %s of %s is %s, not a timestamp: it cannot select rows by time", col, table, typ),
			Fix: "set snapshot.order_by to a timestamptz column set at insert (such as created_at)"}
	}
	order, err := s.snapshotOrder(ctx, r.tx, col)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	q, format, err := s.rowsQuery(ctx, r.tx, spec.Mapping, "", order)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	r.format = format
	c := pgx.Identifier{col}.Sanitize()
	filter := c + " >= $1::timestamptz"
	r.args = []any{since}
	if !until.IsZero() {
		filter += " AND " + c + " < $2::timestamptz"
		r.args = append(r.args, until)
	} else if held.Set() {
		filter = "(" + filter + " OR " + xidHeld("xmin::text::bigint", held) + ")"
	}
	// The rows query with the time column first and the range as its filter;
	// the query is built by snapshotSQL, whose output starts with SELECT and
	// has no WHERE for an empty filter.
	from := strings.Index(q, " FROM ")
	by := strings.Index(q, " ORDER BY ")
	if !strings.HasPrefix(q, "SELECT ") || from < 0 || by < from {
		return fmt.Errorf("verify: unexpected rows query %q", q)
	}
	r.query = "SELECT " + c + "::timestamptz, " + q[len("SELECT "):by] + " WHERE " + filter + q[by:]
	r.Column, r.Order, r.format = col, order, format
	return nil
}

// Query is the statement each pass runs, for logs and errors.
func (r *RangeRead) Query() string { return r.query }

// Start begins a pass over the rows, from the first. Every pass reads the
// same rows in the same order (the transaction's snapshot).
func (r *RangeRead) Start(ctx context.Context) error {
	r.closeBatch()
	if r.cursor {
		if _, err := r.tx.Exec(ctx, "CLOSE outbox_cdc_verify"); err != nil {
			return fmt.Errorf("verify: close cursor: %w", err)
		}
		r.cursor = false
	}
	// NO SCROLL, read forward in batches: the server keeps the position,
	// the client holds one batch.
	if _, err := r.tx.Exec(ctx, "DECLARE outbox_cdc_verify NO SCROLL CURSOR FOR "+r.query, r.args...); err != nil {
		return fmt.Errorf("verify: %s: %w", r.query, err)
	}
	r.ctx, r.cursor, r.done, r.err = ctx, true, false, nil
	return nil
}

func (r *RangeRead) closeBatch() {
	if r.batch != nil {
		r.batch.Close()
		r.batch = nil
	}
}

// Next advances to the next row of the pass.
func (r *RangeRead) Next() bool {
	for {
		if r.err != nil || !r.cursor {
			return false
		}
		if r.batch != nil {
			if r.batch.Next() {
				r.inBatch++
				return true
			}
			if err := r.batch.Err(); err != nil {
				r.err = fmt.Errorf("verify: read rows: %w", err)
				return false
			}
			r.closeBatch()
			if r.inBatch < rangeFetch {
				r.done = true
			}
		}
		if r.done {
			return false
		}
		rows, err := r.tx.Query(r.ctx, fmt.Sprintf("FETCH FORWARD %d FROM outbox_cdc_verify", rangeFetch))
		if err != nil {
			r.err = fmt.Errorf("verify: fetch: %w", err)
			return false
		}
		r.batch, r.inBatch = rows, 0
	}
}

// Row reads the current row: the event as the snapshot would publish it, and
// its time column's value.
func (r *RangeRead) Row() (decode.Event, time.Time, error) {
	var at time.Time
	var vals [4]*string
	var payload []byte
	hdrs := make([]*string, len(r.headers))
	dest := []any{&at, &vals[0], &vals[1], &vals[2], &vals[3], &payload}
	for i := range hdrs {
		dest = append(dest, &hdrs[i])
	}
	cols := newColumnScan(r.extra)
	if err := r.batch.Scan(cols.dest(dest)...); err != nil {
		return decode.Event{}, time.Time{}, fmt.Errorf("verify: scan: %w", err)
	}
	ev := decode.Event{ID: strValue(vals[0]), AggregateType: strValue(vals[1]), AggregateID: strValue(vals[2]),
		EventType: strValue(vals[3]), Payload: decode.Value{Bytes: payload, Null: payload == nil}, PayloadFormat: r.format}
	for i, h := range r.headers {
		ev.Headers = append(ev.Headers, decode.Header{Name: h, Value: strValue(hdrs[i])})
	}
	ev.Columns = cols.columns()
	return ev, at, nil
}

// Err is the error that ended the pass, if any.
func (r *RangeRead) Err() error { return r.err }

// Close ends the read and its transaction and connection.
func (r *RangeRead) Close() {
	ctx := context.WithoutCancel(r.ctx)
	r.closeBatch()
	_ = r.tx.Rollback(ctx)
	r.conn.Close(ctx)
}
