package replication

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB opens every PostgreSQL connection of the connector (replication
// stream, setup, slot statistics, heartbeat, snapshot and backfill reads,
// the guard's readings, the checkpoint table) from one parsed
// configuration. A PasswordFunc, when set, gives each connection attempt its
// password, so no DSN string (nor the process environment) carries
// credentials between packages and short-lived tokens are never reused.
type DB struct {
	cfg      *pgx.ConnConfig
	password PasswordFunc // nil: the DSN's own password, if any
}

// PasswordFunc returns the password for one connection attempt (the content
// of postgres.password_file or the output of postgres.password_command, got
// anew each time). Its error must not contain the password.
type PasswordFunc func(ctx context.Context) (string, error)

// ParseDB parses dsn; a non-nil password replaces the DSN's password at
// every connection attempt.
func ParseDB(dsn string, password PasswordFunc) (*DB, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres.dsn: %w", err)
	}
	return &DB{cfg: cc, password: password}, nil
}

// settings returns a copy of the connection settings with this attempt's
// password. The password lives only in that copy, for one connect.
func (d *DB) settings(ctx context.Context) (*pgx.ConnConfig, error) {
	cc := d.cfg.Copy()
	if d.password != nil {
		pw, err := d.password(ctx)
		if err != nil {
			return nil, err
		}
		cc.Password = pw
	}
	return cc, nil
}

// connect opens an ordinary connection; callers wrap and classify its error.
func (d *DB) connect(ctx context.Context) (*pgx.Conn, error) {
	cc, err := d.settings(ctx)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cc)
}

// replication opens a replication connection (replication=database);
// callers wrap and classify its error.
func (d *DB) replication(ctx context.Context) (*pgconn.PgConn, error) {
	cc, err := d.settings(ctx)
	if err != nil {
		return nil, err
	}
	cfg := &cc.Config
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outbox-cdc"
	}
	return pgconn.ConnectConfig(ctx, cfg)
}

// Database is the database the connections open.
func (d *DB) Database() string { return d.cfg.Database }

// Config returns a copy of the connection settings, without the password a
// PasswordFunc would give.
func (d *DB) Config() *pgconn.Config { return d.cfg.Config.Copy() }

// Password runs the PasswordFunc once, for tools and tests; "" without one.
func (d *DB) Password(ctx context.Context) (string, error) {
	if d.password == nil {
		return "", nil
	}
	return d.password(ctx)
}

// quoteLiteral quotes s as an SQL string literal, for the statements that
// take no parameters (SET TRANSACTION SNAPSHOT, replication commands, the SQL
// printed for an operator); identifiers are quoted with pgx.Identifier.
// Doubling the quote is the whole rule in the replication command grammar
// (repl_scanner.l) and in SQL with standard_conforming_strings on, which
// pgx's own simple-protocol quoting also requires.
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
