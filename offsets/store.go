package offsets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

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
}

// ErrNoCheckpoint is returned by Load on the first run.
var ErrNoCheckpoint = errors.New("no checkpoint saved yet")

// TableStore keeps checkpoints in a table of the source database, one row
// per slot, so they live and fail over with the data they describe.
type TableStore struct {
	dsn, slot string
	table     string // quoted schema.table
	schema    string
	conn      *pgx.Conn
}

// NewTableStore returns a store in table ("schema.table") for slot. The
// connection is opened on first use and reopened after an error.
func NewTableStore(dsn, table, slot string) *TableStore {
	schema, name, _ := strings.Cut(table, ".")
	return &TableStore{dsn: dsn, slot: slot, schema: pgx.Identifier{schema}.Sanitize(),
		table: pgx.Identifier{schema, name}.Sanitize()}
}

func (s *TableStore) connect(ctx context.Context) (*pgx.Conn, error) {
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return nil, fmt.Errorf("checkpoint store: connect: %w", err)
	}
	ddl := fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %s;
		CREATE TABLE IF NOT EXISTS %s (
			slot          text        PRIMARY KEY,
			lsn           pg_lsn      NOT NULL,
			snapshot_done boolean     NOT NULL DEFAULT false,
			updated_at    timestamptz NOT NULL DEFAULT now())`, s.schema, s.table)
	if _, err := conn.Exec(ctx, ddl); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("checkpoint store: create %s (grant CREATE on the database, or create it yourself: see docs/operations.md): %w", s.table, err)
	}
	s.conn = conn
	return conn, nil
}

// Load returns the slot's checkpoint, or ErrNoCheckpoint.
func (s *TableStore) Load(ctx context.Context) (Checkpoint, error) {
	conn, err := s.connect(ctx)
	if err != nil {
		return Checkpoint{}, err
	}
	var c Checkpoint
	var l string
	err = conn.QueryRow(ctx, fmt.Sprintf("SELECT lsn::text, snapshot_done, updated_at FROM %s WHERE slot = $1", s.table), s.slot).
		Scan(&l, &c.SnapshotDone, &c.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Checkpoint{}, ErrNoCheckpoint
	}
	if err != nil {
		s.reset(ctx)
		return Checkpoint{}, fmt.Errorf("checkpoint store: load: %w", err)
	}
	if c.LSN, err = lsn.Parse(l); err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint store: %w", err)
	}
	return c, nil
}

// Save upserts the slot's checkpoint; it is durable when Save returns (the
// row is committed with the server's synchronous_commit).
func (s *TableStore) Save(ctx context.Context, c Checkpoint) error {
	conn, err := s.connect(ctx)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot, lsn, snapshot_done, updated_at) VALUES ($1, $2::text::pg_lsn, $3, now())
		ON CONFLICT (slot) DO UPDATE SET lsn = excluded.lsn, snapshot_done = excluded.snapshot_done, updated_at = now()`, s.table),
		s.slot, c.LSN.String(), c.SnapshotDone)
	if err != nil {
		s.reset(ctx)
		return fmt.Errorf("checkpoint store: save: %w", err)
	}
	return nil
}

func (s *TableStore) reset(ctx context.Context) {
	if s.conn != nil {
		s.conn.Close(context.WithoutCancel(ctx))
		s.conn = nil
	}
}

// Close releases the connection.
func (s *TableStore) Close() { s.reset(context.Background()) }

// FileStore keeps the checkpoint in a local file, replaced atomically.
type FileStore struct{ path string }

// NewFileStore returns a store at path; a missing file means "first run".
func NewFileStore(path string) *FileStore { return &FileStore{path: path} }

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

// Save writes the checkpoint durably: temp file, fsync, rename, fsync of the
// directory, so a crash leaves either the old or the new file, whole.
func (s *FileStore) Save(_ context.Context, c Checkpoint) error {
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
