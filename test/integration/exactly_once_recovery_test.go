package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestExactlyOnceRestoreRefused: PostgreSQL is restored from a file-level
// copy taken before the connector committed thousands of events, so the
// position committed to Kafka lies beyond the restored server's WAL. The
// connector refuses to start (exit 1, naming the position, what differs
// and the tombstone that forgets it) instead of skipping, and confirming,
// everything the restored server commits below that position; the slot does
// not move. After the fix it gives, the rows written since the restore are
// published.
func TestExactlyOnceRestoreRefused(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs its own PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := newRestoredServer(ctx, t, "eosrestore")
	pg, dsn, agg, rows := s.pg, s.dsn, s.agg, s.rows
	addr := freeAddr(t)
	cfgPath := eosConfig(t, dsn, "eosrestore", addr)
	p := startProcess(t, cfgPath, addr)
	rows(0, 10, 0)
	p.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 10)
	stopClean(t, p)
	rows(10, 30, 0) // in the copy, but past its slot: the restored server sends them again
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	backup, err := pg.CopyData(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	p = startProcess(t, cfgPath, addr)
	rows(40, 2000, 2000) // about 4 MB of WAL past the copy
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 2030)
	stopClean(t, p)

	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.RestoreData(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	rows(5000, 50, 0) // what the restored server commits
	before := slotConfirmed(t, dsn, "eosrestore")
	code, out := runBinary(t, 90*time.Second, nil, "run", "--config", cfgPath)
	if code != 1 {
		t.Fatalf("exit %d after the restore, want 1 (the committed position is beyond this server's WAL):\n%s", code, out)
	}
	for _, want := range []string{"committed to Kafka", "beyond this server's WAL end", "tombstone"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, out)
		}
	}
	if after := slotConfirmed(t, dsn, "eosrestore"); after != before {
		t.Fatalf("the slot moved from %v to %v while the start was refused", before, after)
	}

	// The fix the refusal gives: a tombstone for the position's key.
	var sysID string
	if err := pgConnect(t, dsn).QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&sysID); err != nil {
		t.Fatal(err)
	}
	key := sysID + "/postgres/eosrestore"
	if !strings.Contains(out, key+"|NULL") {
		t.Errorf("the refusal does not name the key %s to forget:\n%s", key, out)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: positionsFor("eosrestore"), Key: []byte(key)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	p = startProcess(t, cfgPath, addr)
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 50)
	stopClean(t, p)
	var vals [][]byte
	for _, r := range readIsolated(t, true, topicFor(agg)) {
		vals = append(vals, r.Value)
	}
	if n := seqsFrom(t, vals, 5000); n != 50 {
		t.Fatalf("read_committed has %d of the 50 rows written after the restore", n)
	}
	// The restored slot sends seqs 10-39 again: they were published before
	// the restore, so the run after the tombstone reads them back and skips
	// them (readback.go); each row is in Kafka once.
	copies := seqCopies(t, vals)
	for _, r := range [][2]int{{0, 2040}, {5000, 5050}} {
		for seq := r[0]; seq < r[1]; seq++ {
			if copies[seq] != 1 {
				t.Fatalf("read_committed has %d copies of seq %d, want 1 (seqs 10-39 were streamed again by the restored server)", copies[seq], seq)
			}
		}
	}
}

// seqCopies counts the records of each seq among values.
func seqCopies(t *testing.T, values [][]byte) map[int]int {
	t.Helper()
	n := map[int]int{}
	for _, v := range values {
		var ev struct{ Seq int }
		if err := json.Unmarshal(v, &ev); err != nil {
			t.Fatalf("record value %q: %v", v, err)
		}
		n[ev.Seq]++
	}
	return n
}

// TestExactlyOnceVerify: verify, the command the lost-slot runbook prints,
// reads topics written in Kafka transactions to their end (the last offset
// of each partition is a commit marker, not a record) and finds every row.
func TestExactlyOnceVerify(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "eosverify")
	cfgPath := eosConfig(t, dsn, "eosverify", addr)
	p := startProcess(t, cfgPath, addr)
	since := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	writeEvents(t, pgConnect(t, dsn), fmt.Sprintf("eosverify%d", dbCounter.Add(1)), 0, 5)
	p.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 5)
	stopClean(t, p)
	code, v, out := runVerifyJSON(t, 2*time.Minute, "--config", cfgPath, "--since", since)
	if code != 0 || v.Rows != 5 || v.Found != 5 || v.Missing.Count != 0 {
		t.Fatalf("verify --json: exit %d, %+v; want exit 0 with 5 rows, 5 found, 0 missing:\n%s", code, v, out)
	}
}
