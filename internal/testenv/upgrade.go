package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// EnvPGFullDir names the directory holding complete PostgreSQL
// installations, one per major version: <dir>/<major>/bin with pg_upgrade
// and the client tools it runs. Default: <repo root>/.cache/postgres-full,
// which scripts/fetch-pg-upgrade.sh (make pg-upgrade-binaries) fills.
const EnvPGFullDir = "OUTBOX_CDC_PG_FULL_DIR"

// upgradeTools are what pg_upgrade runs from the old and the new bindir
// (PG docs, pg_upgrade; src/bin/pg_upgrade/exec.c check_bin_dir).
var upgradeTools = []string{"initdb", "postgres", "pg_ctl", "pg_controldata", "pg_upgrade", "pg_dump", "pg_dumpall",
	"pg_restore", "pg_resetwal", "psql", "vacuumdb"}

// UpgradeBinDir returns the bin directory of the complete installation of
// PostgreSQL major, or an error naming what is missing and how to fetch
// it: the version matrix's server binaries (scripts/fetch-postgres.sh) have
// no pg_upgrade.
func UpgradeBinDir(major int) (string, error) {
	base := os.Getenv(EnvPGFullDir)
	if base == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		base = filepath.Join(root, ".cache", "postgres-full")
	}
	dir := filepath.Join(base, strconv.Itoa(major), "bin")
	var missing []string
	for _, tool := range upgradeTools {
		if fi, err := os.Stat(filepath.Join(dir, tool)); err != nil || fi.IsDir() {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("PostgreSQL %d with pg_upgrade: %s lacks %s; fetch it with `make pg-upgrade-binaries` "+
			"(scripts/fetch-pg-upgrade.sh) or set %s", major, dir, strings.Join(missing, ", "), EnvPGFullDir)
	}
	if got := binMajor(dir); got != major {
		return "", fmt.Errorf("%s/postgres is PostgreSQL %d, want %d", dir, got, major)
	}
	return dir, nil
}

// StartPostgresIn is StartPostgres with the binaries in binDir, for a test
// that needs a cluster of a version other than the suite's. It ignores
// OUTBOX_CDC_TEST_PG_DSN: the cluster is always managed.
func StartPostgresIn(ctx context.Context, binDir string, opts PostgresOptions) (*Postgres, error) {
	if !hasPGServer(binDir) {
		return nil, fmt.Errorf("start postgres: %s has no initdb and postgres", binDir)
	}
	pg := &Postgres{binDir: binDir, closing: newCloseSignal(), tls: opts.TLS}
	if err := pg.init(ctx, opts); err != nil {
		pg.Close()
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	return pg, nil
}

// UpgradeOptions configures Upgrade.
type UpgradeOptions struct {
	// Link runs pg_upgrade --link (hard links: the old cluster must not be
	// started once the new one has); the default copies the files.
	Link bool
	// Settings are the new cluster's postgresql.conf settings over the
	// harness defaults (wal_level=logical, max_replication_slots=32, ...).
	Settings map[string]string
}

// UpgradeError is a pg_upgrade run that failed; Output is what it printed
// (its checks name the slots they refuse) and the logs it kept.
type UpgradeError struct {
	Output string
	Err    error
}

func (e *UpgradeError) Error() string { return fmt.Sprintf("pg_upgrade: %v\n%s", e.Err, e.Output) }
func (e *UpgradeError) Unwrap() error { return e.Err }

// CheckUpgrade runs pg_upgrade --check from old, stopped first, to a new
// cluster of newBinDir's version initialised for the check and removed
// after it: what an operator runs before an upgrade. It returns
// pg_upgrade's output; a failed check is an *UpgradeError.
func CheckUpgrade(ctx context.Context, old *Postgres, newBinDir string, opts UpgradeOptions) (string, error) {
	nw, err := prepareUpgrade(ctx, old, newBinDir, opts)
	if nw != nil {
		defer nw.Close()
	}
	if err != nil {
		return "", err
	}
	return nw.pgUpgrade(ctx, old, "--check")
}

// Upgrade runs pg_upgrade from old (stopped first) to a new cluster of
// newBinDir's version, and starts the new one on old's port: old's DSNs
// reach it. It returns the new cluster and pg_upgrade's output; a failed
// run is an *UpgradeError. Old keeps its directory until closed; after
// Link it must not be started again.
func Upgrade(ctx context.Context, old *Postgres, newBinDir string, opts UpgradeOptions) (*Postgres, string, error) {
	nw, err := prepareUpgrade(ctx, old, newBinDir, opts)
	if err != nil {
		if nw != nil {
			nw.Close()
		}
		return nil, "", err
	}
	mode := "--copy"
	if opts.Link {
		mode = "--link"
	}
	out, err := nw.pgUpgrade(ctx, old, mode)
	if err != nil {
		nw.Close()
		return nil, out, err
	}
	if err := nw.start(ctx); err != nil {
		nw.Close()
		return nil, out, fmt.Errorf("start upgraded cluster: %w", err)
	}
	if nw.version, err = queryVersion(ctx, nw.DSN("postgres")); err != nil {
		nw.Close()
		return nil, out, fmt.Errorf("upgraded cluster: %w", err)
	}
	return nw, out, nil
}

// prepareUpgrade stops old and initialises, without starting it, a new
// cluster of newBinDir's version on old's port, with old's encoding,
// locale and checksum setting, as pg_upgrade requires.
func prepareUpgrade(ctx context.Context, old *Postgres, newBinDir string, opts UpgradeOptions) (*Postgres, error) {
	if old.external != "" {
		return nil, fmt.Errorf("upgrade: %w", ErrExternal)
	}
	if err := old.Stop(ctx); err != nil {
		return nil, fmt.Errorf("upgrade: %w", err)
	}
	nw := &Postgres{cred: old.cred, tls: old.tls, port: old.port, closing: newCloseSignal()}
	var err error
	if nw.binDir, err = reachableBinDir(newBinDir, old.cred); err != nil {
		return nil, fmt.Errorf("upgrade: %w", err)
	}
	if nw.baseDir, err = os.MkdirTemp(filepath.Dir(old.baseDir), "outbox-pg-upgraded-"); err != nil {
		return nil, fmt.Errorf("upgrade: %w", err)
	}
	if err := nw.chown(nw.baseDir); err != nil {
		return nw, fmt.Errorf("upgrade: %w", err)
	}
	nw.dataDir = filepath.Join(nw.baseDir, "data")
	nw.logPath = filepath.Join(nw.baseDir, "postgres.log")
	checksums, err := old.dataChecksums(ctx)
	if err != nil {
		return nw, fmt.Errorf("upgrade: %w", err)
	}
	if err := nw.initdbLike(ctx, checksums); err != nil {
		return nw, fmt.Errorf("upgrade: %w", err)
	}
	if err := nw.writeConfig(opts.Settings); err != nil {
		return nw, fmt.Errorf("upgrade: %w", err)
	}
	return nw, nil
}

var checksumRE = regexp.MustCompile(`(?m)^Data page checksum version:\s+(\d+)`)

// dataChecksums reads from pg_controldata whether the stopped cluster
// has data checksums: initdb turns them on by default from PostgreSQL 18
// on, and pg_upgrade refuses a new cluster that differs from the old one.
func (pg *Postgres) dataChecksums(ctx context.Context) (bool, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(pg.binDir, "pg_controldata"), "-D", pg.dataDir).CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("pg_controldata: %w\n%s", err, out)
	}
	m := checksumRE.FindSubmatch(out)
	if m == nil {
		return false, fmt.Errorf("pg_controldata printed no checksum version:\n%s", out)
	}
	return string(m[1]) != "0", nil
}

// initdbLike is initdb with the harness's settings (Postgres.initdb) and
// the checksum setting given.
func (pg *Postgres) initdbLike(ctx context.Context, checksums bool) error {
	args := []string{"-D", pg.dataDir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"}
	major := binMajor(pg.binDir)
	switch {
	case checksums:
		args = append(args, "--data-checksums")
	case major >= 18:
		args = append(args, "--no-data-checksums")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(pg.binDir, "initdb"), args...)
	cmd.Dir = pg.baseDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return nil
}

// pgUpgrade runs the new cluster's pg_upgrade from old to it, as the
// server's OS user (pg_upgrade refuses root) in the new cluster's base
// directory (it needs a writable working directory, and puts its sockets
// there). Both servers it starts listen on private ports.
func (nw *Postgres) pgUpgrade(ctx context.Context, old *Postgres, mode string) (string, error) {
	ports, err := FreePorts(2)
	if err != nil {
		return "", err
	}
	args := []string{mode, "-b", old.binDir, "-B", nw.binDir, "-d", old.dataDir, "-D", nw.dataDir, "-U", "postgres",
		"-p", strconv.Itoa(ports[0]), "-P", strconv.Itoa(ports[1]), "-s", nw.baseDir}
	cmd := exec.CommandContext(ctx, filepath.Join(nw.binDir, "pg_upgrade"), args...)
	cmd.Dir = nw.baseDir
	// PGHOST and friends of the caller would point its connections elsewhere.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nw.cred, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), &UpgradeError{Output: string(out) + upgradeLogs(nw.dataDir), Err: err}
	}
	return string(out), nil
}

// upgradeLogs is the text of the files a failed pg_upgrade keeps in
// pg_upgrade_output.d (the slots it refuses, the server logs), the tail
// of each.
func upgradeLogs(dataDir string) string {
	var files []string
	_ = filepath.WalkDir(filepath.Join(dataDir, "pg_upgrade_output.d"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return nil
	})
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", f, tailFile(f, 20))
	}
	return b.String()
}

// IsUpgradeError reports whether err is a pg_upgrade run that failed, and
// returns it.
func IsUpgradeError(err error) (*UpgradeError, bool) {
	var ue *UpgradeError
	ok := errors.As(err, &ue)
	return ue, ok
}

// WALDump prints, with pg_waldump from the server's bin directory, the WAL
// records of the stopped server from start (an LSN such as "0/1882F30")
// to the end of its WAL: what lies after a slot's confirmed_flush_lsn when
// pg_upgrade says the slot "has not consumed the WAL yet".
func (pg *Postgres) WALDump(ctx context.Context, start string) (string, error) {
	if pg.external != "" {
		return "", ErrExternal
	}
	tool := filepath.Join(pg.binDir, "pg_waldump")
	out, err := exec.CommandContext(ctx, tool, "-p", filepath.Join(pg.dataDir, "pg_wal"), "-s", start).CombinedOutput()
	if err != nil && len(out) == 0 {
		return "", fmt.Errorf("pg_waldump: %w", err)
	}
	// It exits 1 at the end of the WAL ("invalid record length"): the
	// records before that are the answer.
	return string(out), nil
}
