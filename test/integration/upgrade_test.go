package integration

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// Major version upgrades with pg_upgrade (PG docs, pg_upgrade, "Prepare for
// publisher upgrades"): logical slots are dropped when the old cluster is
// before PostgreSQL 17; from 17 on they are kept when every slot has
// consumed the WAL up to the shutdown checkpoint. Both ways every row's
// event reaches Kafka, and retention deletes no row before its event is
// there. The clusters are the tests' own (complete installations with
// pg_upgrade: testenv.UpgradeBinDir), whatever the suite's version.

const upgradeRetain = 3 * time.Second

// upgradeRun is an old-version cluster with an outbox under retention, the
// connector's configuration, and every row the test wrote.
type upgradeRun struct {
	t       *testing.T
	pg      *testenv.Postgres
	dsn     string
	slot    string
	agg     string
	cfgPath string
	ids     []string
}

// upgradeBins is the bin directory of a complete PostgreSQL major: a
// missing one fails the test, saying how to fetch it.
func upgradeBins(t *testing.T, major int) string {
	t.Helper()
	dir, err := testenv.UpgradeBinDir(major)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func newUpgradeRun(ctx context.Context, t *testing.T, major int, slot string) *upgradeRun {
	t.Helper()
	pg, err := testenv.StartPostgresIn(ctx, upgradeBins(t, major), testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	dsn, err := pg.CreateDatabase(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	r := &upgradeRun{t: t, pg: pg, dsn: dsn, slot: slot, agg: slot + runID}
	retentionTable(t, dsn, "outbox")
	appendTimeTopic(t, topicFor(r.agg))
	r.cfgPath = retentionYAML(t, dsn, slot, "retention: "+upgradeRetain.String(), "")
	t.Logf("PostgreSQL %s on port %d", pg.Version(), pg.Port())
	return r
}

// write commits n rows, one transaction each, and returns their ids.
func (r *upgradeRun) write(n int) []string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		r.t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	ids := insertRows(r.t, conn, "outbox", r.agg, n)
	r.ids = append(r.ids, ids...)
	return ids
}

func (r *upgradeRun) count(sql string, args ...any) int {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		r.t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	return queryInt(r.t, conn, sql, args...)
}

// upgrade runs pg_upgrade to major and starts the new cluster on the old
// one's port: the connector's configuration reaches it unchanged.
func (r *upgradeRun) upgrade(ctx context.Context, major int, link bool) {
	r.t.Helper()
	old := r.pg.Version()
	nw, out, err := testenv.Upgrade(ctx, r.pg, upgradeBins(r.t, major), testenv.UpgradeOptions{Link: link})
	if err != nil {
		r.t.Fatalf("upgrade %s to %d: %v", old, major, err)
	}
	r.t.Cleanup(func() { nw.Close() })
	r.pg = nw
	r.t.Logf("pg_upgrade %s -> %s (link %v): %s", old, nw.Version(), link, lastLine(out))
}

func (r *upgradeRun) slotExists() bool {
	r.t.Helper()
	return r.count("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", r.slot) == 1
}

// confirmed is the slot's confirmed_flush_lsn, and the file nodes of the
// database's tables: what names the relations of the records a WAL dump
// shows past it.
func (r *upgradeRun) confirmed() (string, string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := pgConnect(r.t, r.dsn)
	var nodes string
	if err := conn.QueryRow(ctx, `SELECT string_agg(c.oid::regclass::text || '=' || pg_relation_filenode(c.oid), ', ')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'r' AND n.nspname IN ('public', 'outbox_cdc')`).Scan(&nodes); err != nil {
		r.t.Fatal(err)
	}
	return slotConfirmed(r.t, r.dsn, r.slot).String(), nodes
}

// kept fails the test unless every row of ids is still in the table.
func (r *upgradeRun) kept(ids []string, when string) {
	r.t.Helper()
	if n := r.count("SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])", ids); n != len(ids) {
		r.t.Fatalf("%s: %d of %d rows whose events were never streamed are left: retention deleted the others", when, n, len(ids))
	}
}

// delivered waits until every id has its event in Kafka, then for the
// table to be emptied by retention, and checks that no row was deleted
// before its event was appended.
func (r *upgradeRun) delivered(p *process) {
	r.t.Helper()
	topics := []string{topicFor(r.agg)}
	waitFor(r.t, 2*time.Minute, "every row deleted by retention", func() bool {
		if p.proc.Exited() {
			r.t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		return r.count("SELECT count(*) FROM outbox") == 0
	})
	recs := consumeN(r.t, topics, len(r.ids), time.Minute, 0)
	conn := pgConnect(r.t, r.dsn)
	if n := checkDeletedAfterAck(r.t, conn, recs, r.ids); n != len(r.ids) {
		r.t.Errorf("%d rows deleted, want %d", n, len(r.ids))
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// sinceRE finds the --since of the repair command the connector logs when
// it creates a slot over a checkpoint.
var sinceRE = regexp.MustCompile(`--repair --since (\d{4}-\d\d-\d\dT[0-9:]+Z)`)

// TestUpgrade16To17SlotDropped: pg_upgrade from 16 drops the slot. The
// connector creates it again over its checkpoint, logs the repair command
// and holds retention for the rows it did not stream (written while it
// was stopped and on the new cluster before it started); the operator
// runs that command, and every event arrives, none deleted before.
func TestUpgrade16To17SlotDropped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	upgradeBins(t, 17) // fail before any work when it is missing
	r := newUpgradeRun(ctx, t, 16, "upg16")
	p := startRetention(t, r.cfgPath)
	r.write(10)
	waitFor(t, time.Minute, "the delivered rows deleted on 16", func() bool { return r.count("SELECT count(*) FROM deleted_rows") == 10 })
	stopClean(t, p)
	unstreamed := r.write(10) // the connector is stopped

	r.upgrade(ctx, 17, true)
	if r.slotExists() {
		t.Fatalf("slot %s survived pg_upgrade from 16: this test expects it dropped (PG docs, pg_upgrade)", r.slot)
	}
	unstreamed = append(unstreamed, r.write(10)...) // on 17, before the connector runs
	p = startRetention(t, r.cfgPath)
	defer func() {
		if t.Failed() {
			t.Logf("connector on 17:\n%s", p.output())
		}
	}()
	m := sinceRE.FindStringSubmatch(p.output())
	if m == nil {
		t.Fatalf("the connector created the slot again without logging the repair command:\n%s", p.output())
	}
	later := r.write(5)
	waitFor(t, time.Minute, "the rows written once the connector runs", func() bool {
		return len(consumeN(t, []string{topicFor(r.agg)}, 0, 0, time.Second)) >= 10+len(later)
	})
	time.Sleep(3 * upgradeRetain) // retention rounds on the new slot, past the unstreamed rows' age
	r.kept(unstreamed, "before verify --repair")

	code, out := runBinary(t, 2*time.Minute, nil, "verify", "--repair", "--config", r.cfgPath, "--since", m[1])
	if code != 0 {
		t.Fatalf("verify --repair --since %s: exit %d, want 0:\n%s", m[1], code, out)
	}
	r.delivered(p)
	stopClean(t, p)
}

// TestUpgrade17To18SlotKept: from 17 on pg_upgrade keeps a slot that has
// consumed the WAL. Rows written while the connector is stopped make
// pg_upgrade --check refuse the slot; the connector started again drains
// them and, stopped cleanly with everything consumed, leaves a slot the
// check accepts. The upgraded cluster has the slot, and the connector
// resumes from it: no new slot, no repair, every event in Kafka.
func TestUpgrade17To18SlotKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bins18 := upgradeBins(t, 18)
	r := newUpgradeRun(ctx, t, 17, "upg17")
	p := startRetention(t, r.cfgPath)
	r.write(10)
	waitFor(t, time.Minute, "the delivered rows deleted on 17", func() bool { return r.count("SELECT count(*) FROM deleted_rows") == 10 })
	stopClean(t, p)
	r.write(10) // the connector is stopped: WAL the slot has not consumed

	_, err := testenv.CheckUpgrade(ctx, r.pg, bins18, testenv.UpgradeOptions{})
	ue, ok := testenv.IsUpgradeError(err)
	if !ok || !strings.Contains(ue.Output, r.slot) || !strings.Contains(ue.Output, "has not consumed the WAL") {
		t.Fatalf("pg_upgrade --check with rows the slot has not consumed: %v, want a refusal naming slot %s", err, r.slot)
	}
	if err := r.pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	p = startRetention(t, r.cfgPath) // drains them
	waitFor(t, time.Minute, "every row delivered and deleted on 17", func() bool { return r.count("SELECT count(*) FROM outbox") == 0 })
	stopClean(t, p)
	confirmed, nodes := r.confirmed()
	if out, err := testenv.CheckUpgrade(ctx, r.pg, bins18, testenv.UpgradeOptions{}); err != nil {
		wal, derr := r.pg.WALDump(ctx, confirmed)
		t.Fatalf("pg_upgrade --check after a clean stop with every event consumed: %v\n"+
			"WAL after the slot's confirmed_flush_lsn %s (%v; file nodes %s):\n%s", err, confirmed, derr, nodes, wal)
	} else {
		t.Logf("pg_upgrade --check: %s", lastLine(out))
	}

	r.upgrade(ctx, 18, false)
	if !r.slotExists() {
		t.Fatalf("slot %s is not on the upgraded cluster", r.slot)
	}
	r.write(10) // on 18, before the connector runs: the kept slot streams them
	p = startRetention(t, r.cfgPath)
	defer func() {
		if t.Failed() {
			t.Logf("connector on 18:\n%s", p.output())
		}
	}()
	r.write(5)
	r.delivered(p)
	if out := p.output(); strings.Contains(out, "slot was created by this run") {
		t.Errorf("the connector created the slot again instead of resuming the kept one:\n%s", out)
	}
	stopClean(t, p)
}
