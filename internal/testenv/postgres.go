package testenv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Environment variables understood by StartPostgres.
const (
	// EnvPGBinDir names the directory holding initdb and postgres.
	EnvPGBinDir = "OUTBOX_CDC_PG_BINDIR"
	// EnvPGDSN makes StartPostgres use an existing server instead of
	// starting one. The role must be allowed to create databases.
	EnvPGDSN = "OUTBOX_CDC_TEST_PG_DSN"
)

const pgInstallHint = "install the PostgreSQL server (apt-get install postgresql-15) " +
	"or set " + EnvPGBinDir + " to the directory holding initdb and postgres"

// PostgresOptions configures StartPostgres.
type PostgresOptions struct {
	// Settings are postgresql.conf settings added to, or overriding, the
	// harness defaults (wal_level=logical, fsync=off, ...).
	Settings map[string]string
	// TLS, when set, turns ssl on. Connections without TLS keep working for
	// every role but TLS.PasswordRoles.
	TLS *PostgresTLS
}

// PostgresTLS configures TLS for a managed server.
type PostgresTLS struct {
	// CertPEM is the server certificate (chain); for sslmode=verify-full it
	// must be valid for the host in the DSN (127.0.0.1; TestCA.ServerCert's
	// default is).
	CertPEM []byte
	// KeyPEM is its unencrypted private key.
	KeyPEM []byte
	// PasswordRoles are roles that may only connect over TLS and with a
	// password (scram-sha-256), by hostssl rules ahead of the trust rules;
	// without TLS they are rejected. The roles themselves are created by
	// the caller (CREATE ROLE ... LOGIN PASSWORD '...'). Names are
	// [a-z_][a-z0-9_]*.
	PasswordRoles []string
}

var pgRoleRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Postgres is a PostgreSQL server started by StartPostgres. Its methods are
// safe for concurrent use.
type Postgres struct {
	external string // DSN of an external server; empty when managed

	binDir  string
	baseDir string // temp dir: data dir, unix socket, logs
	dataDir string
	logPath string
	port    int
	cred    *syscall.Credential // non-nil when running as root
	version string
	tls     *PostgresTLS // nil: ssl off

	closing closeSignal // ends an in-flight Restart when Close is called
	mu      sync.Mutex
	proc    *process // nil before the first start
}

// StartPostgres initialises a fresh cluster in a temporary directory and
// starts a postmaster on a free loopback port, configured for logical
// replication. It returns once the server accepts connections. If
// OUTBOX_CDC_TEST_PG_DSN is set it returns a handle to that server instead.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	if dsn := os.Getenv(EnvPGDSN); dsn != "" {
		if opts.TLS != nil {
			return nil, fmt.Errorf("start postgres: TLS needs a managed server, but %s is set: %w", EnvPGDSN, ErrExternal)
		}
		return startExternalPostgres(ctx, dsn)
	}
	binDir, err := FindPostgresBinDir()
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if t := opts.TLS; t != nil {
		if len(t.CertPEM) == 0 || len(t.KeyPEM) == 0 {
			return nil, errors.New("start postgres: TLS needs CertPEM and KeyPEM")
		}
		for _, r := range t.PasswordRoles {
			if !pgRoleRE.MatchString(r) {
				return nil, fmt.Errorf("start postgres: TLS password role %q: use [a-z_][a-z0-9_]*", r)
			}
		}
	}
	pg := &Postgres{binDir: binDir, closing: newCloseSignal(), tls: opts.TLS}
	if err := pg.init(ctx, opts); err != nil {
		pg.Close()
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	return pg, nil
}

func startExternalPostgres(ctx context.Context, dsn string) (*Postgres, error) {
	pg := &Postgres{external: dsn}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("start postgres: parse %s: %w", EnvPGDSN, err)
	}
	pg.port = int(cfg.Port)
	if pg.version, err = queryVersion(ctx, dsn); err != nil {
		return nil, fmt.Errorf("start postgres: external server %s: %w", EnvPGDSN, err)
	}
	return pg, nil
}

func (pg *Postgres) init(ctx context.Context, opts PostgresOptions) error {
	// initdb and postgres refuse to run as root, so drop to the postgres OS
	// user, which must then own the data dir and be able to reach it.
	parent := os.TempDir()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("running as root needs a 'postgres' OS user to run the server as (%s): %w", pgInstallHint, err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		pg.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		// root's TMPDIR may not be reachable by another user; /tmp always is.
		parent = "/tmp"
		// Nor may the binaries fetched into a clone under a 0700 directory.
		if pg.binDir, err = reachableBinDir(pg.binDir, pg.cred); err != nil {
			return err
		}
	}
	// Unix socket paths are limited to 107 bytes; the socket lives in baseDir.
	if len(parent) > 60 {
		parent = "/tmp"
	}
	var err error
	if pg.baseDir, err = os.MkdirTemp(parent, "outbox-pg-"); err != nil {
		return err
	}
	if pg.cred != nil {
		if err := os.Chown(pg.baseDir, int(pg.cred.Uid), int(pg.cred.Gid)); err != nil {
			return err
		}
	}
	pg.dataDir = filepath.Join(pg.baseDir, "data")
	pg.logPath = filepath.Join(pg.baseDir, "postgres.log")

	if err := pg.initdb(ctx); err != nil {
		return err
	}
	ports, err := FreePorts(1)
	if err != nil {
		return err
	}
	pg.port = ports[0]
	if err := pg.writeConfig(opts.Settings); err != nil {
		return err
	}
	if err := pg.start(ctx); err != nil {
		return err
	}
	pg.version, err = queryVersion(ctx, pg.DSN("postgres"))
	return err
}

func (pg *Postgres) initdb(ctx context.Context) error {
	args := []string{
		"-D", pg.dataDir,
		"-A", "trust",
		"-U", "postgres",
		"-E", "UTF8",
		"--locale=C", // no dependency on generated OS locales
		"--no-sync",
	}
	if binMajor(pg.binDir) >= 14 { // PostgreSQL 13's initdb has no such flag
		args = append(args, "--no-instructions")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(pg.binDir, "initdb"), args...)
	cmd.Dir = pg.baseDir // the postgres user may not be able to read our cwd
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred, Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return nil
}

// writeConfig appends the harness settings to postgresql.conf (later lines
// win), so Restart and a developer running postgres -D by hand see the same
// configuration, and replaces pg_hba.conf with loopback-only trust rules.
func (pg *Postgres) writeConfig(extra map[string]string) error {
	settings := map[string]string{
		"listen_addresses":          "127.0.0.1",
		"port":                      strconv.Itoa(pg.port),
		"unix_socket_directories":   pg.baseDir,
		"wal_level":                 "logical",
		"max_replication_slots":     "32",
		"max_wal_senders":           "32",
		"max_prepared_transactions": "16",
		// PostgreSQL 13 still stores new passwords as md5, which the
		// scram-sha-256 rules of the security tests refuse; 14+ default to this.
		"password_encryption": "scram-sha-256",
		// Durability against OS crashes is pointless for throwaway clusters;
		// process crashes (Crash) are still recovered from the WAL.
		"fsync":            "off",
		"full_page_writes": "off",
	}
	if pg.tls != nil {
		certFile, keyFile, err := pg.writeTLSFiles()
		if err != nil {
			return err
		}
		settings["ssl"] = "on"
		settings["ssl_cert_file"] = certFile
		settings["ssl_key_file"] = keyFile
	}
	maps.Copy(settings, extra)

	var b strings.Builder
	b.WriteString("\n# outbox-cdc testenv\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(settings[k], "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(pg.dataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}

	hba := pg.tlsHBA() +
		"# outbox-cdc testenv: trust loopback only\n" +
		"local all         all              trust\n" +
		"local replication all              trust\n" +
		"host  all         all 127.0.0.1/32 trust\n" +
		"host  replication all 127.0.0.1/32 trust\n"
	// The file already exists and belongs to the server user; rewriting it
	// in place keeps that ownership.
	return os.WriteFile(filepath.Join(pg.dataDir, "pg_hba.conf"), []byte(hba), 0o600)
}

// writeTLSFiles writes the server certificate and key into the data
// directory, owned by the server's OS user with mode 0600 (PostgreSQL
// refuses a key that others can read).
func (pg *Postgres) writeTLSFiles() (certFile, keyFile string, err error) {
	certFile = filepath.Join(pg.dataDir, "server.crt")
	keyFile = filepath.Join(pg.dataDir, "server.key")
	for path, content := range map[string][]byte{certFile: pg.tls.CertPEM, keyFile: pg.tls.KeyPEM} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			return "", "", err
		}
		if pg.cred != nil {
			if err := os.Chown(path, int(pg.cred.Uid), int(pg.cred.Gid)); err != nil {
				return "", "", err
			}
		}
	}
	return certFile, keyFile, nil
}

// tlsHBA returns the pg_hba.conf rules that come before the trust rules:
// the password roles connect over TLS with scram-sha-256 and are rejected
// without TLS. The first matching rule wins.
func (pg *Postgres) tlsHBA() string {
	if pg.tls == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("# outbox-cdc testenv: TLS and a password for these roles\n")
	for _, r := range pg.tls.PasswordRoles {
		fmt.Fprintf(&b, "hostssl   all         %s 127.0.0.1/32 scram-sha-256\n", r)
		fmt.Fprintf(&b, "hostssl   replication %s 127.0.0.1/32 scram-sha-256\n", r)
		fmt.Fprintf(&b, "hostnossl all         %s 127.0.0.1/32 reject\n", r)
		fmt.Fprintf(&b, "hostnossl replication %s 127.0.0.1/32 reject\n", r)
	}
	b.WriteString("hostssl   all         all 127.0.0.1/32 trust\n")
	b.WriteString("hostssl   replication all 127.0.0.1/32 trust\n")
	return b.String()
}

// TLSDSN returns a URL for database db as role user over TCP with
// sslmode=verify-full against the CA in rootCertFile. The password is not
// included: pass it separately (PGPASSWORD, a password file) or add it.
func (pg *Postgres) TLSDSN(db, user, rootCertFile string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     "127.0.0.1:" + strconv.Itoa(pg.port),
		Path:     "/" + db,
		RawQuery: url.Values{"sslmode": {"verify-full"}, "sslrootcert": {rootCertFile}}.Encode(),
	}
	return u.String()
}

// start runs the postmaster directly (not through pg_ctl) so the harness owns
// its PID and process group, then waits until it accepts connections.
func (pg *Postgres) start(ctx context.Context) error {
	cmd := exec.Command(filepath.Join(pg.binDir, "postgres"), "-D", pg.dataDir)
	cmd.Dir = pg.baseDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: pg.cred}
	return startReady(ctx, "postgres", cmd, pg.logPath, func(p *process) { pg.proc = p }, pg.waitReady)
}

func (pg *Postgres) waitReady(ctx context.Context) error {
	dsn := pg.DSN("postgres")
	for {
		if pg.proc.exited() {
			return fmt.Errorf("postgres exited during startup: %v", pg.proc.err)
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := ping(actx, dsn)
		cancel()
		if err == nil {
			return nil
		}
		if serr := sleepCtx(ctx, 50*time.Millisecond); serr != nil {
			return fmt.Errorf("postgres not ready: %w (last error: %v)", serr, err)
		}
	}
}

func ping(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

func queryVersion(ctx context.Context, dsn string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "", err
	}
	// "15.14 (Debian 15.14-0+deb12u1)" -> "15.14"
	v, _, _ = strings.Cut(v, " ")
	return v, nil
}

// DSN returns a URL for database db as the superuser postgres over TCP.
func (pg *Postgres) DSN(db string) string {
	if pg.external != "" {
		return withDatabase(pg.external, db)
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     "127.0.0.1:" + strconv.Itoa(pg.port),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// withDatabase rewrites the database of a URL or keyword/value DSN.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err == nil {
			u.Path = "/" + db
			u.RawPath = ""
			return u.String()
		}
	}
	// libpq and pgx both let a later keyword override an earlier one.
	q := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db)
	return dsn + " dbname='" + q + "'"
}

// CreateDatabase creates database name and returns its DSN. Giving each test
// its own database keeps tests independent without restarting the server.
func (pg *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("create database %q: %w", name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database %q: %w", name, err)
	}
	return pg.DSN(name), nil
}

// External reports whether the server was given by OUTBOX_CDC_TEST_PG_DSN.
func (pg *Postgres) External() bool { return pg.external != "" }

// Port is the TCP port the server listens on.
func (pg *Postgres) Port() int { return pg.port }

// DataDir is the cluster's data directory (empty for an external server).
func (pg *Postgres) DataDir() string { return pg.dataDir }

// BinDir is the directory of the server binaries (empty for an external server).
func (pg *Postgres) BinDir() string { return pg.binDir }

// LogFile is the server's log (stderr) file (empty for an external server).
func (pg *Postgres) LogFile() string { return pg.logPath }

// Version is the server version, such as "15.14".
func (pg *Postgres) Version() string { return pg.version }

// Running reports whether the managed server process is up (true for an
// external server, whose state the harness does not track).
func (pg *Postgres) Running() bool {
	if pg.external != "" {
		return true
	}
	pg.mu.Lock()
	defer pg.mu.Unlock()
	return pg.proc != nil && !pg.proc.exited()
}
