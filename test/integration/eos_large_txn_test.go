package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// TestExactlyOnceLargeTransaction: exactly_once, one PostgreSQL transaction
// of 30,000 rows with kafka.max_buffered_records 500. It is committed in
// parts of 500 (sink/exactlyonce/split.go), so read_committed sees its first
// parts while the rest is being produced; the connector is killed (SIGKILL)
// then, and the restart passes over the committed parts. read_committed
// then sees every row exactly once, in order, each carrying its part, the
// last ones "n/n". Before the split, the transaction was one Kafka
// transaction kept whole in memory: nothing of it was visible before its
// end, and this test timed out waiting for the first part.
//
// "with a change while stopped": between the kill and the restart the
// outbox leaves the publication, rows are written, and it comes back. The
// restart repairs that gap at the large transaction's commit (not at its
// begin, where the repair would read its rows, committed parts included,
// and publish them again), so each row is still once, and the gap's rows
// come after the transaction, as they were written.
func TestExactlyOnceLargeTransaction(t *testing.T) {
	t.Run("killed", func(t *testing.T) { largeTxn(t, "eoslarge", false, true) })
	t.Run("with a change while stopped", func(t *testing.T) { largeTxn(t, "eoslargegap", true, true) })
	// The source's first transaction: no position yet; the parts carry
	// the run's start (the slot it created).
	t.Run("first of the source", func(t *testing.T) { largeTxn(t, "eoslargefirst", false, false) })
}

func largeTxn(t *testing.T, slot string, change, warm bool) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const rows, max = 30_000, 500
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	base, err := os.ReadFile(eosConfig(t, dsn, slot, addr))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := writeConfig(t, strings.Replace(string(base), "kafka:\n", "kafka:\n  max_buffered_records: "+strconv.Itoa(max)+"\n", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("eoslarge%d", dbCounter.Add(1))
	topic := topicFor(agg)
	conn := pgConnect(t, dsn)

	p := startProcess(t, cfgPath, addr)
	want := map[eosEvent]bool{}
	before := 0
	if warm {
		// A first transaction: the source has a position.
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'warm', 'E', '{"W": 0, "Txn": 1, "I": 0, "N": 1}')`, agg); err != nil {
			t.Fatal(err)
		}
		p.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 1)
		want[eosEvent{W: 0, Txn: 1, I: 0, N: 1}] = true
		before = 1
	}
	// One transaction, one key per 1,000 rows; Txn numbers the rows, so
	// that onceInOrder checks their order per key.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, 'big' || (i / 1000), 'E', jsonb_build_object('W', 1, 'Txn', i + 1, 'I', 0, 'N', $2::int)
		FROM generate_series(0, $2::int - 1) i`, agg, rows); err != nil {
		t.Fatal(err)
	}
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", float64(before+2*max))
	p.kill()
	first := p.output()
	visible := len(readIsolated(t, true, topic))
	if visible <= before || visible >= before+rows {
		t.Fatalf("read_committed saw %d records when the connector was killed, want some parts of the transaction and not all\n%s",
			visible, first)
	}

	for i := range rows {
		want[eosEvent{W: 1, Txn: i + 1, I: 0, N: rows}] = true
	}
	if change {
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
		for i := range 3 { // on a key of the large transaction: after it
			if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, 'big0', 'E', jsonb_build_object('W', 2, 'Txn', $2::int, 'I', 0, 'N', 3))`, agg, rows+1+i); err != nil {
				t.Fatal(err)
			}
			want[eosEvent{W: 2, Txn: rows + 1 + i, I: 0, N: 3}] = true
		}
		exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	}
	p = startProcess(t, cfgPath, addr)
	waitFor(t, 3*time.Minute, "every row visible to read_committed", func() bool {
		return len(readIsolated(t, true, topic)) >= len(want)
	})
	stopClean(t, p)
	recs := readIsolated(t, true, topic)
	problems := onceInOrder(recs, want)
	problems = append(problems, partHeaders(recs, rows, max)...)
	if len(problems) > 0 {
		t.Fatalf("read_committed, %d records for %d events (%d visible at the kill): %s\nfirst run:\n%s\nrestart:\n%s",
			len(recs), len(want), visible, strings.Join(problems, "; "), first, p.output())
	}
	t.Logf("%d visible at the kill; after the restart %d records, each once, in order", visible, len(recs))
}

// partHeaders checks the txn and txn_part headers of the large
// transaction's events: all one transaction, parts non-decreasing per key,
// the last part "n/n" and every part before it a number below n.
func partHeaders(recs []*kgo.Record, rows, max int) []string {
	var problems []string
	txn, last := "", 0
	lastByKey := map[string]int{}
	lastParts := 0
	for _, r := range recs {
		var e eosEvent
		if json.Unmarshal(r.Value, &e) != nil || e.W != 1 {
			continue
		}
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		if txn == "" {
			txn = h[wire.HeaderTxn]
		}
		if h[wire.HeaderTxn] == "" || h[wire.HeaderTxn] != txn {
			return append(problems, fmt.Sprintf("event %d: txn header %q, want one transaction's (%q)", e.Txn, h[wire.HeaderTxn], txn))
		}
		part, n, isLast := strings.Cut(h[wire.HeaderTxnPart], "/")
		i, err := strconv.Atoi(part)
		if err != nil || i < 1 {
			return append(problems, fmt.Sprintf("event %d: txn_part %q", e.Txn, h[wire.HeaderTxnPart]))
		}
		if isLast {
			if n != part {
				return append(problems, fmt.Sprintf("event %d: last part %q is not n/n", e.Txn, h[wire.HeaderTxnPart]))
			}
			last = i
			lastParts++
		}
		if i < lastByKey[string(r.Key)] {
			problems = append(problems, fmt.Sprintf("event %d: part %d after part %d of its key", e.Txn, i, lastByKey[string(r.Key)]))
		}
		lastByKey[string(r.Key)] = i
	}
	if want := (rows - 1) / max; last != want+1 || lastParts == 0 || lastParts > max {
		problems = append(problems, fmt.Sprintf("last part %d with %d events, want part %d of at most %d events", last, lastParts, want+1, max))
	}
	return problems
}

// TestExactlyOnceLargeTransactionUnderQuota: exactly_once, one transaction
// of 12,000 rows (~300 bytes a record) under a producer quota of 100 KB/s on
// the connector's client id (as a shared cluster sets), with
// kafka.transaction_timeout 5s and parts of 3,000. A part (~900 KB) takes
// about 9 s: the broker aborts it at 5 s and bumps the producer's epoch.
// The connector must take that for the timeout, not for another instance
// ("fenced", exit 1, again at every restart, as the black-box run
// saw), and commit the transaction in smaller parts: every row once, in
// order, for read_committed.
func TestExactlyOnceLargeTransactionUnderQuota(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	const slot, rows = "eosquota", 12_000
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	clientID := fmt.Sprintf("eosquota-%d", dbCounter.Add(1))
	base, err := os.ReadFile(eosConfig(t, dsn, slot, addr))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := writeConfig(t, strings.Replace(string(base), "kafka:\n", "kafka:\n  max_buffered_records: 3000\n  transaction_timeout: 5s\n  client_id: "+clientID+"\n", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	adm := newAdmin(t)
	entity := kadm.ClientQuotaEntity{{Type: "client-id", Name: &clientID}}
	if _, err := adm.AlterClientQuotas(ctx, []kadm.AlterClientQuotaEntry{{Entity: entity,
		Ops: []kadm.AlterClientQuotaOp{{Key: "producer_byte_rate", Value: 100_000}}}}); err != nil {
		t.Fatalf("set the quota: %v", err)
	}
	defer func() {
		_, _ = adm.AlterClientQuotas(context.Background(), []kadm.AlterClientQuotaEntry{{Entity: entity,
			Ops: []kadm.AlterClientQuotaOp{{Key: "producer_byte_rate", Remove: true}}}})
	}()
	agg := fmt.Sprintf("eosquota%d", dbCounter.Add(1))
	topic := topicFor(agg)
	conn := pgConnect(t, dsn)
	p := startProcess(t, cfgPath, addr)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT $1, 'q' || (i / 1000), 'E', jsonb_build_object('W', 1, 'Txn', i + 1, 'I', 0, 'N', $2::int, 'pad', repeat('x', 150))
		FROM generate_series(0, $2::int - 1) i`, agg, rows); err != nil {
		t.Fatal(err)
	}
	want := map[eosEvent]bool{}
	for i := range rows {
		want[eosEvent{W: 1, Txn: i + 1, I: 0, N: rows}] = true
	}
	waitFor(t, 4*time.Minute, "every row visible to read_committed", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		return len(readIsolated(t, true, topic)) >= rows
	})
	stopClean(t, p)
	recs := readIsolated(t, true, topic)
	if problems := onceInOrder(recs, want); len(problems) > 0 {
		t.Fatalf("read_committed, %d records for %d events: %s\n%s", len(recs), len(want), strings.Join(problems, "; "), p.output())
	}
	if !strings.Contains(p.output(), "kafka transaction timed out") {
		t.Fatalf("no Kafka transaction timed out: the quota did not slow a part past the timeout, the test tested nothing\n%s", p.output())
	}
	t.Logf("%d records, each once, in order; the connector said:\n%s", len(recs), grepLines(p.output(), "timed out"))
}

// grepLines are out's lines that contain s.
func grepLines(out, s string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
