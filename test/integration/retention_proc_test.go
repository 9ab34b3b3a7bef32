package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// retentionYAML is the configuration of a connector binary with outbox
// retention on public.outbox; missing topics hold their events.
func retentionYAML(t *testing.T, dsn, slot, outbox, kafka string) string {
	dropSlotAtEnd(t, dsn, slot)
	return writeConfig(t, fmt.Sprintf(`postgres: {dsn: %q, slot: %s, publication: %s, status_interval: 100ms, reconnect_backoff_max: 1s}
outbox: {table: public.outbox, retention_interval: 200ms, retention_duty_cycle: 0.5, %s}
kafka: {brokers: [%s], dlq_topic: %s, topic: %q, auto_create_topics: false, unknown_topic_timeout: 10m, %s}
http: {listen: ''}
`, dsn, slot, slot, outbox, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, kafka))
}

func startRetention(t *testing.T, cfgPath string) *process {
	t.Helper()
	addr := freeAddr(t)
	return startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
}

// TestRetentionKillDuringBatch: a kill -9 while a batch deletes leaves every
// row either in the table or deleted with its whole batch, and the next
// start deletes the rest.
func TestRetentionKillDuringBatch(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	// Slow batches (2 ms a row), so that the kill lands inside one.
	exec1(t, dsn, `CREATE OR REPLACE FUNCTION record_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(0.002); INSERT INTO deleted_rows (id, tbl, created_at) VALUES (OLD.id, TG_TABLE_NAME, OLD.created_at); RETURN OLD; END $$`)
	aggType := "retkill" + runID
	appendTimeTopic(t, topicFor(aggType))
	const rows, batch = 1500, 100
	cfgPath := retentionYAML(t, dsn, "retkill", fmt.Sprintf("retention: 1h, retention_batch_size: %d", batch), "")
	conn := pgConnect(t, dsn)
	p := startRetention(t, cfgPath)
	// created_at set by the application two hours back: past the retention
	// once delivered.
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT $1, 'k' || (g % 7), 'E', '{}', now() - interval '2 hours' FROM generate_series(1, $2) g`, aggType, rows)
	inBatch := func() bool {
		return queryInt(t, conn, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'WITH doomed%' AND state = 'active'`) > 0
	}
	waitFor(t, 2*time.Minute, "a batch deleting after two were committed", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") >= 2*batch && inBatch()
	})
	p.kill()
	waitFor(t, time.Minute, "the killed connector's batch ended", func() bool {
		return queryInt(t, conn, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'WITH doomed%'`) == 0
	})
	left := queryInt(t, conn, "SELECT count(*) FROM outbox")
	deleted := queryInt(t, conn, "SELECT count(*) FROM deleted_rows")
	both := queryInt(t, conn, "SELECT count(*) FROM outbox o JOIN deleted_rows d USING (id)")
	if left+deleted != rows || deleted%batch != 0 || both != 0 || left == 0 {
		t.Fatalf("after the kill: %d rows left, %d deleted (batches of %d), %d both; want %d in all, whole batches", left, deleted, batch, both, rows)
	}
	// status shows what is left: rows two hours old.
	code, out := runBinary(t, time.Minute, nil, "status", "--json", "--config", cfgPath)
	var st struct {
		Tables []struct {
			OldestRowAge *float64 `json:"oldest_row_age_seconds"`
			SizeBytes    *int64   `json:"size_bytes"`
		} `json:"tables"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 || len(st.Tables) != 1 || st.Tables[0].SizeBytes == nil ||
		*st.Tables[0].SizeBytes <= 0 || *st.Tables[0].OldestRowAge < 7100 || *st.Tables[0].OldestRowAge > 7300 {
		t.Errorf("status: exit %d, %v:\n%s", code, err, out)
	}
	p = startRetention(t, cfgPath)
	waitFor(t, 2*time.Minute, "the rest deleted after the restart", func() bool { return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0 })
	p.waitMetric(t, 10*time.Second, "outbox_cdc_outbox_rows_deleted_total", float64(left))
	stopClean(t, p)
	var ids []string
	r, err := conn.Query(context.Background(), "SELECT id::text FROM deleted_rows")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id string
		if err := r.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	r.Close()
	recs := consumeN(t, []string{topicFor(aggType)}, rows, time.Minute, 0)
	if n := checkDeletedAfterAck(t, conn, recs, ids); n != rows {
		t.Errorf("%d rows deleted, want %d", n, rows)
	}
	t.Logf("killed with %d of %d rows deleted", deleted, rows)
}

// TestRetentionHeldByGap: after the outbox left the publication, nothing
// is deleted until the gap repair's rows are delivered, although the rows
// before the gap are delivered and past the retention.
func TestRetentionHeldByGap(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	okType, gapType := "retgapok"+runID, "retgap"+runID
	appendTimeTopic(t, topicFor(okType))
	const slot, retain = "retgap", 3 * time.Second
	cfgPath := retentionYAML(t, dsn, slot, "retention: "+retain.String(), "")
	conn := pgConnect(t, dsn)
	var ids []string
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		ids = insertRows(t, conn, "outbox", okType, 10)
		consumeN(t, []string{topicFor(okType)}, 10, time.Minute, 0)
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	})
	if code != 1 || !strings.Contains(out, "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, out)
	}
	ids = append(ids, insertRows(t, conn, "outbox", gapType, 5)...) // in the gap: read back by the repair
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	time.Sleep(retain + time.Second)
	before := queryInt(t, conn, "SELECT count(*) FROM deleted_rows")
	p := startRetention(t, cfgPath)
	time.Sleep(2 * retain) // the repair's rows wait for their topic
	if n := queryInt(t, conn, "SELECT count(*) FROM deleted_rows"); n != before {
		t.Fatalf("%d rows deleted while the gap's repair was not delivered, %d before", n, before)
	}
	if n := queryInt(t, conn, "SELECT count(*) FROM outbox WHERE aggregate_type = $1", gapType); n != 5 {
		t.Fatalf("%d of the gap's 5 rows left before the repair delivered them", n)
	}
	appendTimeTopic(t, topicFor(gapType))
	waitFor(t, time.Minute, "every row deleted once the repair is delivered", func() bool {
		return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0
	})
	stopClean(t, p)
	recs := consumeN(t, []string{topicFor(okType), topicFor(gapType)}, len(ids), time.Minute, 0)
	checkDeletedAfterAck(t, conn, recs, ids)
}

// TestRetentionExactlyOnce: in exactly_once a row is deleted only once its
// event's Kafka transaction committed; an event that waits for its topic
// holds back every later row.
func TestRetentionExactlyOnce(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	okType, heldType := "reteosok"+runID, "reteosheld"+runID
	appendTimeTopic(t, topicFor(okType))
	const slot = "reteos"
	cfgPath := retentionYAML(t, dsn, slot, "retention: 1s",
		fmt.Sprintf("delivery: exactly_once, transaction_interval: 5ms, positions_topic: %s", positionsFor(slot)))
	conn := pgConnect(t, dsn)
	p := startRetention(t, cfgPath)
	ids := insertRows(t, conn, "outbox", okType, 20)
	waitFor(t, time.Minute, "the first rows deleted", func() bool { return queryInt(t, conn, "SELECT count(*) FROM deleted_rows") == 20 })
	ids = append(ids, insertRows(t, conn, "outbox", heldType, 5)...)
	ids = append(ids, insertRows(t, conn, "outbox", okType, 10)...)
	time.Sleep(3 * time.Second)
	if n := queryInt(t, conn, "SELECT count(*) FROM deleted_rows"); n != 20 {
		t.Fatalf("%d rows deleted, want 20: the later ones are not committed to Kafka", n)
	}
	appendTimeTopic(t, topicFor(heldType))
	waitFor(t, time.Minute, "every row deleted", func() bool { return queryInt(t, conn, "SELECT count(*) FROM outbox") == 0 })
	stopClean(t, p)
	recs := readIsolated(t, true, topicFor(okType), topicFor(heldType))
	if n := checkDeletedAfterAck(t, conn, recs, ids); n != len(ids) {
		t.Errorf("%d rows deleted, want %d", n, len(ids))
	}
}

// TestRetentionPrivileges: check names the GRANT retention needs, and run
// refuses to start without it.
func TestRetentionPrivileges(t *testing.T) {
	dsn := newDatabase(t)
	retentionTable(t, dsn, "outbox")
	const role, slot = "cdc_ret_app", "retpriv"
	exec1(t, dsn, "DO $$ BEGIN CREATE ROLE "+role+" LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
	exec1(t, dsn, "GRANT SELECT ON outbox TO "+role)
	exec1(t, dsn, fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE outbox WITH (publish = 'insert')", slot))
	appDSN := strings.Replace(dsn, "postgres@", role+"@", 1)
	cfgPath := retentionYAML(t, appDSN, slot, "retention: 48h", "")
	ckpt := "OUTBOX_CDC_CHECKPOINT_STORE=file"
	file := "OUTBOX_CDC_CHECKPOINT_FILE=" + filepath.Join(t.TempDir(), "ckpt")
	grant := fmt.Sprintf(`GRANT DELETE ON "public"."outbox" TO %q`, role)
	code, out := runBinary(t, time.Minute, []string{ckpt, file}, "check", "--config", cfgPath)
	if code == 0 || !strings.Contains(out, "cannot DELETE") || !strings.Contains(out, grant) {
		t.Fatalf("check: exit %d, want a failure naming %s:\n%s", code, grant, out)
	}
	code, out = runBinary(t, time.Minute, []string{ckpt, file}, "run", "--config", cfgPath)
	if code == 0 || !strings.Contains(out, `cannot DELETE from`) || !strings.Contains(out, "GRANT DELETE ON") {
		t.Fatalf("run: exit %d, want a refusal naming %s:\n%s", code, grant, out)
	}
	exec1(t, dsn, "GRANT DELETE ON outbox TO "+role)
	// The history marks table, which this role may not create (docs/operations.md, least privilege).
	code, out = runBinary(t, time.Minute, []string{ckpt, file}, "check", "--config", cfgPath)
	if code == 0 || !strings.Contains(out, "history_marks") {
		t.Fatalf("check without the history marks table: exit %d, want a failure naming it:\n%s", code, out)
	}
	exec1(t, dsn, `CREATE SCHEMA outbox_cdc; CREATE TABLE outbox_cdc.history_marks (slot text NOT NULL, mark bigint NOT NULL,
		written_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (slot, mark));
		GRANT USAGE ON SCHEMA outbox_cdc TO `+role+`; GRANT SELECT, INSERT, DELETE ON outbox_cdc.history_marks TO `+role)
	if code, out := runBinary(t, time.Minute, []string{ckpt, file}, "check", "--config", cfgPath); code != 0 || strings.Contains(out, "DELETE") {
		t.Fatalf("check after the GRANT: exit %d:\n%s", code, out)
	}
	var slots int
	if err := pgConnect(t, dsn).QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 0 {
		t.Errorf("the refused run left a slot behind")
	}
}
