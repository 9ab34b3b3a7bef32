package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestExactlyOnceSnapshotKilledMidway: snapshot.mode pending with
// exactly_once. 200,000 rows are in the outbox when the slot is created;
// the snapshot is committed in Kafka transactions of 2,000 events (parts of
// one pseudo-transaction), and the connector is killed (SIGKILL) once some
// are committed, before the last. The restart takes the snapshot again
// (the checkpoint says it did not finish) and reads back what the topic
// holds first: read_committed then sees every row once, and the rows
// written after the restart once, streamed.
func TestExactlyOnceSnapshotKilledMidway(t *testing.T) {
	const (
		rows  = 200_000
		later = 10
		slot  = "eossnap"
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
	cfgPath := writeConfig(t, string(base)+"snapshot:\n  mode: pending\n")
	env := []string{"OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS=2000"}

	p := startProc(t, cfgPath, addr, false, env...)
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 6000)
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
	writeEvents(t, conn, slot, rows+1, rows+1+later)
	waitCommitted(t, topic, rows+later, 2*time.Minute)

	seen := map[int]int{}
	for _, r := range readIsolated(t, true, topic) {
		if r.Attrs.IsControl() {
			continue
		}
		var v struct{ Seq int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("record at %d: %v", r.Offset, err)
		}
		seen[v.Seq]++
	}
	var missing, twice []int
	for seq := 1; seq <= rows+later; seq++ {
		switch n := seen[seq]; {
		case n == 0:
			missing = append(missing, seq)
		case n > 1:
			twice = append(twice, seq)
		}
	}
	if len(missing) > 0 || len(twice) > 0 || len(seen) != rows+later {
		t.Fatalf("read_committed: %d distinct seqs, want %d; %d missing (first %v), %d more than once (first %v)",
			len(seen), rows+later, len(missing), head(missing), len(twice), head(twice))
	}
	stopClean(t, p)
}

// committedSeqCount is how many records read_committed sees on topic.
func committedSeqCount(t *testing.T, topic string) int {
	t.Helper()
	n := 0
	for _, r := range readIsolated(t, true, topic) {
		if !r.Attrs.IsControl() {
			n++
		}
	}
	return n
}

func head(s []int) []int { return s[:min(len(s), 5)] }
