package testenv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestFreePortsDistinct(t *testing.T) {
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("bad or duplicate port %d in %v", p, ports)
		}
		seen[p] = true
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "scripts", "fetch-kafka.sh")); err != nil {
		t.Fatalf("repo root %s has no scripts/fetch-kafka.sh: %v", root, err)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u:p@h:5432/old?sslmode=disable", "postgres://u:p@h:5432/new_db?sslmode=disable"},
		{"postgresql://h/old", "postgresql://h/new_db"},
		{"host=h dbname=old user=u", "host=h dbname=old user=u dbname='new_db'"},
	} {
		if got := withDatabase(tc.dsn, "new_db"); got != tc.want {
			t.Errorf("withDatabase(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
	}
	// The appended keyword must win over the earlier one.
	cfg, err := pgx.ParseConfig(withDatabase("host=h dbname=old", "it's"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database != "it's" {
		t.Fatalf("database = %q, want %q", cfg.Database, "it's")
	}
}

func TestPGDirVersion(t *testing.T) {
	if a, b := pgDirVersion("/usr/lib/postgresql/15/bin"), pgDirVersion("/usr/lib/postgresql/9.6/bin"); a <= b {
		t.Fatalf("15 (%d) should sort above 9.6 (%d)", a, b)
	}
}

func TestTail(t *testing.T) {
	if got := tail("a\nb\nc\n", 2); got != "b\nc" {
		t.Fatalf("tail = %q", got)
	}
}

// TestPostgresLifecycle drives every lifecycle method once on a private
// server (PostgreSQL starts in about a second, so this is cheap) and checks
// Close leaves no process or directory behind.
func TestPostgresLifecycle(t *testing.T) {
	if os.Getenv(EnvPGDSN) != "" {
		t.Skip("lifecycle needs a managed server; " + EnvPGDSN + " is set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := StartPostgres(ctx, PostgresOptions{Settings: map[string]string{"max_connections": "42"}})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()

	dsn, err := pg.CreateDatabase(ctx, "Life-Cycle")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var maxConns, walLevel string
	if err := conn.QueryRow(ctx, "SELECT current_setting('max_connections'), current_setting('wal_level')").Scan(&maxConns, &walLevel); err != nil {
		t.Fatal(err)
	}
	if maxConns != "42" || walLevel != "logical" {
		t.Fatalf("max_connections=%s wal_level=%s, want 42 and logical", maxConns, walLevel)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	steps := []struct {
		name string
		down func() error
	}{
		{"stop", func() error { return pg.Stop(ctx) }},
		{"immediate stop", pg.ImmediateStop},
		{"crash", pg.Crash},
	}
	for i, step := range steps {
		pid, kids := pg.proc.pgid(), pg.proc.descendants()
		if len(kids) == 0 {
			t.Fatalf("%s: postmaster %d has no children", step.name, pid)
		}
		if err := step.down(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if pg.Running() || anyAlive(pid, kids) {
			t.Fatalf("%s: server still running", step.name)
		}
		if err := pg.Restart(ctx); err != nil {
			t.Fatalf("restart after %s: %v", step.name, err)
		}
		if pg.proc.pgid() == pid {
			t.Fatalf("restart after %s: same pid %d", step.name, pid)
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect after %s: %v", step.name, err)
		}
		if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1)", i+2); err != nil {
			t.Fatalf("insert after %s: %v", step.name, err)
		}
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
		if n != i+2 {
			t.Fatalf("after %s: %d rows, want %d", step.name, n, i+2)
		}
	}

	pid, kids, dir := pg.proc.pgid(), pg.proc.descendants(), pg.baseDir
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}
	if anyAlive(pid, kids) {
		t.Fatal("close left postgres processes behind")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("close left %s behind: %v", dir, err)
	}
}

// TestPostgresExternal wraps a managed server through OUTBOX_CDC_TEST_PG_DSN
// and checks the wrapper serves databases but refuses lifecycle operations.
func TestPostgresExternal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if os.Getenv(EnvPGDSN) == "" {
		managed, err := StartPostgres(ctx, PostgresOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer managed.Close()
		t.Setenv(EnvPGDSN, managed.DSN("postgres"))
	}
	pg, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if !pg.External() || pg.Version() == "" || pg.Port() == 0 {
		t.Fatalf("external=%v version=%q port=%d", pg.External(), pg.Version(), pg.Port())
	}
	dsn, err := pg.CreateDatabase(ctx, "external_db")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "external_db" {
		t.Fatalf("current_database() = %q, %v", db, err)
	}
	for name, err := range map[string]error{
		"Stop":          pg.Stop(ctx),
		"ImmediateStop": pg.ImmediateStop(),
		"Crash":         pg.Crash(),
		"Restart":       pg.Restart(ctx),
	} {
		if !errors.Is(err, ErrExternal) {
			t.Errorf("%s on external server = %v, want ErrExternal", name, err)
		}
	}
}

func anyAlive(pgid int, pids []int) bool {
	table := procTable()
	for pid, st := range table {
		if st.pgrp == pgid || slices.Contains(pids, pid) {
			return true
		}
	}
	return false
}
