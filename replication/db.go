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
// configuration. The password of postgres.password_file is set on it once,
// so no DSN string (nor the process environment) carries credentials
// between packages.
type DB struct {
	cfg *pgx.ConnConfig
}

// NewDB returns a DB for a parsed configuration; cfg is copied.
func NewDB(cfg *pgconn.Config) (*DB, error) {
	// pgx only connects with a configuration made by its ParseConfig: parse
	// an empty one and put the given connection settings in it.
	cc, err := pgx.ParseConfig("")
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	cc.Config = *cfg.Copy()
	return &DB{cfg: cc}, nil
}

// ParseDB parses dsn; a non-empty password replaces the DSN's (the content
// of postgres.password_file).
func ParseDB(dsn, password string) (*DB, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres.dsn: %w", err)
	}
	if password != "" {
		cc.Password = password
	}
	return &DB{cfg: cc}, nil
}

// connect opens an ordinary connection; callers wrap and classify its error.
func (d *DB) connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, d.cfg.Copy())
}

// replication opens a replication connection (replication=database);
// callers wrap and classify its error.
func (d *DB) replication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg := d.cfg.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outbox-cdc"
	}
	return pgconn.ConnectConfig(ctx, cfg)
}

// Database is the database the connections open.
func (d *DB) Database() string { return d.cfg.Database }

// Config returns a copy of the connection settings.
func (d *DB) Config() *pgconn.Config { return d.cfg.Config.Copy() }

// quoteLiteral quotes s as an SQL string literal, for the statements that
// take no parameters (SET TRANSACTION SNAPSHOT, replication commands, the SQL
// printed for an operator); identifiers are quoted with pgx.Identifier.
// Doubling the quote is the whole rule in the replication command grammar
// (repl_scanner.l) and in SQL with standard_conforming_strings on, which
// pgx's own simple-protocol quoting also requires.
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
