package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// identityColumns were added after the first release; older tables lack them.
var identityColumns = []string{"system_id", "timeline", "database", "gap_since", "gap_xmin", "commit_time", "repair_since", "mark", "mark_at", "floor_xid", "stream_state", "clean_stop", "gap_repaired"}

// TableStore keeps checkpoints in a table of the source database, one row
// per slot, so they live and fail over with the data they describe.
type TableStore struct {
	db           *DB
	slot         string
	schema, name string // unquoted
	table        string // quoted schema.table
	// mu serialises the connection's users: the checkpoint saver, and the
	// retention loop reading the repair hold.
	mu   sync.Mutex
	conn *pgx.Conn
	// seen is the highest WAL end the server showed at a save on timeline
	// seenTLI: a server on that timeline whose WAL ends below it was rewound
	// (restored from an older copy), and positions acknowledged before mean
	// nothing in its new history. A promotion starts a new timeline, whose
	// history the stream checks (followTimeline).
	seen    lsn.LSN
	seenTLI int32
	// floor, when set, is a position the server sent this process (the
	// acknowledged watermark): a server whose WAL ends below it was rewound
	// too, even when no save before the rewind recorded its end (SetFloor).
	floor func() lsn.LSN
	// marks, when set, is the quoted history marks table: a checkpoint is
	// saved only with its mark on the server (SetMarks).
	marks string
}

// SetMarks has a save refused on a server that lacks the checkpoint's history
// mark (marks.go), in the same statement: a connector that has not yet
// noticed a restore under it must not store a position of the old history
// in the restored table, whose WAL the application may have moved past it.
// Call it before the first save.
func (s *TableStore) SetMarks(table string) { s.marks = table }

// SetFloor gives the store a position the server has sent the connector
// (the acknowledged watermark), read at each save. Call it before the
// first save.
func (s *TableStore) SetFloor(floor func() lsn.LSN) { s.floor = floor }

// NewTableStore returns a store in table ("schema.table") for slot. The
// connection is opened on first use and reopened after an error.
func NewTableStore(db *DB, table, slot string) *TableStore {
	schema, name, _ := strings.Cut(table, ".")
	return &TableStore{db: db, slot: slot, schema: schema, name: name, table: pgx.Identifier{schema, name}.Sanitize()}
}

// Forget is what an operator runs to drop this slot's checkpoint.
func (s *TableStore) Forget() string {
	return fmt.Sprintf("DELETE FROM %s WHERE slot = %s", s.table, quoteLiteral(s.slot))
}

// DDL is the statement that creates the checkpoint table (docs/operations.md
// has the same, for an administrator to run).
func (s *TableStore) DDL() string {
	return fmt.Sprintf(`CREATE TABLE %s (
	slot          text        PRIMARY KEY,
	lsn           pg_lsn      NOT NULL,
	snapshot_done boolean     NOT NULL DEFAULT false,
	updated_at    timestamptz NOT NULL DEFAULT now(),
	system_id     text,
	timeline      integer,
	database      text,
	gap_since     pg_lsn,
	gap_xmin      bigint,
	commit_time   timestamptz,
	repair_since  timestamptz,
	mark          bigint,
	mark_at       pg_lsn,
	floor_xid     bigint,
	stream_state  text,
	clean_stop    boolean,
	gap_repaired  text)`, s.table)
}

func (s *TableStore) connect(ctx context.Context) (*pgx.Conn, error) {
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	conn, err := s.db.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("checkpoint store: connect: %w", err)
	}
	if err := s.prepare(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	s.conn = conn
	return conn, nil
}

// prepare creates the table when it is missing and adds the identity
// columns to a table of the old shape. A table that exists is only read
// from the catalogs, so a role with nothing but USAGE on the schema and
// SELECT, INSERT, UPDATE on the table works (CREATE ... IF NOT EXISTS checks
// the CREATE privilege before it checks existence).
func (s *TableStore) prepare(ctx context.Context, conn *pgx.Conn) error {
	var role string
	var usage, sel, ins, upd bool
	var cols []string
	err := conn.QueryRow(ctx, `SELECT current_user, has_schema_privilege(n.oid, 'USAGE'), has_table_privilege(c.oid, 'SELECT'),
			has_table_privilege(c.oid, 'INSERT'), has_table_privilege(c.oid, 'UPDATE'),
			array(SELECT attname::text FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		s.schema, s.name).Scan(&role, &usage, &sel, &ins, &upd, &cols)
	if errors.Is(err, pgx.ErrNoRows) {
		return s.create(ctx, conn)
	}
	if err != nil {
		return fmt.Errorf("checkpoint store: look up %s: %w", s.table, err)
	}
	if !usage || !sel || !ins || !upd {
		r := pgx.Identifier{role}.Sanitize()
		return fmt.Errorf("checkpoint store: role %s may not use %s; run GRANT USAGE ON SCHEMA %s TO %s; GRANT SELECT, INSERT, UPDATE ON %s TO %s",
			role, s.table, pgx.Identifier{s.schema}.Sanitize(), r, s.table, r)
	}
	var missing []string
	for _, c := range identityColumns {
		if !slices.Contains(cols, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	alter := fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS system_id text, ADD COLUMN IF NOT EXISTS timeline integer, "+
		"ADD COLUMN IF NOT EXISTS database text, ADD COLUMN IF NOT EXISTS gap_since pg_lsn, ADD COLUMN IF NOT EXISTS gap_xmin bigint, "+
		"ADD COLUMN IF NOT EXISTS commit_time timestamptz, ADD COLUMN IF NOT EXISTS repair_since timestamptz, "+
		"ADD COLUMN IF NOT EXISTS mark bigint, ADD COLUMN IF NOT EXISTS mark_at pg_lsn, "+
		"ADD COLUMN IF NOT EXISTS floor_xid bigint, ADD COLUMN IF NOT EXISTS stream_state text, "+
		"ADD COLUMN IF NOT EXISTS clean_stop boolean, ADD COLUMN IF NOT EXISTS gap_repaired text", s.table)
	if _, err := conn.Exec(ctx, alter); err != nil {
		return fmt.Errorf("checkpoint store: %s lacks the columns %s (written by an older version) and this role cannot add them (%w); "+
			"have the table's owner run: %s", s.table, strings.Join(missing, ", "), err, alter)
	}
	return nil
}

func (s *TableStore) create(ctx context.Context, conn *pgx.Conn) error {
	var schemaExists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", s.schema).Scan(&schemaExists); err != nil {
		return fmt.Errorf("checkpoint store: look up schema %s: %w", s.schema, err)
	}
	ddl := strings.Replace(s.DDL(), "CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1)
	if !schemaExists {
		ddl = fmt.Sprintf("CREATE SCHEMA IF NOT EXISTS %s; %s", pgx.Identifier{s.schema}.Sanitize(), ddl)
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("checkpoint store: create %s (grant CREATE on the database, or have an administrator create it: "+
			"docs/operations.md, least-privilege checkpoint table): %w", s.table, err)
	}
	return nil
}

// Load returns the slot's checkpoint, or offsets.ErrNoCheckpoint.
func (s *TableStore) Load(ctx context.Context) (offsets.Checkpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	conn, err := s.connect(ctx)
	if err != nil {
		return offsets.Checkpoint{}, err
	}
	var c offsets.Checkpoint
	var gapSince *lsn.LSN
	var gapXmin *int64
	var commitTime, repairSince *time.Time
	var mark, floor int64
	var stream, repaired string
	err = conn.QueryRow(ctx, fmt.Sprintf(`SELECT lsn, snapshot_done, updated_at, coalesce(system_id, ''), coalesce(timeline, 0),
		coalesce(database, ''), gap_since, gap_xmin, commit_time, repair_since, coalesce(mark, 0), coalesce(mark_at, '0/0'),
		coalesce(floor_xid, 0), coalesce(stream_state, ''), coalesce(clean_stop, false), coalesce(gap_repaired, '')
		FROM %s WHERE slot = $1`, s.table), s.slot).
		Scan(&c.LSN, &c.SnapshotDone, &c.UpdatedAt, &c.SystemID, &c.Timeline, &c.Database, &gapSince, &gapXmin, &commitTime,
			&repairSince, &mark, &c.MarkAt, &floor, &stream, &c.Clean, &repaired)
	c.Mark, c.Floor = uint64(mark), uint64(floor)
	if errors.Is(err, pgx.ErrNoRows) {
		return offsets.Checkpoint{}, offsets.ErrNoCheckpoint
	}
	if err != nil {
		s.reset(ctx)
		return offsets.Checkpoint{}, fmt.Errorf("checkpoint store: load: %w", err)
	}
	c.Slot = s.slot // the row's key
	if commitTime != nil {
		c.CommitTime = *commitTime
	}
	if repairSince != nil {
		c.RepairSince = *repairSince
	}
	if gapSince != nil && gapXmin != nil {
		c.Gap = &offsets.Gap{Since: *gapSince, Xmin: uint64(*gapXmin)}
		if err := decodeGapRepaired(repaired, c.UpdatedAt, c.Gap); err != nil {
			return offsets.Checkpoint{}, fmt.Errorf("checkpoint store: load: %w", err)
		}
	}
	if stream != "" {
		if err := json.Unmarshal([]byte(stream), &c.Stream); err != nil {
			return offsets.Checkpoint{}, fmt.Errorf("checkpoint store: load: stream_state: %w", err)
		}
	}
	return c, nil
}

// Save upserts the slot's checkpoint unless the stored one has the same
// identity and a later position (offsets.ErrStale). It is durable when Save returns
// (the row is committed with the server's synchronous_commit).
func (s *TableStore) Save(ctx context.Context, c offsets.Checkpoint) error {
	return s.save(ctx, c, `WHERE t.lsn <= excluded.lsn
		OR (t.system_id, t.timeline, t.database) IS DISTINCT FROM (excluded.system_id, excluded.timeline, excluded.database)`)
}

// Replace stores c whatever is stored: a new slot or a new snapshot starts
// a new history.
func (s *TableStore) Replace(ctx context.Context, c offsets.Checkpoint) error {
	return s.save(ctx, c, "")
}

// ClearRepair removes the slot's repair hold when a repair from since
// covered it (offsets.Checkpoint.RepairSince).
func (s *TableStore) ClearRepair(ctx context.Context, since time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	conn, err := s.connect(ctx)
	if err != nil {
		return false, err
	}
	tag, err := conn.Exec(ctx, fmt.Sprintf("UPDATE %s SET repair_since = NULL WHERE slot = $1 AND repair_since >= $2", s.table), s.slot, since)
	if err != nil {
		s.reset(ctx)
		return false, fmt.Errorf("checkpoint store: clear the repair hold: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// sameHistory refuses to save on a server whose WAL ends below what it
// showed at an earlier save. The stream stops the connector when it
// reconnects there (sameServer), but a save in between would record a
// position acknowledged in the old history that the new one may have passed
// with rows never streamed: the restart would skip them. (A server that
// wrote past the old end before the save cannot be told apart.)
func (s *TableStore) sameHistory(ctx context.Context, conn *pgx.Conn) error {
	// The floor is read before the WAL end: keepalives move it all along,
	// and read after, it could pass an end read just before.
	var floor lsn.LSN
	if s.floor != nil {
		floor = s.floor()
	}
	var end lsn.LSN
	var tli int32
	if err := conn.QueryRow(ctx, "SELECT "+walPosition+", CASE WHEN pg_is_in_recovery() THEN 0 ELSE "+serverTimeline+" END").
		Scan(&end, &tli); err != nil {
		s.reset(ctx)
		return fmt.Errorf("checkpoint store: read the WAL end: %w", err)
	}
	if tli != s.seenTLI {
		s.seen, s.seenTLI = 0, tli
	}
	if end < s.seen {
		return fmt.Errorf("checkpoint store: not saved: the server's WAL ends at %v, before %v, which it had reached at an "+
			"earlier save: it was restored from an older copy or replaced by a server that was behind; the connector stops "+
			"when its stream reconnects there, and the restart resumes from the restored checkpoint", end, s.seen)
	}
	if end < floor {
		return fmt.Errorf("checkpoint store: not saved: the server's WAL ends at %v, before %v, which it had sent the "+
			"connector: it was restored from an older copy or replaced by a server that was behind; the connector stops "+
			"when its stream reconnects there, and the restart resumes from the restored checkpoint", end, floor)
	}
	s.seen = end
	return nil
}

func (s *TableStore) save(ctx context.Context, c offsets.Checkpoint, where string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	conn, err := s.connect(ctx)
	if err != nil {
		return err
	}
	var gapSince, gapXmin, repairedJSON any
	if c.Gap != nil {
		gapSince, gapXmin = c.Gap.Since, int64(c.Gap.Xmin)
		if repairedJSON, err = encodeGapRepaired(c.Gap); err != nil {
			return fmt.Errorf("checkpoint store: save: %w", err)
		}
	}
	var commitTime, repairSince any
	if !c.CommitTime.IsZero() {
		commitTime = c.CommitTime
	}
	if !c.RepairSince.IsZero() {
		repairSince = c.RepairSince
	}
	var stream any
	if c.Stream != nil {
		b, err := json.Marshal(c.Stream)
		if err != nil {
			return fmt.Errorf("checkpoint store: save: %w", err)
		}
		stream = string(b)
	}
	if err := s.sameHistory(ctx, conn); err != nil {
		return err
	}
	// Never a position beyond the WAL of the server that holds the table:
	// the server was restored from an older copy while the connector ran,
	// and the next start would refuse it (CheckPosition).
	var mark, markAt any
	proven := "" // the mark, when there is one, must be on the server
	if c.Mark != 0 {
		mark, markAt = int64(c.Mark), c.MarkAt
		if s.marks != "" {
			proven = fmt.Sprintf(" AND EXISTS (SELECT 1 FROM %s WHERE slot = $1 AND mark = $11)", s.marks)
		}
	}
	tag, err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s AS t (slot, lsn, snapshot_done, updated_at, system_id, timeline, database,
			gap_since, gap_xmin, commit_time, repair_since, mark, mark_at, floor_xid, stream_state, clean_stop, gap_repaired)
		SELECT $1, $2, $3, now(), $4, CASE WHEN $5::int IS NULL THEN NULL ELSE %s END, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
			`+gapRepairedSQL+`
		WHERE $2::pg_lsn <= `+walPosition+proven+`
		ON CONFLICT (slot) DO UPDATE SET lsn = excluded.lsn, snapshot_done = excluded.snapshot_done, updated_at = now(),
			system_id = excluded.system_id, timeline = excluded.timeline, database = excluded.database,
			gap_since = excluded.gap_since, gap_xmin = excluded.gap_xmin, commit_time = excluded.commit_time,
			repair_since = LEAST(t.repair_since, excluded.repair_since), mark = excluded.mark, mark_at = excluded.mark_at,
			floor_xid = excluded.floor_xid, stream_state = excluded.stream_state, clean_stop = excluded.clean_stop,
			gap_repaired = excluded.gap_repaired %s`,
		s.table, serverTimeline, where),
		s.slot, c.LSN, c.SnapshotDone, nullable(c.SystemID), nullable(c.Timeline), nullable(c.Database), gapSince, gapXmin, commitTime,
		repairSince, mark, markAt, nullable(int64(c.Floor)), stream, c.Clean, repairedJSON)
	if err != nil {
		s.reset(ctx)
		return fmt.Errorf("checkpoint store: save: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return s.notSaved(ctx, conn, c, proven != "")
	}
	return nil
}

// notSaved says why a save changed no row: a position beyond the server's
// WAL end, a mark the server lacks (both: a restore while the connector
// ran), else a later checkpoint another connector saved (offsets.ErrStale).
func (s *TableStore) notSaved(ctx context.Context, conn *pgx.Conn, c offsets.Checkpoint, proven bool) error {
	var beyond bool
	if err := conn.QueryRow(ctx, `SELECT $1::pg_lsn > `+walPosition, c.LSN).Scan(&beyond); err != nil {
		s.reset(ctx)
		return fmt.Errorf("checkpoint store: save: %w", err)
	}
	if beyond {
		return fmt.Errorf("checkpoint store: not saved: %v lies beyond the WAL end of the server that holds %s "+
			"(restored from an older copy while the connector ran?)", c.LSN, s.table)
	}
	if proven {
		var found bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+s.marks+" WHERE slot = $1 AND mark = $2)", s.slot,
			int64(c.Mark)).Scan(&found); err != nil {
			s.reset(ctx)
			return fmt.Errorf("checkpoint store: save: %w", err)
		}
		if !found {
			return fmt.Errorf("checkpoint store: not saved: the server that holds %s lacks history mark %d, which proves %v: "+
				"it was restored from an older copy or replaced while the connector ran; the connector stops when its "+
				"stream reconnects there, and the restart resumes from the restored checkpoint", s.table, c.Mark, c.LSN)
		}
	}
	return offsets.ErrStale
}

// serverTimeline is the timeline the server writes WAL on now: the first
// 8 hex digits of a WAL file name (PG docs, "WAL Internals"). The table
// store records it instead of the timeline the connector started on: the
// row is written into the WAL the connector streams, so after a standby's
// promotion that it followed without a restart, the positions it saves
// belong to the new timeline (the stream resumed no later than the fork,
// which synchronized_standby_slots guarantees), and a restart must find
// them stamped so, or CheckPosition would take them for a restore to
// before them. The file store keeps the timeline of the start.
// The store writes on a primary only (postgres.primary_dsn for a standby:
// pg_walfile_name refuses to run during recovery); walPosition keeps the
// one definition of the position.
const serverTimeline = `('x' || substr(pg_walfile_name(` + walPosition + `), 1, 8))::bit(32)::int`

// nullable stores an unknown identity part (zero) as NULL.
func nullable[T comparable](v T) any {
	var zero T
	if v == zero {
		return nil
	}
	return v
}

func (s *TableStore) reset(ctx context.Context) {
	if s.conn != nil {
		s.conn.Close(context.WithoutCancel(ctx))
		s.conn = nil
	}
}

// Close releases the connection.
func (s *TableStore) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reset(context.Background())
}

// ForeignCheckpoint refuses a checkpoint written for another cluster,
// database or slot: its LSN is no position of this stream, and trusting it
// would skip (and confirm) transactions below it. A checkpoint without
// identity (an older version) passes; CheckPosition still applies.
func ForeignCheckpoint(c offsets.Checkpoint, srv Server, slot, forget string) error {
	switch {
	case c.IsZero():
		return nil
	case c.SystemID != srv.SystemID:
		return refuseCheckpoint(c, fmt.Sprintf("was written for database system %s, but this server is database system %s "+
			"(another cluster, or a checkpoint copied from another deployment)", c.SystemID, srv.SystemID), forget)
	case c.Database != srv.Database:
		return refuseCheckpoint(c, fmt.Sprintf("was written for database %s, but the connector streams database %s",
			c.Database, srv.Database), forget)
	case c.Slot != slot:
		return refuseCheckpoint(c, fmt.Sprintf("was written for slot %s, but postgres.slot is %s", c.Slot, slot), forget)
	}
	return nil
}

// CheckPosition refuses a checkpoint whose LSN is not a position of this
// server's WAL history (NotInHistory). A checkpoint without identity (an
// older version) is checked against the WAL end only.
func CheckPosition(c offsets.Checkpoint, srv Server, forget string) error {
	tli := c.Timeline
	if c.IsZero() {
		tli = 0
	}
	if why := NotInHistory(c.LSN, tli, srv); why != "" {
		return refuseCheckpoint(c, why, forget)
	}
	return nil
}

// NotInHistory says why position at, written on timeline tli (0: unknown),
// is not a position this server has reached: beyond its WAL end, or on a
// timeline that left the current timeline's history before it (a restore
// to an earlier point in time forks a new timeline there, and so does the
// promotion of a standby, where it had replayed to; PG docs 26.3.5,
// "Timelines"). It is "" for a position the server has.
func NotInHistory(at lsn.LSN, tli int32, srv Server) string {
	if at > srv.WALEnd {
		return fmt.Sprintf("lies beyond this server's WAL end %v (it was written by another server, "+
			"or before this one was restored from an older backup)", srv.WALEnd)
	}
	if tli == 0 || tli == srv.Timeline {
		return ""
	}
	fork, ok := srv.ForkPoint(tli)
	if !ok {
		return fmt.Sprintf("was written on timeline %d, which is not in the history of this server's timeline %d", tli, srv.Timeline)
	}
	if at > fork {
		return fmt.Sprintf("was written on timeline %d after this server's history left it at %v "+
			"(a restore to an earlier point in time, or a standby promoted before it replayed that far): this server never had that WAL", tli, fork)
	}
	return ""
}

func refuseCheckpoint(c offsets.Checkpoint, why, forget string) error {
	return &fault.PrerequisiteError{
		Problem: fmt.Sprintf("checkpoint %v %s", c.LSN, why),
		Fix: "if it does not belong to this slot, drop it and start again, which streams from the slot's confirmed position: " +
			forget + "; to publish a range of events again, use outbox-cdc replay (docs/operations.md)",
	}
}
