package replication

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// A history mark proves that a position lies in a server's history. The
// connector writes a row with a random id into the marks table and, in the
// same transaction, a transactional logical message carrying the id; the
// stream decodes the message at the transaction's commit, at C. A server
// that has the row has that commit in its WAL, and WAL is one sequence per
// timeline, so its history up to C is the one the connector decoded: every
// position at or below C is one of its positions. A restore to an earlier
// state (a copied data directory, a volume snapshot, a PITR) cannot contain
// a row written after it, whatever its WAL end says later, and no new row
// takes an id drawn at random from 2^63. Sources: PG docs 9.28.6
// (pg_logical_emit_message: a transactional message is decoded with its
// transaction) and 55.5 (pgoutput's "messages" option, PostgreSQL 14+).

// MarkPrefix is the logical message prefix of history marks; the content is
// "<slot>/<id>".
const MarkPrefix = "outbox-cdc-mark"

// MarksVersion is the first PostgreSQL major that decodes marks: pgoutput
// sends logical messages from 14 on.
const MarksVersion = messagesVersion

// markAge is how long a mark is kept unless it is protected (Prune): a
// running connector saves its positions, with a recent mark, many times a
// second, and a stopped one prunes nothing.
const markAge = "1 hour"

// Marks writes and finds the history marks of one slot in a table of the
// source database. Write goes to the primary (Source.Writer); Present asks
// the server the stream reads.
type Marks struct {
	writer, reader *DB
	table          string // quoted schema.table
	schema, name   string
	slot           string
	conn           *pgx.Conn // the writer's, used by one goroutine
}

// NewMarks returns the marks of slot in table ("schema.table").
func NewMarks(src Source, table string) *Marks {
	schema, name, _ := strings.Cut(table, ".")
	return &Marks{writer: src.Writer(), reader: src.DB, table: pgx.Identifier{schema, name}.Sanitize(),
		schema: schema, name: name, slot: src.Slot}
}

// Table is the quoted marks table.
func (m *Marks) Table() string { return m.table }

// DDL creates the marks table (docs/operations.md has it for an
// administrator to run).
func (m *Marks) DDL() string {
	return fmt.Sprintf(`CREATE TABLE %s (
	slot       text        NOT NULL,
	mark       bigint      NOT NULL,
	written_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (slot, mark))`, m.table)
}

// Prepare creates the table when it is missing (with CREATE on the schema)
// and writes the run's first mark, so that a role that may not write it is
// refused at start with the statements that fix it. It returns the mark and
// a position below its commit (Write).
func (m *Marks) Prepare(ctx context.Context) (uint64, lsn.LSN, error) {
	conn, err := m.connect(ctx)
	if err != nil {
		return 0, 0, err
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.table).Scan(&exists); err != nil {
		m.reset(ctx)
		return 0, 0, fmt.Errorf("history marks: look up %s: %w", m.table, err)
	}
	if !exists {
		ddl := fmt.Sprintf("CREATE SCHEMA IF NOT EXISTS %s; %s", pgx.Identifier{m.schema}.Sanitize(),
			strings.Replace(m.DDL(), "CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
		if _, err := conn.Exec(ctx, ddl); err != nil {
			m.reset(ctx)
			return 0, 0, &fault.PrerequisiteError{
				Problem: fmt.Sprintf("the history marks table %s is missing and this role cannot create it: %v", m.table, err),
				Fix:     m.adminFix(),
			}
		}
	}
	id, below, err := m.Write(ctx)
	if err != nil {
		return 0, 0, &fault.PrerequisiteError{
			Problem: fmt.Sprintf("cannot write a history mark: %v", err),
			Fix: fmt.Sprintf("GRANT SELECT, INSERT, DELETE ON %s TO <role>; GRANT EXECUTE ON FUNCTION "+
				"pg_logical_emit_message(boolean, text, text) TO <role>", m.table),
		}
	}
	return id, below, nil
}

// adminFix is what an administrator runs for a role that may not create
// the table.
func (m *Marks) adminFix() string {
	schema := pgx.Identifier{m.schema}.Sanitize()
	return fmt.Sprintf("have an administrator run: CREATE SCHEMA IF NOT EXISTS %s; %s; GRANT USAGE ON SCHEMA %s TO <role>; "+
		"GRANT SELECT, INSERT, DELETE ON %s TO <role>", schema, m.DDL(), schema, m.table)
}

func (m *Marks) connect(ctx context.Context) (*pgx.Conn, error) {
	if m.conn != nil && !m.conn.IsClosed() {
		return m.conn, nil
	}
	c, err := m.writer.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("history marks: connect: %w", err)
	}
	m.conn = c
	return c, nil
}

func (m *Marks) reset(ctx context.Context) {
	if m.conn != nil {
		m.conn.Close(context.WithoutCancel(ctx))
		m.conn = nil
	}
}

// Close releases the writer's connection.
func (m *Marks) Close() { m.reset(context.Background()) }

// Write commits a new mark and returns its id and a position below its
// commit (the WAL insert position inside its transaction). The stream
// decodes it at the transaction's commit. Before that, the mark already
// proves every position up to below that a run decodes after writing it:
// a server that has the mark has the WAL the run decoded up to there.
func (m *Marks) Write(ctx context.Context) (uint64, lsn.LSN, error) {
	conn, err := m.connect(ctx)
	if err != nil {
		return 0, 0, err
	}
	id := rand.Uint64N(1<<63-1) + 1 // never 0: 0 means "no mark"
	var below lsn.LSN
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (slot, mark) VALUES ($1, $2)", m.table), m.slot, int64(id)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", MarkPrefix, markContent(m.slot, id)); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()").Scan(&below)
	})
	if err != nil {
		if ctx.Err() == nil {
			m.reset(ctx)
		}
		return 0, 0, fmt.Errorf("history marks: write: %w", err)
	}
	return id, below, nil
}

// Prune deletes the slot's marks older than markAge, but never the newest
// 16 nor the protected ones (the marks of the positions the run started
// from: a run that crashes before it saves again must find them).
func (m *Marks) Prune(ctx context.Context, protect []uint64) error {
	conn, err := m.connect(ctx)
	if err != nil {
		return err
	}
	ids := make([]int64, len(protect))
	for i, id := range protect {
		ids[i] = int64(id)
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s WHERE slot = $1 AND written_at < now() - interval '%[2]s'
		AND mark <> ALL($2) AND mark NOT IN (SELECT mark FROM %[1]s WHERE slot = $1 ORDER BY written_at DESC LIMIT 16)`,
		m.table, markAge), m.slot, ids)
	if err != nil {
		if ctx.Err() == nil {
			m.reset(ctx)
		}
		return fmt.Errorf("history marks: prune: %w", err)
	}
	return nil
}

// Present reports whether the server the stream reads has mark id.
func (m *Marks) Present(ctx context.Context, id uint64) (bool, error) {
	conn, err := m.reader.connect(ctx)
	if err != nil {
		return false, fmt.Errorf("history marks: connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var found bool
	err = conn.QueryRow(ctx, fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE slot = $1 AND mark = $2)", m.table),
		m.slot, int64(id)).Scan(&found)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return false, nil // no table: no mark (a restore to before the first run, another cluster)
	}
	if err != nil {
		return false, fmt.Errorf("history marks: look up mark %d: %w", id, classify(err))
	}
	return found, nil
}

// markPresentOn asks the same on a replication connection (replication=
// database runs simple queries, PG docs 55.4), the one a reconnect reached.
func markPresentOn(ctx context.Context, conn *pgconn.PgConn, table, slot string, id uint64) (bool, error) {
	sql := fmt.Sprintf("SELECT EXISTS (SELECT 1 FROM %s WHERE slot = %s AND mark = %d)", table, quoteLiteral(slot), int64(id))
	res, err := conn.Exec(ctx, sql).ReadAll()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("history marks: look up mark %d: %w", id, classify(err))
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return false, fmt.Errorf("history marks: look up mark %d: unexpected result", id)
	}
	return string(res[0].Rows[0][0]) == "t", nil
}

func markContent(slot string, id uint64) string { return slot + "/" + strconv.FormatUint(id, 10) }

// ParseMark reads a mark message's content; ok is false for another slot's
// mark or a malformed one.
func ParseMark(content []byte, slot string) (id uint64, ok bool) {
	s, n, found := strings.Cut(string(content), "/")
	if !found || s != slot {
		return 0, false
	}
	id, err := strconv.ParseUint(n, 10, 64)
	if err != nil || id == 0 {
		return 0, false
	}
	return id, true
}

// Check says, without writing, what a run would refuse about the marks
// table: a table this role may not use, or one it may not create. A
// server that decodes no marks (PostgreSQL 13) needs none.
func (m *Marks) Check(ctx context.Context) error {
	conn, err := m.writer.connect(ctx)
	if err != nil {
		return fmt.Errorf("history marks: connect: %w", classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	major, _, err := ServerMajor(ctx, conn)
	if err != nil || major < MarksVersion {
		return err
	}
	var exists, use, create bool
	err = conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
			coalesce(has_table_privilege(to_regclass($1), 'SELECT') AND has_table_privilege(to_regclass($1), 'INSERT')
				AND has_table_privilege(to_regclass($1), 'DELETE'), false),
			CASE WHEN to_regnamespace($2) IS NULL THEN has_database_privilege(current_database(), 'CREATE')
				ELSE has_schema_privilege(to_regnamespace($2)::oid, 'CREATE') END`, m.table, m.schema).Scan(&exists, &use, &create)
	if err != nil {
		return fmt.Errorf("history marks: look up %s: %w", m.table, err)
	}
	switch {
	case exists && !use:
		return &fault.PrerequisiteError{Problem: fmt.Sprintf("this role may not use the history marks table %s", m.table),
			Fix: fmt.Sprintf("GRANT SELECT, INSERT, DELETE ON %s TO <role>", m.table)}
	case !exists && !create:
		return &fault.PrerequisiteError{Problem: fmt.Sprintf("the history marks table %s is missing and this role may not create it", m.table),
			Fix: m.adminFix()}
	}
	return nil
}
