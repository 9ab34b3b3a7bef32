package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// serverIdentity is what a checkpoint written for dsn records, read the
// way an operator would (the connector reads it with IDENTIFY_SYSTEM).
func serverIdentity(t *testing.T, dsn string) (systemID string, timeline int32, db string) {
	t.Helper()
	err := pgConnect(t, dsn).QueryRow(context.Background(), `SELECT s.system_identifier::text, c.timeline_id, current_database()
		FROM pg_control_system() s, pg_control_checkpoint() c`).Scan(&systemID, &timeline, &db)
	if err != nil {
		t.Fatalf("server identity: %v", err)
	}
	return systemID, timeline, db
}

func writeCheckpointFile(t *testing.T, path string, fields map[string]any) {
	t.Helper()
	fields["updated_at"] = time.Now().UTC()
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readCheckpointFile(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read checkpoint file: %v", err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("checkpoint file %s: %v", b, err)
	}
	return m
}

// runProc starts the binary with its HTTP endpoint and waits until it streams.
func runProc(t *testing.T, cfgPath string) *process {
	t.Helper()
	addr := freeAddr(t)
	return startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
}

// TestCheckpointForeignRefused: a checkpoint file that belongs to another
// cluster, database, slot or timeline, or lies past the server's WAL end,
// stops `run` with exit 1, both values and how to proceed; nothing is
// skipped or confirmed, and following the advice publishes every event.
func TestCheckpointForeignRefused(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	file := filepath.Join(t.TempDir(), "checkpoint.json")
	cfgPath := writeConfig(t, yamlFor(t, dsn, "foreign", fmt.Sprintf("checkpoint: {store: file, file: %q}\n", file)))
	stopClean(t, runProc(t, cfgPath)) // creates the slot

	conn := pgConnect(t, dsn)
	writeEvents(t, conn, "foreign", 0, 20) // while the connector is down
	ahead := currentLSN(t, conn)           // past every one of them
	confirmed := slotConfirmed(t, dsn, "foreign")
	sys, tli, db := serverIdentity(t, dsn)
	own := func(l lsn.LSN) map[string]any {
		return map[string]any{"lsn": l.String(), "snapshot_done": true, "system_id": sys, "timeline": tli, "database": db, "slot": "foreign"}
	}
	beyond := ahead + 1<<30
	tests := []struct {
		name string
		edit func(m map[string]any)
		want []string
	}{
		{"other cluster", func(m map[string]any) { m["system_id"] = "7000000000000000001" }, []string{"7000000000000000001", sys}},
		{"other database", func(m map[string]any) { m["database"] = "someone_elses_db" }, []string{"someone_elses_db", db}},
		{"other slot", func(m map[string]any) { m["slot"] = "someone_elses_slot" }, []string{"someone_elses_slot", "foreign"}},
		{"other timeline", func(m map[string]any) { m["timeline"] = tli + 6 }, []string{fmt.Sprintf("timeline %d", tli+6)}},
		{"past the WAL end", func(m map[string]any) { m["lsn"] = beyond.String() }, []string{beyond.String(), "WAL end"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := own(ahead)
			tt.edit(m)
			writeCheckpointFile(t, file, m)
			code, out := runBinary(t, 40*time.Second, nil, "run", "--config", cfgPath)
			want := append(tt.want, "remove the file "+file, "outbox-cdc replay")
			for _, w := range want {
				if code != 1 || !strings.Contains(out, w) {
					t.Fatalf("exit %d, want 1 with %q in the message:\n%s", code, w, out)
				}
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "connector failed") {
					t.Log(line)
				}
			}
			if got := slotConfirmed(t, dsn, "foreign"); got != confirmed {
				t.Fatalf("slot confirmed moved from %v to %v: a refused start confirmed something", confirmed, got)
			}
		})
	}

	// As the message says: remove the file and start again.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	p := runProc(t, cfgPath)
	recs := consumeN(t, []string{topicFor("foreign")}, 20, time.Minute, 2*time.Second)
	if len(recs) != 20 {
		t.Fatalf("%d records after removing the checkpoint, want exactly the 20 written before", len(recs))
	}
	end := currentLSN(t, conn)
	waitFor(t, 30*time.Second, "checkpoint saved", func() bool {
		m := map[string]any{}
		b, _ := os.ReadFile(file)
		_ = json.Unmarshal(b, &m)
		l, _ := lsn.Parse(fmt.Sprint(m["lsn"]))
		return l >= end
	})
	stopClean(t, p)
	if m := readCheckpointFile(t, file); m["system_id"] != sys || m["database"] != db || m["slot"] != "foreign" {
		t.Fatalf("checkpoint %v lacks this server's identity (%s, %s, foreign)", m, sys, db)
	}
}

// TestCheckpointNewSlotIgnoresOldCheckpoint: a slot created by this run
// starts a new stream; a checkpoint ahead of it (even past the WAL end) is
// ignored with a warning and overwritten, never used to skip.
func TestCheckpointNewSlotIgnoresOldCheckpoint(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		name := "same cluster"
		if legacy {
			name = "older version without identity"
		}
		t.Run(name, func(t *testing.T) {
			dsn := newDatabase(t)
			createOutbox(t, dsn, "outbox", "jsonb")
			conn := pgConnect(t, dsn)
			slot := "newslot"
			if legacy {
				slot = "newslotold"
			}
			file := filepath.Join(t.TempDir(), "checkpoint.json")
			fake := currentLSN(t, conn) + 1<<30
			m := map[string]any{"lsn": fake.String(), "snapshot_done": true}
			if !legacy {
				sys, tli, db := serverIdentity(t, dsn)
				m["system_id"], m["timeline"], m["database"], m["slot"] = sys, tli, db, slot
			}
			writeCheckpointFile(t, file, m)
			p := runProc(t, writeConfig(t, yamlFor(t, dsn, slot, fmt.Sprintf("checkpoint: {store: file, file: %q}\n", file))))
			before := currentLSN(t, conn)
			writeEvents(t, conn, slot, 0, 20)
			recs := consumeN(t, []string{topicFor(slot)}, 20, 30*time.Second, 2*time.Second)
			if len(recs) != 20 {
				t.Fatalf("%d records, want exactly 20", len(recs))
			}
			stopClean(t, p)
			if !strings.Contains(p.output(), fake.String()) || !strings.Contains(p.output(), "WARN") {
				t.Errorf("no warning naming the ignored checkpoint %v:\n%s", fake, p.output())
			}
			l, _ := lsn.Parse(fmt.Sprint(readCheckpointFile(t, file)["lsn"]))
			if l <= before || l >= fake {
				t.Errorf("checkpoint %v after the run, want it overwritten with this slot's position, past the events (> %v)", l, before)
			}
		})
	}
}

// ckptWriteCounter counts the rows written to outbox_cdc.checkpoints.
func ckptWriteCounter(t *testing.T, dsn string) func() int {
	exec1(t, dsn, `CREATE TABLE ckpt_writes (lsn pg_lsn, id bigserial)`)
	exec1(t, dsn, `CREATE FUNCTION log_ckpt() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO public.ckpt_writes (lsn) VALUES (NEW.lsn); RETURN NEW; END $$`)
	exec1(t, dsn, `CREATE TRIGGER log_ckpt AFTER INSERT OR UPDATE ON outbox_cdc.checkpoints FOR EACH ROW EXECUTE FUNCTION log_ckpt()`)
	conn := pgConnect(t, dsn)
	return func() int {
		var n int
		if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM ckpt_writes").Scan(&n); err != nil {
			t.Fatalf("count checkpoint writes: %v", err)
		}
		return n
	}
}

// TestCheckpointIdleWritesBounded: on an idle database the checkpoint's own
// UPDATE writes WAL, whose keepalive moves the watermark; those moves must
// not be saved every 200 ms, nor must WAL of other tables cause a write each.
func TestCheckpointIdleWritesBounded(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "idle")
	startConnector(t, cfg)
	writes := ckptWriteCounter(t, dsn)
	conn := pgConnect(t, dsn)
	writeEvents(t, conn, "idle", 0, 1)
	consumeN(t, []string{topicFor("idle")}, 1, time.Minute, 0)
	end := currentLSN(t, conn)
	waitFor(t, 30*time.Second, "the event's checkpoint", func() bool { return checkpointLSN(t, conn, "idle") >= end })

	// Observation windows, not speed limits: with a write every 200 ms they
	// would see ten or more.
	n0 := writes()
	time.Sleep(2 * time.Second) // the quiet window whose writes are counted
	n1 := writes()
	mustExec(context.Background(), t, conn, "CREATE TABLE other (x int)")
	for i := range 10 {
		mustExec(context.Background(), t, conn, "INSERT INTO other VALUES ($1)", i)
		time.Sleep(300 * time.Millisecond) // pacing: ten writes spread over the 3 s window
	}
	n2 := writes()
	t.Logf("checkpoint writes: %d while quiet, %d while other tables were written", n1-n0, n2-n1)
	if n1-n0 > 1 || n2-n1 > 2 {
		t.Fatalf("checkpoint written %d times in 2 s of quiet and %d times in 3 s of writes to other tables; want at most 1 and 2",
			n1-n0, n2-n1)
	}
	// An event is still saved promptly (no speed assertion: only that it is).
	writeEvents(t, conn, "idle", 1, 2)
	consumeN(t, []string{topicFor("idle")}, 2, time.Minute, 0)
	end = currentLSN(t, conn)
	waitFor(t, 30*time.Second, "the second event's checkpoint", func() bool { return checkpointLSN(t, conn, "idle") >= end })
}

// TestCheckpointStandbyKeepsActivePosition: a standby connector waiting for
// the slot must never write its older start position over the active
// connector's checkpoint, neither while it waits nor when it stops.
func TestCheckpointStandbyKeepsActivePosition(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	exec1(t, dsn, `CREATE SCHEMA outbox_cdc; CREATE TABLE outbox_cdc.checkpoints (slot text PRIMARY KEY, lsn pg_lsn NOT NULL,
		snapshot_done boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL DEFAULT now(),
		system_id text, timeline integer, database text)`)
	ckptWriteCounter(t, dsn)
	dropSlotAtEnd(t, dsn, "ckstandby")
	cfgPath := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: ckstandby, publication: ckstandby, reconnect_backoff_max: 1s}\nkafka: {brokers: [%s], topic: %q}\nhttp: {listen: ''}\n",
		dsn, strings.Join(kafkaServer.Brokers(), ", "), topicTemplate))
	a := runProc(t, cfgPath)
	conn := pgConnect(t, dsn)
	writeEvents(t, conn, "ckstandby", 0, 10)
	consumeN(t, []string{topicFor("ckstandby")}, 10, time.Minute, 0)
	end1 := currentLSN(t, conn)
	waitFor(t, 30*time.Second, "active's checkpoint", func() bool { return checkpointLSN(t, conn, "ckstandby") >= end1 })

	addrB := freeAddr(t)
	b := startProc(t, cfgPath, addrB, false, "OUTBOX_CDC_HTTP_LISTEN="+addrB)
	waitFor(t, time.Minute, "standby set up", func() bool { return strings.Contains(b.output(), "connector started") })
	writeEvents(t, conn, "ckstandby", 10, 20)
	consumeN(t, []string{topicFor("ckstandby")}, 20, time.Minute, 0)
	end2 := currentLSN(t, conn)
	waitFor(t, 30*time.Second, "active's second checkpoint", func() bool { return checkpointLSN(t, conn, "ckstandby") >= end2 })
	if ready(addrB) {
		t.Fatal("the standby streams while the active connector does")
	}
	stopClean(t, b)
	if l := checkpointLSN(t, conn, "ckstandby"); l < end2 {
		t.Errorf("checkpoint %v after the standby stopped, want at least the active's %v", l, end2)
	}
	rows, err := conn.Query(context.Background(), "SELECT lsn::text FROM ckpt_writes ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	hist, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var prev lsn.LSN
	for i, s := range hist {
		l, _ := lsn.Parse(s)
		if l < prev {
			t.Fatalf("checkpoint write %d of %d moved it back from %v to %v: %v", i+1, len(hist), prev, l, hist)
		}
		prev = l
	}
	stopClean(t, a)
}

// docSQL returns the SQL block under heading in docs/operations.md.
func docSQL(t *testing.T, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), heading)
	if !ok {
		t.Fatalf("docs/operations.md has no %q", heading)
	}
	_, block, ok := strings.Cut(after, "```sql\n")
	if !ok {
		t.Fatalf("docs/operations.md: no sql block after %q", heading)
	}
	block, _, _ = strings.Cut(block, "```")
	return block
}

// TestCheckpointLeastPrivilege follows docs/operations.md literally: an
// administrator creates the checkpoint table and grants a role nothing else
// (no CREATE anywhere); the connector must run as that role. A table of the
// old shape that the role may not alter gives the ALTER TABLE to run.
func TestCheckpointLeastPrivilege(t *testing.T) {
	const role = "cdc_ckpt_app"
	setup := func(t *testing.T, slot string) (dsn, appDSN string) {
		dsn = newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		exec1(t, dsn, "DO $$ BEGIN CREATE ROLE "+role+" LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
		exec1(t, dsn, "GRANT SELECT ON outbox TO "+role)
		exec1(t, dsn, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')", slot))
		dropSlotAtEnd(t, dsn, slot)
		return dsn, strings.Replace(dsn, "postgres@", role+"@", 1)
	}
	yaml := func(appDSN, slot string) string {
		return fmt.Sprintf("postgres: {dsn: %q, slot: %s, publication: %s}\nkafka: {brokers: [%s], dlq_topic: %s, topic: %q}\nhttp: {listen: ''}\n",
			appDSN, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate)
	}

	t.Run("documented setup", func(t *testing.T) {
		dsn, appDSN := setup(t, "leastpriv")
		ddl := regexp.MustCompile(`\bapp\b`).ReplaceAllString(docSQL(t, "### Least-privilege checkpoint table"), role)
		exec1(t, dsn, ddl)
		p := runProc(t, writeConfig(t, yaml(appDSN, "leastpriv")))
		conn := pgConnect(t, dsn)
		writeEvents(t, conn, "leastpriv", 0, 5)
		consumeN(t, []string{topicFor("leastpriv")}, 5, time.Minute, 0)
		end := currentLSN(t, conn)
		waitFor(t, 30*time.Second, "checkpoint saved by the role", func() bool { return checkpointLSN(t, conn, "leastpriv") >= end })
		stopClean(t, p)
		var sys *string
		if err := conn.QueryRow(context.Background(), "SELECT system_id FROM outbox_cdc.checkpoints WHERE slot = 'leastpriv'").Scan(&sys); err != nil || sys == nil {
			t.Fatalf("system_id %v (%v), want it recorded", sys, err)
		}
	})
	t.Run("old table shape", func(t *testing.T) {
		dsn, appDSN := setup(t, "leastprivold")
		exec1(t, dsn, `CREATE SCHEMA outbox_cdc; CREATE TABLE outbox_cdc.checkpoints (slot text PRIMARY KEY, lsn pg_lsn NOT NULL,
			snapshot_done boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL DEFAULT now());
			GRANT USAGE ON SCHEMA outbox_cdc TO `+role+`; GRANT SELECT, INSERT, UPDATE ON outbox_cdc.checkpoints TO `+role)
		code, out := runBinary(t, 40*time.Second, nil, "run", "--config", writeConfig(t, yaml(appDSN, "leastprivold")))
		// The log quotes the message, so look for the statement's unquoted part.
		if code != 1 || !strings.Contains(out, "ALTER TABLE") || !strings.Contains(out, "checkpoints") ||
			!strings.Contains(out, "ADD COLUMN IF NOT EXISTS system_id text") {
			t.Fatalf("exit %d, want 1 naming the ALTER TABLE to run:\n%s", code, out)
		}
	})
}

// TestSnapshotBookkeeping: the snapshot marker is durable before the slot
// exists; a missing slot with an unfinished snapshot does not wedge the
// start; an older checkpoint's snapshot_done never marks a new snapshot done.
func TestSnapshotBookkeeping(t *testing.T) {
	t.Run("marker before the slot", func(t *testing.T) {
		if pgServer.External() {
			t.Skip("needs its own PostgreSQL")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Settings: map[string]string{"max_replication_slots": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Close()
		dsn := pg.DSN("postgres")
		createOutbox(t, dsn, "outbox", "jsonb")
		conn := pgConnect(t, dsn)
		writeEvents(t, conn, "snapmarker", 0, 5)
		// The only slot is taken: creating the connector's slot fails, as a
		// crash right before it would.
		exec1(t, dsn, "SELECT pg_create_physical_replication_slot('blocker')")
		cfgPath := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: snapmarker, publication: snapmarker}\nkafka: {brokers: [%s], topic: %q}\nhttp: {listen: ''}\nsnapshot: {mode: pending}\n",
			dsn, strings.Join(kafkaServer.Brokers(), ", "), topicTemplate))
		code, out := runBinary(t, time.Minute, nil, "run", "--config", cfgPath)
		if code != 1 {
			t.Fatalf("exit %d, want 1 (no free replication slot):\n%s", code, out)
		}
		var done bool
		if err := conn.QueryRow(ctx, "SELECT snapshot_done FROM outbox_cdc.checkpoints WHERE slot = 'snapmarker'").Scan(&done); err != nil || done {
			t.Fatalf("snapshot marker: snapshot_done %v (%v), want a saved row with false before the slot is created", done, err)
		}
		exec1(t, dsn, "SELECT pg_drop_replication_slot('blocker')")
		p := runProc(t, cfgPath)
		recs := consumeN(t, []string{topicFor("snapmarker")}, 5, time.Minute, 2*time.Second)
		if len(recs) != 5 {
			t.Fatalf("%d records, want the 5 rows of the snapshot exactly once", len(recs))
		}
		waitFor(t, 30*time.Second, "snapshot_done", func() bool {
			_ = conn.QueryRow(ctx, "SELECT snapshot_done FROM outbox_cdc.checkpoints WHERE slot = 'snapmarker'").Scan(&done)
			return done
		})
		stopClean(t, p)
	})

	t.Run("missing slot, unfinished snapshot", func(t *testing.T) {
		dsn := newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		conn := pgConnect(t, dsn)
		writeEvents(t, conn, "snapnoslot", 0, 5)
		exec1(t, dsn, `CREATE SCHEMA outbox_cdc; CREATE TABLE outbox_cdc.checkpoints (slot text PRIMARY KEY, lsn pg_lsn NOT NULL,
			snapshot_done boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL DEFAULT now(),
			system_id text, timeline integer, database text)`)
		// A marker whose slot is gone (dropped, or never created).
		exec1(t, dsn, "INSERT INTO outbox_cdc.checkpoints (slot, lsn, snapshot_done) VALUES ('snapnoslot', pg_current_wal_lsn(), false)")
		p := runProc(t, writeConfig(t, yamlFor(t, dsn, "snapnoslot", "snapshot: {mode: pending}\n")))
		recs := consumeN(t, []string{topicFor("snapnoslot")}, 5, time.Minute, 2*time.Second)
		if len(recs) != 5 {
			t.Fatalf("%d records, want the 5 rows of the snapshot exactly once", len(recs))
		}
		stopClean(t, p)
	})

	t.Run("older checkpoint says done", func(t *testing.T) {
		dsn := newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		conn := pgConnect(t, dsn)
		writeEvents(t, conn, "snapold", 0, 5)
		exec1(t, dsn, `CREATE SCHEMA outbox_cdc; CREATE TABLE outbox_cdc.checkpoints (slot text PRIMARY KEY, lsn pg_lsn NOT NULL,
			snapshot_done boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL DEFAULT now(),
			system_id text, timeline integer, database text)`)
		// The checkpoint of an earlier slot of the same name: its snapshot
		// finished. The slot is gone, so a new snapshot is taken now.
		exec1(t, dsn, "INSERT INTO outbox_cdc.checkpoints (slot, lsn, snapshot_done) VALUES ('snapold', pg_current_wal_lsn(), true)")
		cfg := testConfig(t, dsn, "public.outbox", "snapold")
		cfg.Snapshot.Mode = "pending"
		cfg.Kafka.Brokers = []string{freeAddr(t)} // nothing is ever acknowledged: the snapshot stays in progress
		c := startConnector(t, cfg, func(pc *pipeline.Config) { pc.DrainTimeout = time.Second })
		waitFor(t, 30*time.Second, "the snapshot's 5 rows handed to the producer", func() bool {
			return testutil.ToFloat64(c.m.SnapshotEvents) == 5
		})
		// Several checkpoint intervals (200 ms) while the snapshot waits. An
		// observation window: what is checked is that nothing sets the flag
		// during it, and an absence has no signal to wait for.
		time.Sleep(1500 * time.Millisecond)
		var done bool
		if err := conn.QueryRow(context.Background(), "SELECT snapshot_done FROM outbox_cdc.checkpoints WHERE slot = 'snapold'").Scan(&done); err != nil || done {
			t.Fatalf("snapshot_done = %v (%v) while the new snapshot is unacknowledged, want false", done, err)
		}
		c.stop(t)
	})
}

// TestSnapshotOrder: snapshot rows go out in primary key order by default,
// or by snapshot.order_by (primary key as the tie-break).
func TestSnapshotOrder(t *testing.T) {
	for _, tt := range []struct {
		slot, column, extra string
		want                []int
	}{
		{"snaporderpk", "written_at", "", []int{1, 2, 3, 4, 5, 6}},      // no created_at: the key
		{"snapordercreated", "created_at", "", []int{6, 5, 4, 3, 2, 1}}, // created_at; 2 and 1 tie: insertion order
		{"snapordercol", "written_at", "  order_by: written_at\n", []int{6, 5, 4, 3, 2, 1}},
	} {
		t.Run(tt.slot, func(t *testing.T) {
			dsn := newDatabase(t)
			exec1(t, dsn, `CREATE TABLE outbox (id bigint PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text,
				event_type text NOT NULL, payload jsonb, `+tt.column+` timestamptz NOT NULL)`)
			// The time column runs against the key, and two rows tie.
			exec1(t, dsn, fmt.Sprintf(`INSERT INTO outbox SELECT g, '%s', 'one', 'E', jsonb_build_object('seq', g),
				timestamptz '2026-01-01' - make_interval(secs => CASE WHEN g IN (1, 2) THEN 2 ELSE g END)
				FROM generate_series(6, 1, -1) g`, tt.slot))
			p := runProc(t, writeConfig(t, yamlFor(t, dsn, tt.slot, "snapshot:\n  mode: pending\n"+tt.extra)))
			recs := consumeN(t, []string{topicFor(tt.slot)}, 6, time.Minute, time.Second)
			var got []int
			for _, r := range byPartition(recs) {
				for _, r := range r {
					var v struct{ Seq int }
					_ = json.Unmarshal(r.Value, &v)
					got = append(got, v.Seq)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("snapshot order %v, want %v", got, tt.want)
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		})
	}
}

// TestCheckpointTableUpgrade: a checkpoint table of the old shape that the
// connector's role owns gets the identity columns; its checkpoint (no
// identity) is trusted as it lies within the WAL, and the next save records
// the identity.
func TestCheckpointTableUpgrade(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	exec1(t, dsn, `CREATE SCHEMA outbox_cdc; CREATE TABLE outbox_cdc.checkpoints (slot text PRIMARY KEY, lsn pg_lsn NOT NULL,
		snapshot_done boolean NOT NULL DEFAULT false, updated_at timestamptz NOT NULL DEFAULT now())`)
	cfg := testConfig(t, dsn, "public.outbox", "upgrade")
	exec1(t, dsn, "CREATE PUBLICATION upgrade FOR TABLE outbox WITH (publish = 'insert')")
	exec1(t, dsn, "SELECT pg_create_logical_replication_slot('upgrade', 'pgoutput')")
	exec1(t, dsn, `INSERT INTO outbox_cdc.checkpoints (slot, lsn, snapshot_done)
		SELECT 'upgrade', confirmed_flush_lsn, true FROM pg_replication_slots WHERE slot_name = 'upgrade'`)
	conn := pgConnect(t, dsn)
	writeEvents(t, conn, "upgrade", 0, 5)
	startConnector(t, cfg)
	recs := consumeN(t, []string{topicFor("upgrade")}, 5, time.Minute, 2*time.Second)
	if len(recs) != 5 {
		t.Fatalf("%d records, want exactly 5", len(recs))
	}
	sys, tli, db := serverIdentity(t, dsn)
	var lastCommit time.Time
	if err := conn.QueryRow(context.Background(), "SELECT max(created_at) FROM outbox").Scan(&lastCommit); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "identity and commit time recorded", func() bool {
		var s, d *string
		var tl *int32
		var ct *time.Time
		_ = conn.QueryRow(context.Background(), "SELECT system_id, timeline, database, commit_time FROM outbox_cdc.checkpoints WHERE slot = 'upgrade'").
			Scan(&s, &tl, &d, &ct)
		// The last transaction began (created_at) before it committed; the
		// recorded time may be up to pipeline.coalesce (10 ms) early.
		return s != nil && *s == sys && tl != nil && *tl == tli && d != nil && *d == db && ct != nil &&
			!ct.Before(lastCommit.Add(-time.Second)) && ct.Before(time.Now().Add(time.Second))
	})
}
