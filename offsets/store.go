package offsets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Checkpoint is the durable acknowledged position of one slot.
type Checkpoint struct {
	// LSN is the end of the last transaction fully acknowledged by Kafka.
	LSN lsn.LSN `json:"lsn"`
	// SnapshotDone is true once the initial backlog (snapshot.mode pending)
	// was fully acknowledged; false while one is in progress.
	SnapshotDone bool      `json:"snapshot_done"`
	UpdatedAt    time.Time `json:"updated_at"`
	// CommitTime is the commit time of the last transaction at or below LSN
	// as far as the connector knew it (zero if unknown): the events that a
	// lost slot could not deliver were committed after it.
	CommitTime time.Time `json:"commit_time,omitzero"`
	// Identity says where LSN is a position; zero in checkpoints written by
	// versions before it was recorded.
	Identity
	// RepairSince, when set, says that a lost slot may have left rows
	// created at or after it undelivered (the slot was created again over
	// this checkpoint): outbox retention keeps them until verify --repair
	// from at most this time clears it (ClearRepair). Saves keep the
	// earliest of the stored and the saved one; only ClearRepair removes it.
	RepairSince time.Time `json:"repair_since,omitzero"`
	// Mark is the history mark (replication/marks.go) that proves LSN is a
	// position of the server's history: the server that has it has the WAL
	// up to MarkAt, at or past LSN. Zero without one (PostgreSQL 13, older
	// versions): the start checks the WAL end only.
	Mark   uint64  `json:"mark,omitempty"`
	MarkAt lsn.LSN `json:"mark_at,omitempty"`
	// Floor bounds the transactions that commit after LSN: each has a
	// (64-bit) id at or above it (a snapshot's xmin read with the WAL at or
	// below LSN). Zero: unknown. A repair of what the stream could not
	// decode after LSN reads the rows of those transactions.
	Floor uint64 `json:"floor,omitempty"`
	// Stream is how each outbox table stood in the publication when LSN was
	// saved: a restart that finds it otherwise knows the stream may have
	// missed rows since, whatever it finds in place now.
	Stream []TableStream `json:"stream,omitempty"`
	// Clean: saved by a clean stop, which then wrote a last history mark and
	// had the slot confirm past it: the slot had consumed every write
	// before the stop (a slot pg_upgrade keeps, movedDatabase).
	Clean bool `json:"clean,omitempty"`
	// Gap, when set, records that the outbox table left the stream (removed
	// from the publication, dropped): the rows written since could not be
	// decoded and are read back from the table at the next start.
	Gap *Gap `json:"gap,omitempty"`
}

// TableStream is what decides whether an outbox table's inserts are
// decoded (replication.Membership): the table's OID, the publication's
// OID and row version (its xmin: ALTER PUBLICATION ... SET changes it), and
// the pg_publication_rel row that makes the table a member (zero for FOR
// ALL TABLES or TABLES IN SCHEMA).
type TableStream struct {
	Table    string `json:"table"`
	RelID    uint32 `json:"relid"`
	PubOID   uint32 `json:"pub_oid"`
	PubXmin  uint32 `json:"pub_xmin"`
	PubRelID uint32 `json:"pub_rel_oid,omitempty"`
	// Xmin bounds the rows a change after this state could have kept from
	// the stream: each was written by a transaction at or above it (the
	// guard's bound, replication.Guard.Xmin, when the state was saved).
	Xmin uint64 `json:"xmin"`
	// Verified is where every transaction below Xmin had ended (the
	// guard's Verified read with it, replication.Ended); zero: unknown (a
	// checkpoint of an older version, or saved before the guard vouched).
	Verified lsn.LSN `json:"verified,omitempty"`
}

// Gap is where the rows the stream could not decode begin: no position
// after Since was confirmed, and every such row was written by a
// transaction whose (64-bit) id is at least Xmin.
type Gap struct {
	Since lsn.LSN `json:"since"`
	Xmin  uint64  `json:"xmin"`
	// Repaired are rows an earlier repair of the gap published or found
	// in Kafka already: the repair leaves them out.
	Repaired RepairedRows `json:"repaired,omitzero"`
	// Pending is a repair handed over to Kafka when the gap's later part
	// was found: it holds its rows only if its transaction committed.
	Pending PendingRepair `json:"pending,omitzero"`
	// LookUp: rows of the gap may be in Kafka from a repair whose rows are
	// not recorded; the repair looks each up before it publishes it.
	LookUp bool `json:"look_up,omitempty"`
	// Finished are transactions that had ended before Since: the repair
	// leaves them out.
	Finished FinishedTxns `json:"finished,omitzero"`
}

// FinishedTxns are the transactions that had ended at a reading whose
// insert position (replication.Snapshot.After) is at or before a gap's
// Since: every id below Xmax but those in Open (the reading's running
// transactions and every id holding its own lock then, subtransactions
// included; ascending, comma-separated). Each committed before Since, with
// the table in the publication, so the stream decodes it again or
// delivered it before its start; read again by the repair of the gap, its
// rows went as copies, behind newer rows the stream had replayed. Zero:
// unknown (nothing is left out).
type FinishedTxns struct {
	Xmax uint64 `json:"xmax,omitempty"`
	Open string `json:"open,omitempty"`
}

// IsZero reports an unknown reading.
func (f FinishedTxns) IsZero() bool { return f.Xmax == 0 }

// RepairedRows are the rows a gap repair read from the table (with those
// of the repairs before it): every row of a transaction whose (64-bit) id
// is in [Xmin, Below), which had all ended when it read (Below is its
// snapshot's xmin; a subtransaction's id is above its parent's, so it
// ended too), and the rows of the ids listed in Xids (at or above Below,
// ascending, comma-separated; left out past maxRepairedXids: those rows
// are read again, copies, never a loss). The read's snapshot itself is not
// kept: its running list names no subtransaction, and on a standby none.
// Zero: none.
type RepairedRows struct {
	Xmin  uint64 `json:"xmin,omitempty"`
	Below uint64 `json:"below,omitempty"`
	Xids  string `json:"xids,omitempty"`
}

// MaxRepairedXids bounds RepairedRows.Xids (about 10 bytes each, saved with
// every checkpoint while a gap is recorded).
const MaxRepairedXids = 10000

// IsZero reports no rows.
func (r RepairedRows) IsZero() bool { return r.Below == 0 && r.Xids == "" }

// JoinXids is the Xids text of ids (ascending, no repeats).
func JoinXids(ids []int64) string {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	f := make([]string, len(ids))
	for i, x := range ids {
		f[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(f, ",")
}

// SplitXids reads Xids text back (an unparsable entry is dropped: its rows
// are read again).
func SplitXids(text string) []int64 {
	var ids []int64
	for _, f := range strings.Split(text, ",") {
		if x, err := strconv.ParseInt(f, 10, 64); err == nil {
			ids = append(ids, x)
		}
	}
	return ids
}

// Has reports whether a row written by transaction xid is among the rows.
func (r RepairedRows) Has(xid uint64) bool {
	if xid >= r.Xmin && xid < r.Below {
		return true
	}
	for _, f := range strings.Split(r.Xids, ",") {
		if f == strconv.FormatUint(xid, 10) {
			return true
		}
	}
	return false
}

// PendingRepair is a repair whose Kafka transaction ends at End: committed
// at or past End, Kafka holds Rows, and the gap needs only the rows of
// transactions from Later on (the bound of the part found after it).
type PendingRepair struct {
	Rows  RepairedRows `json:"rows,omitzero"`
	End   lsn.LSN      `json:"end,omitempty"`
	Later uint64       `json:"later,omitempty"`
}

// Identity is what a WAL position belongs to: a position means nothing on
// another cluster, on a timeline that forked before it, or for another
// database or slot.
type Identity struct {
	SystemID string `json:"system_id,omitempty"` // database system identifier
	Timeline int32  `json:"timeline,omitempty"`
	Database string `json:"database,omitempty"`
	Slot     string `json:"slot,omitempty"`
}

// IsZero reports a checkpoint written without identity (an older version).
func (i Identity) IsZero() bool { return i.SystemID == "" }

// ErrNoCheckpoint is returned by Load on the first run.
var ErrNoCheckpoint = errors.New("no checkpoint saved yet")

// ErrStale is returned by Save when the store holds a later position of the
// same identity, written by another connector on the slot (a standby that
// started before the active one moved on must not move it back).
var ErrStale = errors.New("a later checkpoint of this slot is stored")

// FileStore keeps the checkpoint in a local file, replaced atomically.
type FileStore struct{ path string }

// NewFileStore returns a store at path; a missing file means "first run".
func NewFileStore(path string) *FileStore { return &FileStore{path: path} }

// Forget is what an operator does to drop the checkpoint.
func (s *FileStore) Forget() string { return "remove the file " + s.path }

// Load reads the checkpoint file.
func (s *FileStore) Load(context.Context) (Checkpoint, error) {
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return Checkpoint{}, ErrNoCheckpoint
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint file: %w", err)
	}
	var c Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint file %s is corrupt (%w); remove it to start from the slot's position", s.path, err)
	}
	return c, nil
}

// Save writes c unless the file holds a later position of the same identity
// (ErrStale). Two processes sharing one file can still race; the table
// store is the one for active/standby.
func (s *FileStore) Save(ctx context.Context, c Checkpoint) error {
	cur, err := s.Load(ctx)
	if err == nil && cur.Identity == c.Identity && cur.LSN > c.LSN {
		return ErrStale
	}
	return s.write(keepHold(c, cur, err))
}

// Replace writes the checkpoint whatever the file holds, but for its
// repair hold (EarliestHold).
func (s *FileStore) Replace(ctx context.Context, c Checkpoint) error {
	cur, err := s.Load(ctx)
	return s.write(keepHold(c, cur, err))
}

// keepHold is c with the earlier of its repair hold and the stored one
// (cur, loaded with err).
func keepHold(c, cur Checkpoint, err error) Checkpoint {
	if err == nil {
		c.RepairSince = EarliestHold(cur.RepairSince, c.RepairSince)
	}
	return c
}

// ClearRepair removes the repair hold when a repair from since covered it,
// and reports whether one was removed.
func (s *FileStore) ClearRepair(ctx context.Context, since time.Time) (bool, error) {
	cur, err := s.Load(ctx)
	if err != nil || cur.RepairSince.IsZero() || since.After(cur.RepairSince) {
		return false, ignoreNone(err)
	}
	cur.RepairSince = time.Time{}
	return true, s.write(cur)
}

// write stores c durably: temp file, fsync, rename, fsync of the
// directory, so a crash leaves either the old or the new file, whole.
func (s *FileStore) write(c Checkpoint) error {
	c.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
	f, err := os.CreateTemp(dir, filepath.Base(s.path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("checkpoint file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("checkpoint file: write: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("checkpoint file: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("checkpoint file: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("checkpoint file: rename: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("checkpoint file: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("checkpoint file: fsync dir: %w", err)
	}
	return nil
}

// Close does nothing; it completes the store interface.
func (s *FileStore) Close() {}

// EarliestHold is the earlier of two repair holds, zero meaning none.
func EarliestHold(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// ignoreNone is err, except that no checkpoint is no error.
func ignoreNone(err error) error {
	if errors.Is(err, ErrNoCheckpoint) {
		return nil
	}
	return err
}
