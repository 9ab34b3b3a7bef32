package testenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configures StartStandby.
type StandbyOptions struct {
	// Slot is the physical replication slot the standby streams from,
	// created on the primary; default "standby_<port>".
	Slot string
	// Settings are postgresql.conf settings of the standby, over the
	// primary's and over the standby settings StartStandby writes.
	Settings map[string]string
	// NoSyncStandbySlots leaves the primary's synchronized_standby_slots
	// alone (PostgreSQL 17+); by default it is set to Slot, so logical
	// walsenders of failover slots never send a change the standby lacks.
	NoSyncStandbySlots bool
}

// StartStandby makes a physical hot standby of primary and starts it:
// a low-level base backup (PG docs 26.3.3, "Making a Base Backup Using the
// Low Level API"), which needs no pg_basebackup, then streaming from a
// physical slot on the primary. On PostgreSQL 17+ the standby synchronizes
// failover slots (sync_replication_slots, PG docs 47.2.3, "Replication Slot
// Synchronization"), which needs dbname in primary_conninfo and
// hot_standby_feedback. It returns once the standby streams from the slot.
func StartStandby(ctx context.Context, primary *Postgres, opts StandbyOptions) (*Postgres, error) {
	if primary.external != "" {
		return nil, fmt.Errorf("start standby: %w", ErrExternal)
	}
	sb := &Postgres{binDir: primary.binDir, cred: primary.cred, tls: primary.tls, closing: newCloseSignal()}
	if err := sb.initStandby(ctx, primary, opts); err != nil {
		sb.Close()
		return nil, fmt.Errorf("start standby: %w", err)
	}
	return sb, nil
}

func (sb *Postgres) initStandby(ctx context.Context, primary *Postgres, opts StandbyOptions) error {
	ports, err := FreePorts(1)
	if err != nil {
		return err
	}
	sb.port = ports[0]
	if opts.Slot == "" {
		opts.Slot = "standby_" + strconv.Itoa(sb.port)
	}
	if sb.baseDir, err = os.MkdirTemp(filepath.Dir(primary.baseDir), "outbox-pg-standby-"); err != nil {
		return err
	}
	if err := sb.chown(sb.baseDir); err != nil {
		return err
	}
	sb.dataDir = filepath.Join(sb.baseDir, "data")
	sb.logPath = filepath.Join(sb.baseDir, "postgres.log")

	conn, err := pgx.Connect(ctx, primary.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("connect to primary: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	major, err := serverMajor(ctx, conn)
	if err != nil {
		return err
	}
	// Reserve WAL first: the copy holds no WAL, so the standby streams
	// everything from the backup's start on through this slot.
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", opts.Slot); err != nil {
		return fmt.Errorf("create physical slot %s: %w", opts.Slot, err)
	}
	if err := sb.baseBackup(ctx, conn, primary, major); err != nil {
		return err
	}
	settings := map[string]string{
		"primary_conninfo": fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s sslmode=disable",
			primary.port, opts.Slot),
		"primary_slot_name":    opts.Slot,
		"hot_standby":          "on",
		"hot_standby_feedback": "on",
	}
	if major >= 17 {
		settings["sync_replication_slots"] = "on"
	}
	maps.Copy(settings, opts.Settings)
	if err := sb.writeConfig(settings); err != nil {
		return err
	}
	signal := filepath.Join(sb.dataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return err
	}
	if err := sb.chown(signal); err != nil {
		return err
	}
	if err := sb.start(ctx); err != nil {
		return err
	}
	if sb.version, err = queryVersion(ctx, sb.DSN("postgres")); err != nil {
		return err
	}
	if err := waitSlotActive(ctx, conn, opts.Slot); err != nil {
		return withLog(err, sb.logPath)
	}
	// Set only now: the copy must not inherit it, or the standby, once
	// promoted, would wait for a slot of its own that no one uses.
	if major >= 17 && !opts.NoSyncStandbySlots {
		if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronized_standby_slots = "+quote(opts.Slot)); err != nil {
			return fmt.Errorf("set synchronized_standby_slots: %w", err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			return fmt.Errorf("reload primary: %w", err)
		}
	}
	return nil
}

// baseBackup copies the primary's data directory between backup start and
// stop on one session (a non-exclusive backup ends with its session), and
// writes the backup_label (and tablespace_map) pg_backup_stop returns.
func (sb *Postgres) baseBackup(ctx context.Context, conn *pgx.Conn, primary *Postgres, major int) error {
	// pg_start_backup/pg_stop_backup were renamed in PostgreSQL 15 and lost
	// their exclusive mode; the third argument false asks for non-exclusive.
	start, stop := "SELECT pg_backup_start('outbox-cdc standby', true)", "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
	if major < 15 {
		start, stop = "SELECT pg_start_backup('outbox-cdc standby', true, false)", "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)"
	}
	if _, err := conn.Exec(ctx, start); err != nil {
		return fmt.Errorf("backup start: %w", err)
	}
	copyErr := sb.copyData(primary.dataDir)
	var label string
	var spcmap *string
	if err := conn.QueryRow(ctx, stop).Scan(&label, &spcmap); err != nil {
		return fmt.Errorf("backup stop: %w", errors.Join(err, copyErr))
	}
	if copyErr != nil {
		return fmt.Errorf("copy data directory: %w", copyErr)
	}
	files := map[string]string{"backup_label": label}
	if spcmap != nil && *spcmap != "" {
		files["tablespace_map"] = *spcmap
	}
	for name, content := range files {
		p := filepath.Join(sb.dataDir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			return err
		}
		if err := sb.chown(p); err != nil {
			return err
		}
	}
	return nil
}

// skipContents are the directories whose contents a base backup leaves
// out (PG docs 26.3.3: pg_wal, pg_replslot and the temporary state
// directories; the server recreates what it needs).
var skipContents = map[string]bool{
	"pg_wal": true, "pg_replslot": true, "pg_dynshmem": true, "pg_notify": true, "pg_serial": true,
	"pg_snapshots": true, "pg_stat_tmp": true, "pg_subtrans": true,
}

// skipFiles are files of the running primary a copy must not have.
var skipFiles = map[string]bool{"postmaster.pid": true, "postmaster.opts": true, "backup_label": true, "tablespace_map": true}

// copyData copies src into sb.dataDir, owned by the server user, modes kept.
func (sb *Postgres) copyData(src string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while copying (a temporary file); the WAL replay covers it
			}
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(sb.dataDir, rel)
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		top, _, _ := strings.Cut(rel, string(filepath.Separator))
		inside := skipContents[top] && rel != top
		switch {
		case d.IsDir():
			// pg_wal keeps its subdirectories (archive_status, summaries),
			// empty; the other skipped directories keep nothing.
			if inside && top != "pg_wal" {
				return fs.SkipDir
			}
			if err := os.Mkdir(dst, info.Mode().Perm()); err != nil {
				return err
			}
			return sb.chown(dst)
		case inside || (rel == top && skipFiles[rel]):
			return nil
		case !info.Mode().IsRegular():
			return nil // sockets, symlinked tablespaces: the harness makes none
		}
		return sb.copyFile(path, dst, info.Mode().Perm())
	})
}

// copyFile copies a file of the data directory (a missing one was removed
// by the server meanwhile) and gives it to the server's user.
func (sb *Postgres) copyFile(src, dst string, mode fs.FileMode) error {
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := copyFile(src, dst, mode); err != nil {
		return err
	}
	return sb.chown(dst)
}

// chown gives path to the server's OS user when the harness runs as root.
func (sb *Postgres) chown(path string) error {
	if sb.cred == nil {
		return nil
	}
	return os.Chown(path, int(sb.cred.Uid), int(sb.cred.Gid))
}

// waitSlotActive polls the primary until a walreceiver streams from slot.
func waitSlotActive(ctx context.Context, conn *pgx.Conn, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var active bool
		err := conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		if err == nil && active {
			return nil
		}
		if serr := sleepCtx(ctx, 50*time.Millisecond); serr != nil {
			return fmt.Errorf("standby not streaming from slot %s: %w (last error: %v)", slot, serr, err)
		}
	}
}

// Promote ends recovery on a standby (pg_promote, waiting for it) so it
// accepts writes on a new timeline.
func (pg *Postgres) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	if !ok {
		return withLog(errors.New("promote: not promoted within 60s"), pg.logPath)
	}
	return nil
}

// Major is the server's major version (17 for "17.6"), 0 if unknown.
func (pg *Postgres) Major() int {
	major, _, _ := strings.Cut(pg.version, ".")
	n, _ := strconv.Atoi(major)
	return n
}

func serverMajor(ctx context.Context, conn *pgx.Conn) (int, error) {
	var num int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		return 0, fmt.Errorf("read server version: %w", err)
	}
	return num / 10000, nil
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// CutReplication stops a standby's WAL receiver for good: primary_conninfo
// emptied, which PostgreSQL 13+ applies on reload (PG docs 20.6.3; the
// walreceiver restarts with the new value, and with none it does not
// start). The standby then lacks everything its primary commits from now
// on, as an asynchronous standby cut off by the network would; Promote
// still ends its recovery. It returns once no walreceiver runs.
func (pg *Postgres) CutReplication(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("cut replication: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("cut replication: %s: %w", q, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		if serr := sleepCtx(ctx, 20*time.Millisecond); serr != nil {
			return fmt.Errorf("cut replication: the walreceiver still runs: %w (last error: %v)", serr, err)
		}
	}
}
