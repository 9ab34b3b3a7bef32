package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	const rows, later = 200_000, 10
	k := killSnapshot(t, "eossnap", rows, 6000)
	p := k.redo(t)
	writeEvents(t, k.conn, k.slot, rows+1, rows+1+later)
	waitCommitted(t, k.topic, rows+later, 2*time.Minute)
	k.eachOnce(t, snapshotSeqs(t, k.topic, false), rows+later)
	stopClean(t, p)
}

// killedSnapshot is an exactly_once connector on slot killed (SIGKILL) in
// the middle of its pending snapshot: first of its rows committed.
type killedSnapshot struct {
	slot, topic, addr, base string
	conn                    *pgx.Conn
	env                     []string
	first                   int
}

// killSnapshot writes rows into a new outbox, starts a connector in
// snapshot.mode pending committing parts of 2,000 events (extra: more of
// its environment) and kills it once killAfter events are published; a
// snapshot committed whole by then fails the test, which tested nothing.
func killSnapshot(t *testing.T, slot string, rows, killAfter int, extra ...string) *killedSnapshot {
	t.Helper()
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	exec1(t, dsn, fmt.Sprintf(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT '%s', 'agg-' || (g %% 50), 'Created', jsonb_build_object('seq', g) FROM generate_series(1, %d) g`, slot, rows))
	k := &killedSnapshot{slot: slot, topic: topicFor(slot), addr: freeAddr(t),
		env: append([]string{"OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS=2000"}, extra...)}
	base, err := os.ReadFile(eosConfig(t, dsn, slot, k.addr))
	if err != nil {
		t.Fatal(err)
	}
	k.base = string(base)
	p := startProc(t, k.config(t, "pending"), k.addr, false, k.env...)
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", float64(killAfter))
	p.kill()
	if k.first = committedSeqCount(t, k.topic); k.first >= rows {
		t.Fatalf("the snapshot was committed whole (%d events) before the kill: the test tested nothing", k.first)
	}
	t.Logf("killed with %d of %d snapshot events committed", k.first, rows)
	k.conn = pgConnect(t, dsn)
	return k
}

// config writes the connector's configuration with snapshot.mode mode.
func (k *killedSnapshot) config(t *testing.T, mode string) string {
	t.Helper()
	return writeConfig(t, k.base+"snapshot:\n  mode: "+mode+"\n")
}

// redo starts the connector again in snapshot.mode pending and waits until
// the snapshot it takes again is done (snapshot_done).
func (k *killedSnapshot) redo(t *testing.T) *process {
	t.Helper()
	p := startProc(t, k.config(t, "pending"), k.addr, false, k.env...)
	waitFor(t, 3*time.Minute, "the snapshot taken again, done", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		var done bool
		err := k.conn.QueryRow(context.Background(), "SELECT snapshot_done FROM outbox_cdc.checkpoints WHERE slot = $1", k.slot).Scan(&done)
		return err == nil && done
	})
	return p
}

// eachOnce fails the test unless seen holds each seq from 1 to want once.
func (k *killedSnapshot) eachOnce(t *testing.T, seen map[int]int, want int) {
	t.Helper()
	var missing, twice []int
	for seq := 1; seq <= want; seq++ {
		switch n := seen[seq]; {
		case n == 0:
			missing = append(missing, seq)
		case n > 1:
			twice = append(twice, seq)
		}
	}
	if len(missing) > 0 || len(twice) > 0 || len(seen) != want {
		t.Fatalf("read_committed: %d distinct seqs, want %d; %d missing (first %v), %d more than once (first %v); %d were committed before the kill",
			len(seen), want, len(missing), head(missing), len(twice), head(twice), k.first)
	}
}

// snapshotSeqs reads topic with read_committed and counts each seq;
// structured: the value is a structured CloudEvent whose data holds it.
func snapshotSeqs(t *testing.T, topic string, structured bool) map[int]int {
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
