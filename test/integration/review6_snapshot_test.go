package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// review6: reproductions for the pending snapshot in exactly_once.

// review6SeqCounts reads topic with read_committed and counts each seq;
// structured: the value is a structured CloudEvent whose data holds it.
func review6SeqCounts(t *testing.T, topic string, structured bool) map[int]int {
	t.Helper()
	seen := map[int]int{}
	for _, r := range readIsolated(t, true, topic) {
		if r.Attrs.IsControl() {
			continue
		}
		var v struct {
			Seq  int
			Data struct{ Seq int }
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("record at %d: %v", r.Offset, err)
		}
		if structured {
			v.Seq = v.Data.Seq
		}
		seen[v.Seq]++
	}
	return seen
}

func review6Check(t *testing.T, seen map[int]int, want int) (missing, twice []int) {
	for seq := 1; seq <= want; seq++ {
		switch n := seen[seq]; {
		case n == 0:
			missing = append(missing, seq)
		case n > 1:
			twice = append(twice, seq)
		}
	}
	return missing, twice
}

// TestReview6SnapshotRedoCloudEventsStructured: as
// TestExactlyOnceSnapshotKilledMidway, with kafka.format
// cloudevents-structured. The structured value carries "time", which for a
// snapshot row is the snapshot's start (publishRows' time.Now(),
// pipeline/snapshot.go). The redo's read-back looks rows up by topic, key,
// id and value: the value of every row differs from the interrupted run's,
// nothing is found, and everything the interrupted snapshot committed is
// published again.
func TestReview6SnapshotRedoCloudEventsStructured(t *testing.T) {
	review6KilledRedo(t, "r6snapce", true, "OUTBOX_CDC_KAFKA_FORMAT=cloudevents-structured")
}

// TestReview6SnapshotRedoWithoutIDHeader: outbox.standard_headers without
// id. The read-back keeps only records with an id header (readback.go load:
// !r.HasID), so a snapshot taken again would find none of the interrupted
// one's records and publish them all again (the review's reproduction:
// 4000 duplicates). The combination is refused at start now, naming the key
// and the fix; nothing is published.
func TestReview6SnapshotRedoWithoutIDHeader(t *testing.T) {
	const slot = "r6snapnoid"
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	addr := freeAddr(t)
	base, err := os.ReadFile(eosConfig(t, dsn, slot, addr))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := writeConfig(t, string(base)+"snapshot:\n  mode: pending\n")
	code, out := runBinary(t, time.Minute, []string{"OUTBOX_CDC_OUTBOX_STANDARD_HEADERS=event_type,aggregate_type"}, "run", "--config", cfgPath)
	if code != 2 || !strings.Contains(out, "outbox.standard_headers") || !strings.Contains(out, "keep id in the list") {
		t.Fatalf("exit %d, want 2 naming outbox.standard_headers and the fix:\n%s", code, out)
	}
}

// review6KilledRedo: 40,000 rows, parts of 2,000, SIGKILL once 4,000 are
// committed, a restart that takes the snapshot again; every row once for
// read_committed.
func review6KilledRedo(t *testing.T, slot string, structured bool, extra ...string) {
	const rows = 40_000
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	exec1(t, dsn, fmt.Sprintf(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT '%s', 'agg-' || (g %% 50), 'Created', jsonb_build_object('seq', g) FROM generate_series(1, %d) g`, slot, rows))
	addr := freeAddr(t)
	base, err := os.ReadFile(eosConfig(t, dsn, slot, addr))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := writeConfig(t, string(base)+"snapshot:\n  mode: pending\n")
	env := append([]string{"OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS=2000"}, extra...)

	p := startProc(t, cfgPath, addr, false, env...)
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 4000)
	p.kill()
	topic := topicFor(slot)
	first := committedSeqCount(t, topic)
	if first >= rows {
		t.Fatalf("the snapshot was committed whole (%d events) before the kill: the test tested nothing", first)
	}
	t.Logf("killed with %d of %d snapshot events committed", first, rows)

	p = startProc(t, cfgPath, addr, false, env...)
	conn := pgConnect(t, dsn)
	waitFor(t, 3*time.Minute, "the snapshot taken again, done", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		var done bool
		err := conn.QueryRow(context.Background(), "SELECT snapshot_done FROM outbox_cdc.checkpoints WHERE slot = $1", slot).Scan(&done)
		return err == nil && done
	})
	waitCommitted(t, topic, rows, 2*time.Minute)
	seen := review6SeqCounts(t, topic, structured)
	missing, twice := review6Check(t, seen, rows)
	if len(missing) > 0 || len(twice) > 0 {
		t.Fatalf("read_committed: %d distinct seqs, want %d; %d missing (first %v), %d more than once (first %v); %d were committed before the kill",
			len(seen), rows, len(missing), head(missing), len(twice), head(twice), first)
	}
	stopClean(t, p)
}

// TestReview6SnapshotInterruptedThenModeNone: the snapshot is interrupted
// (SIGKILL after some parts committed), and the operator gives it up:
// snapshot.mode none, which the start allows with a warning ("the
// checkpoint records an unfinished initial snapshot, which snapshot.mode
// none does not take again", plan.go) and which at_least_once follows by
// streaming from the slot. In exactly_once the position committed by the
// snapshot's last part, Part{Final: consistent point, Xid: 0}, is a
// resume the stream can never satisfy: SetFloor keeps it (its Final is not
// below the slot's consistent point) and the first streamed transaction
// stops the run (failSplit: "was not decoded again: the stream is past
// it"), at every start, with a fix about changed rows or routing.
func TestReview6SnapshotInterruptedThenModeNone(t *testing.T) {
	const (
		rows  = 40_000
		later = 10
		slot  = "r6snapnone"
	)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	exec1(t, dsn, fmt.Sprintf(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT '%s', 'agg-' || (g %% 50), 'Created', jsonb_build_object('seq', g) FROM generate_series(1, %d) g`, slot, rows))
	addr := freeAddr(t)
	base, err := os.ReadFile(eosConfig(t, dsn, slot, addr))
	if err != nil {
		t.Fatal(err)
	}
	pending := writeConfig(t, string(base)+"snapshot:\n  mode: pending\n")
	none := writeConfig(t, string(base)+"snapshot:\n  mode: none\n")
	env := []string{"OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS=2000"}

	p := startProc(t, pending, addr, false, env...)
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 4000)
	p.kill()
	topic := topicFor(slot)
	first := committedSeqCount(t, topic)
	if first >= rows {
		t.Fatalf("the snapshot was committed whole (%d events) before the kill: the test tested nothing", first)
	}
	t.Logf("killed with %d of %d snapshot events committed; restarting with snapshot.mode none", first, rows)

	p = startProc(t, none, addr, false, env...)
	conn := pgConnect(t, dsn)
	time.Sleep(2 * time.Second) // streaming
	writeEvents(t, conn, slot, rows+1, rows+1+later)
	waitFor(t, time.Minute, "the events written after the restart, committed", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		return committedSeqCount(t, topic) >= first+later
	})
	stopClean(t, p)
}
