package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Membership is how the outbox table stands in the publication at one
// moment: what decides whether its inserts reach the stream.
type Membership struct {
	// Publication is false when the publication does not exist.
	Publication bool
	// PubOID and PubXmin identify the publication and the version of its
	// row: a publication dropped and created again has another OID, and
	// ALTER PUBLICATION ... SET (its options) writes a new row version
	// (ADD and DROP TABLE write pg_publication_rel rows only).
	PubOID, PubXmin uint32
	PubInsert       bool
	ViaRoot         bool // publish_via_partition_root
	// RelID is the OID the configured name resolves to; zero when no table
	// has that name.
	RelID       uint32
	Partitioned bool
	// PubRelID is the pg_publication_rel row that makes the table a member
	// (zero for FOR ALL TABLES / TABLES IN SCHEMA): a new row means the
	// table was removed and added again.
	PubRelID uint32
	// Member is true when pg_publication_tables lists the table (for a
	// partitioned table with publish_via_partition_root, the root itself).
	Member bool
	// StartName is where the table that was the outbox at start (the OID
	// passed to Check) lives now, "" when it is gone.
	StartName string
	// Missing are the mapped columns (Source.Columns) the table lacks.
	Missing []string
}

// SchemaProblem says which mapped columns the table lacks, or "".
func (m Membership) SchemaProblem(src Source) string {
	if len(m.Missing) == 0 || m.RelID == 0 {
		return ""
	}
	return decode.MissingColumns(src.Schema, src.Table, m.Missing)
}

// LeftStream compares m, read now, with start, read when the connector
// started, and says why inserts into the outbox would no longer be decoded
// (PostgreSQL filters them by the publication as it was when they were
// written, so they cannot be read again after a fix), or "" when nothing
// changed.
func (m Membership) LeftStream(src Source, start Membership) string {
	pub, table := src.Publication, src.qualified()
	switch {
	case !m.Publication:
		return fmt.Sprintf("publication %s was dropped", pub)
	case m.PubOID != start.PubOID:
		return fmt.Sprintf("publication %s was dropped and created again (oid %d, was %d)", pub, m.PubOID, start.PubOID)
	case m.RelID == 0 && m.StartName != "":
		return fmt.Sprintf("outbox table %s was renamed to %s", table, m.StartName)
	case m.RelID == 0:
		return fmt.Sprintf("outbox table %s was dropped", table)
	case m.RelID != start.RelID && m.StartName != "":
		return fmt.Sprintf("outbox table %s was renamed to %s and another table took its name", table, m.StartName)
	case m.RelID != start.RelID:
		return fmt.Sprintf("outbox table %s was dropped and created again (oid %d, was %d)", table, m.RelID, start.RelID)
	case !m.Member:
		return fmt.Sprintf("outbox table %s was removed from publication %s", table, pub)
	case m.PubRelID != start.PubRelID:
		return fmt.Sprintf("outbox table %s was removed from publication %s and added again", table, pub)
	case !m.PubInsert:
		return fmt.Sprintf("publication %s no longer publishes inserts", pub)
	case m.Partitioned && !m.ViaRoot:
		return fmt.Sprintf("publication %s no longer has publish_via_partition_root", pub)
	case m.PubXmin != start.PubXmin:
		// Its options may have left inserts out for a while and come back.
		return fmt.Sprintf("publication %s was altered (ALTER PUBLICATION ... SET)", pub)
	}
	return ""
}

// Watch reads the outbox table's publication membership on a connection of
// its own. Use it from one goroutine.
type Watch struct {
	src   Source
	conn  *pgx.Conn
	conns uint64 // connections opened
}

// NewWatch returns a Watch; it connects on first use and after errors.
func NewWatch(src Source) *Watch { return &Watch{src: src} }

// Snapshot is one membership reading with the position it vouches for.
type Snapshot struct {
	Membership
	// Before is the server's WAL position read just before the membership:
	// every transaction that committed before it is visible to the reading,
	// barring a commit caught between its WAL record and its visibility.
	Before lsn.LSN
	// Xmin is the reading's snapshot xmin (a full 64-bit transaction id):
	// every transaction below it had ended when the membership was read.
	Xmin uint64
	// After is the WAL insert position read after the snapshot (on a
	// standby, the replay position: what its snapshot saw replayed): every
	// transaction below Xmin committed before it, so every transaction
	// that commits after After has an id at or above Xmin (a floor).
	After lsn.LSN
	// Running are the transactions in progress at the reading (the
	// snapshot's xip list, cluster-wide): a commit written before Before
	// that the reading did not see is one of them.
	Running []uint64
	// Xmax is the snapshot's xmax (full): an id at or above it had not
	// ended at the reading.
	Xmax uint64
	// Holders are the ids holding their own lock after the snapshot and
	// before After, subtransactions' included, which Running does not list
	// (PG docs, "pg_locks": every transaction holds an exclusive lock on its
	// id until it ends); nil when not read, and on a standby, whose pg_locks
	// lists none of the primary's. An id below Xmax in neither had ended
	// before After.
	Holders []uint64
}

// ended reports whether transaction x had ended at s.
func (s Snapshot) ended(x uint64) bool {
	return x < s.Xmin || x < s.Xmax && !slices.Contains(s.Running, x)
}

// Settled reports whether every transaction running at s had ended when
// later was read: then later, which saw them all end, vouches for every
// commit before s.Before.
func (s Snapshot) Settled(later Snapshot) bool {
	for _, x := range s.Running {
		if x >= later.Xmin && slices.Contains(later.Running, x) {
			return false
		}
	}
	return true
}

// Read returns the membership now. startRel is the OID the outbox had at
// start (zero on the first reading).
func (w *Watch) Read(ctx context.Context, startRel uint32) (Snapshot, error) {
	return w.read(ctx, startRel, false)
}

// read is Read, with the lock holders (Snapshot.Holders) when holders.
func (w *Watch) read(ctx context.Context, startRel uint32, holders bool) (Snapshot, error) {
	if w.conn == nil || w.conn.IsClosed() {
		c, err := w.src.DB.connect(ctx)
		if err != nil {
			return Snapshot{}, fmt.Errorf("connect: %w", classify(err))
		}
		w.conn = c
		w.conns++
	}
	s, err := readMembership(ctx, w.conn, w.src, startRel, holders)
	if err != nil {
		w.Close()
	}
	return s, err
}

// Close releases the connection.
func (w *Watch) Close() {
	if w.conn != nil {
		w.conn.Close(context.Background())
		w.conn = nil
	}
}

// lockHolders lists the full ids holding their own lock (Snapshot.Holders),
// read before the insert position that follows it in the reading's
// columns; only when asked ($6): pg_locks takes every lock partition, and
// the guard asks about once a second (holdersEvery). A 32-bit id is made full against the snapshot's xmax, within
// 2^31 either side (a running id can be above it; outboxLockHolders).
const lockHolders = `(CASE WHEN pg_is_in_recovery() OR NOT $6 THEN NULL ELSE ARRAY(
		SELECT DISTINCT r.ref + (((l.transactionid::text::bigint - (r.ref & 4294967295) + 2147483648) & 4294967295) - 2147483648)
		FROM pg_locks l, (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS ref) r
		WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted) END)`

func readMembership(ctx context.Context, conn *pgx.Conn, src Source, startRel uint32, holders bool) (Snapshot, error) {
	var s Snapshot
	// Two statements: the second one's snapshot is taken after the first
	// read the WAL position, so it sees what committed before it.
	if err := conn.QueryRow(ctx, "SELECT "+walPosition).Scan(&s.Before); err != nil {
		return s, fmt.Errorf("read wal position: %w", err)
	}
	// The table is found by name in the statement's snapshot, as its
	// columns and its old name are: to_regclass would look the name up in
	// the catalog's newer snapshot, and a table dropped in between would
	// then read as renamed (to its own name). pg_publication_tables still
	// reads the catalog's snapshot; Guard.Check reads again before it
	// believes a finding.
	var relID, pubRelID *uint32
	var relkind, startName *string
	var pubXmin int64
	err := conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
		ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) x),
		p.oid IS NOT NULL, coalesce(p.oid, 0), coalesce(p.xmin::text::bigint, 0),
		pg_snapshot_xmax(pg_current_snapshot())::text::bigint, `+lockHolders+`,
		(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END),
		coalesce(p.pubinsert, false), coalesce(p.pubviaroot, false),
		c.oid, c.relkind::text,
		(SELECT pr.oid FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid),
		EXISTS (SELECT 1 FROM pg_publication_tables t WHERE t.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3),
		(SELECT n.nspname || '.' || s.relname FROM pg_class s JOIN pg_namespace n ON n.oid = s.relnamespace WHERE s.oid = $4),
		ARRAY(SELECT x FROM unnest($5::text[]) x WHERE c.oid IS NOT NULL AND NOT EXISTS
			(SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = x AND a.attnum > 0 AND NOT a.attisdropped))
		FROM (SELECT 1) one
		LEFT JOIN pg_publication p ON p.pubname = $1
		LEFT JOIN (pg_class c JOIN pg_namespace cn ON cn.oid = c.relnamespace)
			ON cn.nspname = $2 AND c.relname = $3`,
		src.Publication, src.Schema, src.Table, startRel, src.Columns, holders).
		Scan(&s.Xmin, &s.Running, &s.Publication, &s.PubOID, &pubXmin, &s.Xmax, &s.Holders, &s.After, &s.PubInsert, &s.ViaRoot, &relID, &relkind, &pubRelID, &s.Member, &startName, &s.Missing)
	if err != nil {
		return s, fmt.Errorf("read publication membership: %w", err)
	}
	s.PubXmin = uint32(pubXmin)
	if relID != nil {
		s.RelID = *relID
	}
	if pubRelID != nil {
		s.PubRelID = *pubRelID
	}
	s.Partitioned = relkind != nil && *relkind == "p"
	if startName != nil && (startRel != s.RelID || s.RelID == 0) {
		s.StartName = *startName
	}
	return s, nil
}

// errNotPublished is wrapped by LeftStream failures turned into errors.
var errNotPublished = errors.New("outbox table left the stream")

// LeftStreamError is the fatal error for an outbox whose inserts stopped
// being decoded.
func LeftStreamError(src Source, why string, verified lsn.LSN, backfill bool) error {
	fix := fmt.Sprintf("restore it (CREATE or RENAME the table back to %s, then ALTER PUBLICATION %s ADD TABLE %s "+
		"if it is missing), or point outbox.table (or its outbox.tables entry) at the new table, and restart",
		src.qualified(), pgx.Identifier{src.Publication}.Sanitize(), src.qualified())
	tail := fmt.Sprintf("nothing after %v was confirmed; ", verified)
	if backfill {
		tail += "on restart the rows written while the table was outside the publication are read from the table and published"
	} else {
		tail += "rows written while the table was outside the publication are not in the WAL stream and, with " +
			"checkpoint.store none, cannot be backfilled: republish them from the table"
	}
	return &fault.FatalError{Reason: "outbox_left_stream", Err: fmt.Errorf("%w: %s; %s; %s", errNotPublished, why, fix, tail)}
}

// copyCovers checks the result of pg_copy_logical_replication_slot: the
// copy's position (PG docs 9.27.6: the copy starts at the source slot's
// confirmed position) must not be after from.
func copyCovers(res []*pgconn.Result, slot string, from lsn.LSN) error {
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 2 {
		return fatalf("copy slot %s: unexpected result", slot)
	}
	pos, err := lsn.Parse(string(res[0].Rows[0][1]))
	if err != nil {
		return fatalf("copy slot %s: %v", slot, err)
	}
	if pos > from {
		return &fault.PrerequisiteError{
			Problem: fmt.Sprintf("LSN %v is older than what slot %s retains: it moved to %v while the replay started", from, slot, pos),
			Fix:     fmt.Sprintf("the oldest replayable LSN is now %v; keep a longer window with postgres.retain", pos),
		}
	}
	return nil
}
