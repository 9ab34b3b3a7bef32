package replication

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// RowSpec says what a read of the outbox table returns: the mapped columns
// (the payload as bytes: bytea raw, other types in their text form), in the
// snapshot order.
type RowSpec struct {
	Mapping decode.Mapping
	// Filter is snapshot.filter (SQL, "" for every row); the snapshot only.
	Filter string
	// OrderBy is snapshot.order_by: the column the rows are ordered by
	// before the primary key ("": created_at if the table has it).
	OrderBy string
	// Table is stamped on each Event (decode.Event.Table): the index of the
	// table among Source.Tables.
	Table int
}

// Rows is a read of outbox rows inside one repeatable-read transaction of
// its own connection; Close ends it.
type Rows struct {
	what    string // "snapshot" or "backfill", for errors
	conn    *pgx.Conn
	tx      pgx.Tx
	rows    pgx.Rows
	headers []string
	format  decode.PayloadFormat
	extra   []string // Mapping.Columns
	table   int      // RowSpec.Table of the current query
	ctx     context.Context
	// pending are the queries of the further outbox tables, run in turn in
	// the same transaction (one snapshot for every table); err is the
	// error of the one that failed.
	pending []func() error
	err     error
}

// Next advances to the next row, of this table or of the next one.
func (r *Rows) Next() bool {
	for !r.rows.Next() {
		if r.rows.Err() != nil || len(r.pending) == 0 {
			return false
		}
		r.rows.Close()
		next := r.pending[0]
		r.pending = r.pending[1:]
		if r.err = next(); r.err != nil {
			return false
		}
	}
	return true
}

// Event reads the current row.
func (r *Rows) Event() (decode.Event, error) {
	var vals [4]*string
	var payload []byte
	hdrs := make([]*string, len(r.headers))
	dest := []any{&vals[0], &vals[1], &vals[2], &vals[3], &payload}
	for i := range hdrs {
		dest = append(dest, &hdrs[i])
	}
	cols := newColumnScan(r.extra)
	if err := r.rows.Scan(cols.dest(dest)...); err != nil {
		return decode.Event{}, fmt.Errorf("%s: scan: %w", r.what, err)
	}
	ev := decode.Event{ID: strValue(vals[0]), AggregateType: strValue(vals[1]), AggregateID: strValue(vals[2]),
		EventType: strValue(vals[3]), Payload: decode.Value{Bytes: payload, Null: payload == nil}, PayloadFormat: r.format}
	for i, h := range r.headers {
		ev.Headers = append(ev.Headers, decode.Header{Name: h, Value: strValue(hdrs[i])})
	}
	ev.Columns = cols.columns()
	ev.Table = r.table
	return ev, nil
}

// Err is the error that ended the read, if any.
func (r *Rows) Err() error {
	if r.err != nil {
		return r.err
	}
	if err := r.rows.Err(); err != nil {
		return fmt.Errorf("%s: read rows: %w", r.what, err)
	}
	return nil
}

// Close ends the read and its transaction and connection.
func (r *Rows) Close() {
	ctx := context.WithoutCancel(r.ctx)
	if r.rows != nil {
		r.rows.Close()
	}
	_ = r.tx.Rollback(ctx)
	r.conn.Close(ctx)
}

func strValue(s *string) decode.Value {
	if s == nil {
		return decode.Value{Null: true}
	}
	return decode.Value{Bytes: []byte(*s)}
}

// begin opens a read-only repeatable-read transaction on a new connection.
func (s Source) begin(ctx context.Context, what string) (*Rows, error) {
	conn, err := s.DB.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", what, err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%s: begin: %w", what, err)
	}
	return &Rows{what: what, conn: conn, tx: tx, ctx: ctx}, nil
}

// query runs the rows query with filter and order on r's transaction.
func (s Source) query(ctx context.Context, r *Rows, spec RowSpec, filter string, order []string) error {
	q, format, err := s.rowsQuery(ctx, r.tx, spec.Mapping, filter, order)
	if err != nil {
		return fmt.Errorf("%s: %w", r.what, err)
	}
	if r.rows, err = r.tx.Query(ctx, q); err != nil {
		return fmt.Errorf("%s: %s: %w", r.what, q, err)
	}
	r.headers, r.extra, r.format, r.table = spec.Mapping.HeaderColumns, spec.Mapping.Columns, format, spec.Table
	return nil
}

// queryEach runs query for each outbox table with its spec (specs[i] for
// Tables()[i]) on r's transaction: the first now, the others when the rows
// before them are read.
func (s Source) queryEach(r *Rows, specs []RowSpec, query func(t Source, spec RowSpec) error) error {
	ts := s.Tables()
	if len(specs) != len(ts) {
		return fmt.Errorf("%s: %d row specs for %d tables", r.what, len(specs), len(ts))
	}
	for i := range ts[1:] {
		r.pending = append(r.pending, func() error { return query(ts[i+1], specs[i+1]) })
	}
	return query(ts[0], specs[0])
}

// SnapshotRows reads every outbox table in the snapshot the new slot
// exported: exactly what was committed before the slot's first change.
// specs[i] is the spec of Tables()[i].
func (s Source) SnapshotRows(ctx context.Context, snap *ExportedSnapshot, specs []RowSpec) (*Rows, error) {
	r, err := s.begin(ctx, "snapshot")
	if err != nil {
		return nil, err
	}
	if _, err := r.tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snap.Name)); err != nil {
		r.Close()
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	err = s.queryEach(r, specs, func(t Source, spec RowSpec) error {
		order, err := t.snapshotOrder(ctx, r.tx, spec.OrderBy)
		if err != nil {
			return err
		}
		return t.query(ctx, r, spec, spec.Filter, order)
	})
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Gap is what a read of a gap's rows found beside the rows themselves.
type Gap struct {
	// ClearAt is a WAL position past the commit of every row read: once the
	// watermark passes it, the gap is repaired.
	ClearAt lsn.LSN
	// Transactions counts the ids that wrote the rows (a subtransaction's
	// for a row inserted in a savepoint), for the log: the stream matches
	// rows, not transactions (pipeline/backfill.go).
	Transactions int
	// Read is what the read read, from its bound (offsets.RepairedRows;
	// the rows an earlier repair read, left out, are not in it).
	Read offsets.RepairedRows
}

// GapRows reads the rows written by transactions at or after xmin (a full
// 64-bit transaction id), in transaction order, from every outbox table in
// one snapshot (specs[i] for Tables()[i]): the rows of a gap the stream
// could not decode, but for those an earlier repair read (done; zero: none)
// and those that had ended before the gap (finished; zero: unknown), which
// the stream decodes or delivered before its start. Before it reads, it waits for
// the transactions running now that may have written the gap (waiting is
// told which, every gapWaitLog; waitGapWriters).
func (s Source) GapRows(ctx context.Context, xmin uint64, done offsets.RepairedRows, finished offsets.FinishedTxns, specs []RowSpec,
	waiting func(xids []int64)) (*Rows, Gap, error) {
	for _, l := range []string{done.Xids, finished.Open} {
		if !xidList.MatchString(l) {
			return nil, Gap{}, &fault.FatalError{Reason: "checkpoint", Err: fmt.Errorf("backfill: the checkpoint's gap "+
				"lists %q, which is not a list of transaction ids; the checkpoint was edited or damaged", l)}
		}
	}
	if err := s.waitGapWriters(ctx, xmin, waiting); err != nil {
		return nil, Gap{}, err
	}
	r, err := s.begin(ctx, "backfill")
	if err != nil {
		return nil, Gap{}, err
	}
	g, err := s.gap(ctx, r, xmin, done, finished, specs)
	if err != nil {
		r.Close()
		return nil, Gap{}, err
	}
	return r, g, nil
}

func (s Source) gap(ctx context.Context, r *Rows, xmin uint64, done offsets.RepairedRows, finished offsets.FinishedTxns,
	specs []RowSpec) (Gap, error) {
	// The first statement fixes the snapshot; the WAL position read in it
	// is past every commit the snapshot sees.
	var ref, below uint64
	var g Gap
	if err := r.tx.QueryRow(ctx, "SELECT pg_snapshot_xmax(s)::text::bigint, pg_snapshot_xmin(s)::text::bigint, "+walPosition+
		" FROM pg_current_snapshot() s").Scan(&ref, &below, &g.ClearAt); err != nil {
		return Gap{}, fmt.Errorf("backfill: %w", err)
	}
	filter := xidFilter(ref, xmin) + leaveOut(ref, done) + leaveOutFinished(ref, finished)
	var listed []int64
	for _, t := range s.Tables() {
		xids, err := r.tx.Query(ctx, "SELECT DISTINCT "+xid8(ref)+" FROM "+t.qualified()+" WHERE "+filter)
		if err != nil {
			return Gap{}, fmt.Errorf("backfill: %w", err)
		}
		ids, err := pgx.CollectRows(xids, pgx.RowTo[int64])
		if err != nil {
			return Gap{}, fmt.Errorf("backfill: %w", err)
		}
		g.Transactions += len(ids)
		for _, x := range ids {
			if uint64(x) >= below {
				listed = append(listed, x)
			}
		}
	}
	g.Read = offsets.RepairedRows{Xmin: xmin, Below: below}
	if len(listed) <= offsets.MaxRepairedXids {
		g.Read.Xids = offsets.JoinXids(listed)
	}
	// Per aggregate, a writer's transactions get increasing ids; the stream
	// delivers in commit order, which for one aggregate's serialized writes
	// is the same. Within a transaction, commandID, then within a statement
	// snapshot.order_by when set (ctid is not the order a multi-row INSERT
	// wrote; commandID), then ctid.
	return g, s.queryEach(r, specs, func(t Source, spec RowSpec) error {
		order := []string{xid8(ref), commandID}
		if spec.OrderBy != "" {
			// Checked for each table on each read: the column can be
			// dropped after the slot's creation checked it, or missing from
			// a table added later, and a repair that fails on it would stop
			// the connector at the gap on every start.
			has, err := t.hasColumn(ctx, r.tx, spec.OrderBy)
			if err != nil {
				return fmt.Errorf("backfill: %w", err)
			}
			if has {
				order = append(order, spec.OrderBy)
			}
		}
		return t.query(ctx, r, spec, filter, append(order, "ctid"))
	})
}

// rowsQuery selects the mapped columns of the rows matching filter (SQL, ""
// for all) ordered by order (columns, or expressions in parentheses): the
// query of the snapshot and the backfill.
// The payload's format is the one the decoder gives the same column.
func (s Source) rowsQuery(ctx context.Context, tx pgx.Tx, m decode.Mapping, filter string, order []string) (string, decode.PayloadFormat, error) {
	var payloadType string
	var payloadOID uint32
	err := tx.QueryRow(ctx, `SELECT format_type(atttypid, NULL), atttypid FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped`,
		s.qualified(), m.Payload).Scan(&payloadType, &payloadOID)
	if err != nil {
		return "", 0, fmt.Errorf("payload column %s: %w", m.Payload, err)
	}
	return snapshotSQL(m, s.Schema, s.Table, payloadType == "bytea", filter, order), decode.PayloadFormatOf(payloadOID), nil
}

// snapshotSQL builds the rows query.
func snapshotSQL(m decode.Mapping, schema, table string, payloadBytea bool, filter string, order []string) string {
	text := func(col string) string { return pgx.Identifier{col}.Sanitize() + "::text" }
	cols := []string{text(m.ID), text(m.AggregateType), text(m.AggregateID), text(m.EventType)}
	if payloadBytea {
		cols = append(cols, pgx.Identifier{m.Payload}.Sanitize())
	} else {
		cols = append(cols, "convert_to("+text(m.Payload)+", 'UTF8')")
	}
	for _, h := range m.HeaderColumns {
		cols = append(cols, text(h))
	}
	for _, c := range m.Columns { // with the type the WAL's Relation message would give
		cols = append(cols, text(c), "pg_typeof("+pgx.Identifier{c}.Sanitize()+")::oid")
	}
	q := "SELECT " + strings.Join(cols, ", ") + " FROM " + pgx.Identifier{schema, table}.Sanitize()
	if f := strings.TrimSpace(filter); f != "" {
		q += " WHERE (" + f + ")"
	}
	if len(order) > 0 {
		quoted := make([]string, len(order))
		for i, c := range order {
			quoted[i] = pgx.Identifier{c}.Sanitize()
			if strings.HasPrefix(c, "(") { // an expression (the backfill's transaction order)
				quoted[i] = c
			}
		}
		q += " ORDER BY " + strings.Join(quoted, ", ")
	}
	return q
}

// rowQuerier is a connection or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// hasColumn reports whether the table has the column col.
func (s Source) hasColumn(ctx context.Context, q rowQuerier, col string) (bool, error) {
	var exists bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped)`, s.qualified(), col).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("column %s: %w", col, err)
	}
	return exists, nil
}

// snapshotOrder returns the ORDER BY columns: by (snapshot.order_by), then
// the primary key (pg_index), which makes the order total and the same on
// every run. A table without a primary key needs snapshot.order_by.
func (s Source) snapshotOrder(ctx context.Context, q rowQuerier, by string) ([]string, error) {
	table := s.qualified()
	var pk []string
	// indkey is an int2vector, subscripted from 0; the key columns come first.
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(a.attname::text ORDER BY k), '{}')
		FROM pg_index i CROSS JOIN generate_series(0, i.indnkeyatts - 1) k
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[k]
		WHERE i.indrelid = to_regclass($1) AND i.indisprimary`, table).Scan(&pk)
	if err != nil {
		return nil, fmt.Errorf("snapshot: primary key of %s: %w", table, err)
	}
	// Without snapshot.order_by, created_at (the column of sql/outbox.sql,
	// set at insert) keeps each aggregate's events in the order they were
	// written, which a random uuid key does not.
	want := by
	if want == "" {
		want = "created_at"
	}
	exists, err := s.hasColumn(ctx, q, want)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	switch {
	case exists:
		by = want
	case by != "":
		return nil, &fault.PrerequisiteError{Problem: fmt.Sprintf("snapshot.order_by: %s has no column %s", table, by),
			Fix: "set snapshot.order_by to a column of the outbox table, or leave it empty to order by created_at or the primary key"}
	}
	order := orderColumns(by, pk)
	if len(order) == 0 {
		return nil, &fault.PrerequisiteError{Problem: fmt.Sprintf("%s has no primary key, so its snapshot has no stable order", table),
			Fix: "set snapshot.order_by to a column such as created_at, or add a primary key"}
	}
	return order, nil
}

// commandID orders the rows of one transaction as they were inserted: cmin
// is the command (statement) of the transaction that wrote the row, counted
// up from 0 (PG docs, "System Columns"). ctid is not that order: once
// VACUUM has recorded free space in earlier pages, a transaction's later
// rows can land there (TestGapRowsKeepInsertionOrder). Rows of one
// multi-row INSERT share their cmin, and ctid orders them only as well as
// it can: the free space map can put a later row in an earlier page
// (snapshot.order_by is the exact order). cid has no ordering operator,
// hence the casts.
const commandID = "(cmin::text::bigint)"

// orderColumns is by (if set) and the insertion order within a transaction
// (commandID, then ctid), followed by the primary key columns not already
// in it. Rows of one transaction share created_at (now() is the
// transaction's start), and a random key would shuffle them.
func orderColumns(by string, pk []string) []string {
	var out []string
	if by != "" {
		out = append(out, by, commandID, "ctid")
	}
	for _, c := range pk {
		if c != by {
			out = append(out, c)
		}
	}
	return out
}

// CheckSnapshotOrder finds the snapshot order before the slot is created,
// so a table that has none is refused before anything changes.
func (s Source) CheckSnapshotOrder(ctx context.Context, orderBy string) error {
	conn, err := s.DB.connect(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = s.snapshotOrder(ctx, conn, orderBy)
	return err
}

// columnScan reads the Mapping.Columns part of a rows query: each column's
// text and type OID.
type columnScan struct {
	names []string
	text  []*string
	types []uint32
}

func newColumnScan(names []string) *columnScan {
	return &columnScan{names: names, text: make([]*string, len(names)), types: make([]uint32, len(names))}
}

// dest appends the scan targets to d.
func (c *columnScan) dest(d []any) []any {
	for i := range c.names {
		d = append(d, &c.text[i], &c.types[i])
	}
	return d
}

// columns returns the scanned values, nil when there are none.
func (c *columnScan) columns() []decode.Column {
	if len(c.names) == 0 {
		return nil
	}
	out := make([]decode.Column, len(c.names))
	for i, n := range c.names {
		out[i] = decode.Column{Name: n, Value: strValue(c.text[i]), Type: c.types[i]}
	}
	return out
}
