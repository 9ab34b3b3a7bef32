package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestGapRepairExactlyOnceWhole: in exactly_once, a transaction written while
// the outbox was outside the publication that also emitted a table-less
// event has its row read by the repair and its message decoded by the
// stream, later; the repair's Kafka transaction waits for the stream to
// pass it, so read_committed sees the row and the message in one Kafka
// transaction (the same producer id and epoch), each once.
func TestGapRepairExactlyOnceWhole(t *testing.T) {
	dsn := newDatabase(t)
	if major := serverMajor(t, dsn); major < 14 {
		t.Skipf("outbox.message_prefix needs PostgreSQL 14; server is %d", major)
	}
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot = "gapwhole"
	dropSlotAtEnd(t, dsn, slot)
	addr := freeAddr(t)
	cfgPath := eosConfig(t, dsn, slot, addr)
	yaml, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	// A small buffer: the stream's events between the repair and a later
	// gap transaction fill it, which commits a Kafka transaction at once
	// unless the repair's hold keeps it open.
	y := strings.Replace(string(yaml), "  table: public.outbox\n", "  table: public.outbox\n  message_prefix: outbox\n", 1)
	cfgPath = writeConfig(t, strings.Replace(y, "  delivery: exactly_once\n", "  delivery: exactly_once\n  max_buffered_records: 10\n", 1))
	conn := pgConnect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// One aggregate: one partition.
	row, msg := gapWriters(ctx, t, slot)
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		committed(t, conn, func(tx pgx.Tx) { row(tx, "before") })
		waitCommitted(t, topicFor(slot), 1, time.Minute)
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	})
	if code != 1 || !strings.Contains(out, "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, out)
	}
	// In the gap, the connector down: rows the stream never decodes, with
	// messages it does.
	mixed := [][2]string{{"gap-row-1", "gap-msg-1"}, {"gap-row-2", "gap-msg-2"}, {"gap-row-3", "gap-msg-3"}}
	for i, m := range mixed {
		committed(t, conn, func(tx pgx.Tx) {
			if i%2 == 0 {
				row(tx, m[0])
				msg(tx, m[1])
			} else {
				msg(tx, m[1])
				row(tx, m[0])
			}
		})
		if i == 0 {
			// Twice the buffer of events the stream decodes after the repair.
			committed(t, conn, func(tx pgx.Tx) {
				for j := range 20 {
					msg(tx, fmt.Sprint("bulk-", j))
				}
			})
		}
	}
	committed(t, conn, func(tx pgx.Tx) { row(tx, "gap-row-only") })
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	p := startProcess(t, cfgPath, addr)
	committed(t, conn, func(tx pgx.Tx) { msg(tx, "last") })
	waitCommitted(t, topicFor(slot), 29, 2*time.Minute) // before, 3 x 2, 20 bulk, gap-row-only, last
	stopClean(t, p)

	// The Kafka transaction of each record: under KIP-890 (Kafka 4) every
	// transaction of a producer id has an epoch of its own.
	txnOf, copies := map[string]string{}, map[string]int{}
	for _, r := range readIsolated(t, true, topicFor(slot)) {
		if r.Attrs.IsControl() {
			continue
		}
		name := string(r.Value)
		if i := strings.Index(name, `"n": "`); i >= 0 {
			name = strings.TrimSuffix(name[i+len(`"n": "`):], `"}`)
		}
		txnOf[name] = fmt.Sprintf("%d/%d", r.ProducerID, r.ProducerEpoch)
		copies[name]++
	}
	t.Logf("kafka transaction of each event: %v", txnOf)
	for name, c := range copies {
		if c != 1 {
			t.Errorf("read_committed has %d copies of %s", c, name)
		}
	}
	for _, m := range mixed {
		if copies[m[0]] == 0 || copies[m[1]] == 0 {
			t.Fatalf("missing %v: have %v\nlog:\n%s", m, copies, p.output())
		}
		if txnOf[m[0]] != txnOf[m[1]] {
			t.Errorf("%s in Kafka transaction %s, %s in %s: the transaction was split\nlog:\n%s", m[0], txnOf[m[0]], m[1], txnOf[m[1]], p.output())
		}
	}
}

// waitCommitted waits until read_committed has at least n records of topic.
func waitCommitted(t *testing.T, topic string, n int, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d committed records on %s", n, topic), func() bool {
		got := 0
		for _, r := range readIsolated(t, true, topic) {
			if !r.Attrs.IsControl() {
				got++
			}
		}
		return got >= n
	})
}
