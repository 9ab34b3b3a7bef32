package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Quarantine (dlq.mode quarantine) with kafka.delivery exactly_once: the
// dead letter, the parked records and the quarantine's state record are
// written in the Kafka transaction of the events around them, and a
// redrive's records with its tombstone in one Kafka transaction. Every
// check reads with read_committed (readIsolated).

// newEOSQuarantineSetup is newQuarantineSetup with kafka.delivery
// exactly_once and a positions topic of the test's own. dlq.mode stays
// unset: with exactly_once, as with at_least_once, it defaults to
// quarantine.
func newEOSQuarantineSetup(t *testing.T, slot string) *quarantineSetup {
	t.Helper()
	q := newQuarantineSetup(t, slot)
	base, err := os.ReadFile(q.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(base), "kafka: {", fmt.Sprintf(
		"kafka: {delivery: exactly_once, transaction_interval: 5ms, positions_topic: %s, ", positionsFor(slot)), 1)
	if yaml == string(base) || strings.Contains(yaml, "dlq:") {
		t.Fatalf("unexpected quarantine setup configuration:\n%s", base)
	}
	q.cfgPath = writeConfig(t, yaml)
	return q
}

// committedSeqs is what read_committed sees on topic now: the seq of each
// record, by key, in offset order.
func committedSeqs(t *testing.T, topic string) map[string][]int {
	t.Helper()
	return seqsByKey(t, readIsolated(t, true, topic))
}

// waitKeyCommitted waits until read_committed sees at least n records of
// key on topic and returns what it sees then, by key.
func waitKeyCommitted(t *testing.T, timeout time.Duration, topic, key string, n int) map[string][]int {
	t.Helper()
	var got map[string][]int
	waitFor(t, timeout, fmt.Sprintf("%d records of %s on %s for read_committed", n, key, topic), func() bool {
		got = committedSeqs(t, topic)
		return len(got[key]) >= n
	})
	return got
}

// stateRecords are the records of aggregate agg on q's state topic, in
// order, nil for a tombstone.
func stateRecords(t *testing.T, q *quarantineSetup, committed bool, agg string) []*quarantine.StateRecord {
	t.Helper()
	var out []*quarantine.StateRecord
	for _, r := range readIsolated(t, committed, q.state) {
		if !strings.HasSuffix(string(r.Key), "/"+agg) {
			continue
		}
		if r.Value == nil {
			out = append(out, nil)
			continue
		}
		var rec quarantine.StateRecord
		if err := json.Unmarshal(r.Value, &rec); err != nil {
			t.Fatalf("state record %s: %v", r.Value, err)
		}
		out = append(out, &rec)
	}
	return out
}

// seqDiff says how got differs from want ("" if it does not), shortly.
func seqDiff(got, want []int) string {
	if slices.Equal(got, want) {
		return ""
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("%d records, want %d; at %d: %d, want %d", len(got), len(want), i, got[i], want[i])
		}
	}
	if len(got) > len(want) {
		extra := got[len(want):]
		return fmt.Sprintf("%d records, want %d; extra from %d on: %v", len(got), len(want), len(want), extra[:min(len(extra), 10)])
	}
	return fmt.Sprintf("%d records, want %d; missing from %d on", len(got), len(want), len(got))
}

// bigPayload is an event over the lowered limit.
func bigPayload(seq int) string {
	return fmt.Sprintf(`{"seq": %d, "blob": %q}`, seq, strings.Repeat("x", 2*lowered))
}

// TestExactlyOnceQuarantineParksLaterEvents is TestQuarantineParksLaterEvents
// with exactly_once and dlq.mode unset: the broker refuses the first of 20
// events of agg-1, in one transaction with 20 events of agg-2. For
// read_committed, agg-1's refused event is the only dead letter, its 19
// later events are parked once each, in order, with the quarantine and
// topic headers, none of them is on the event topic, agg-2 is there whole,
// and the state topic holds agg-1's quarantine.
func TestExactlyOnceQuarantineParksLaterEvents(t *testing.T) {
	const events = 20
	q := newEOSQuarantineSetup(t, "eosqpark")
	cfg, err := config.Load(q.cfgPath, nil)
	if err != nil {
		t.Fatalf("load %s: %v", q.cfgPath, err)
	}
	if cfg.DLQ.Mode != config.DLQQuarantine {
		t.Errorf("dlq.mode unset with exactly_once is %q, want %q", cfg.DLQ.Mode, config.DLQQuarantine)
	}
	cfg.HTTP.Listen = ""
	c := startConnector(t, cfg)
	conn := pgConnect(t, q.dsn)
	// The connector learns the topic and its 1 MiB limit.
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "limited", "agg-0", "Sized", `{"seq": 0}`) })
	waitKeyCommitted(t, time.Minute, q.topic, "agg-0", 1)
	lowerLimit(t, q.topic, lowered)

	var refusedID string
	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= events; i++ {
			payload := fmt.Sprintf(`{"seq": %d, "pad": %q}`, i, strings.Repeat("p", 50))
			if i == 1 {
				payload = bigPayload(i)
			}
			if id := insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload); i == 1 {
				refusedID = id
			}
			insert(t, tx, "outbox", "limited", "agg-2", "Sized", fmt.Sprintf(`{"seq": %d}`, 100+i))
		}
	})
	// agg-2's events are in the Kafka transaction of agg-1's dead letter
	// and parked events.
	onTopic := waitKeyCommitted(t, 2*time.Minute, q.topic, "agg-2", events)
	if len(onTopic["agg-1"]) != 0 || seqDiff(onTopic["agg-2"], seqRange(101, 100+events)) != "" || !slices.Equal(onTopic["agg-0"], []int{0}) {
		t.Fatalf("event topic holds %v, want agg-0 [0], agg-2 101..%d and no agg-1", onTopic, 100+events)
	}
	if dlq := committedSeqs(t, dlqFor(q.slot)); len(dlq) != 1 || !slices.Equal(dlq["agg-1"], []int{1}) {
		t.Fatalf("dead letters %v, want exactly agg-1's seq 1", dlq)
	}
	waitKeyCommitted(t, time.Minute, q.parking, "agg-1", events-1)
	parked := readIsolated(t, true, q.parking)
	if got := seqsByKey(t, parked); len(got) != 1 || seqDiff(got["agg-1"], seqRange(2, events)) != "" {
		t.Fatalf("parking topic holds %v, want agg-1 2..%d once each", got, events)
	}
	for _, r := range parked {
		qh, _ := header(r, quarantine.Header)
		tp, _ := header(r, "topic")
		if qh != refusedID || tp != q.topic {
			t.Fatalf("parked seq %d: quarantine %q, topic %q; want %s and %s", seqOf(t, r), qh, tp, refusedID, q.topic)
		}
	}
	states := stateRecords(t, q, true, "agg-1")
	if len(states) == 0 || states[len(states)-1] == nil {
		t.Fatalf("state topic holds %d records for agg-1, the last a tombstone or none; want its quarantine", len(states))
	}
	if s := states[len(states)-1]; s.State != quarantine.StateQuarantined || s.FirstID != refusedID || s.Topic != q.topic {
		t.Fatalf("agg-1's state record: %+v, want %s from %s on %s", s, quarantine.StateQuarantined, refusedID, q.topic)
	}
	waitFor(t, 10*time.Second, "19 parked events and 1 quarantined aggregate in the metrics", func() bool {
		return testutil.ToFloat64(c.m.Parked) == events-1 && testutil.ToFloat64(c.m.Quarantined) == 1
	})
}

// quarantineWriter commits, until stop is closed (at least min, at most
// 10*min), transactions of one event per aggregate of aggs, seq the
// transaction's number; the event of aggregate a in transaction bad[a] is
// over the lowered limit.
type quarantineWriter struct {
	written atomic.Int64 // transactions committed
	done    chan struct{}
	last    int   // the last transaction committed, set before done is closed
	err     error // likewise
}

func startQuarantineWriter(ctx context.Context, dsn string, aggs []string, bad map[string]int, min int, stop <-chan struct{}) *quarantineWriter {
	w := &quarantineWriter{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			w.err = err
			return
		}
		defer conn.Close(context.Background())
		for txn := 1; txn <= 10*min; txn++ {
			if txn > min {
				select {
				case <-stop:
					return
				default:
				}
			}
			b := &pgx.Batch{}
			for _, a := range aggs {
				payload := fmt.Sprintf(`{"seq": %d}`, txn)
				if bad[a] == txn {
					payload = bigPayload(txn)
				}
				b.Queue(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('limited', $1, 'Sized', $2)`, a, payload)
			}
			tx, err := conn.Begin(ctx)
			if err == nil {
				err = tx.SendBatch(ctx, b).Close()
			}
			if err == nil {
				err = tx.Commit(ctx)
			}
			if err != nil {
				w.err = fmt.Errorf("transaction %d: %w", txn, err)
				return
			}
			w.last = txn
			w.written.Add(1)
			time.Sleep(10 * time.Millisecond) // pacing: a steady stream over the kills
		}
	}()
	return w
}

// TestExactlyOnceQuarantineKilledMidStream: a writer commits transactions
// of one event for each of 8 aggregates; 4 of them get an event over the
// topic's limit, at spaced moments. The connector binary is killed
// (SIGKILL) 3 times during the load and restarted. read_committed then
// sees each oversize event once in the DLQ; each later event of its
// aggregate once on the parking topic, in order, with its headers, and not
// on the event topic; the events before it, and every event of the 4 other
// aggregates, once on the event topic, in order.
func TestExactlyOnceQuarantineKilledMidStream(t *testing.T) {
	const minTxns = 300
	q := newEOSQuarantineSetup(t, "eosqkill")
	p, conn := q.start(t)
	good := []string{"g0", "g1", "g2", "g3"}
	bad := map[string]int{"b0": minTxns / 8, "b1": 3 * minTxns / 8, "b2": 5 * minTxns / 8, "b3": 7 * minTxns / 8}
	aggs := append(slices.Clone(good), "b0", "b1", "b2", "b3")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stop := make(chan struct{})
	w := startQuarantineWriter(ctx, q.dsn, aggs, bad, minTxns, stop)
	writerFailed := func() {
		select {
		case <-w.done:
			if w.err != nil {
				t.Fatalf("writer: %v", w.err)
			}
		default:
		}
	}
	for k := 1; k <= 3; k++ {
		at := int64(k * minTxns / 4)
		waitFor(t, time.Minute, fmt.Sprintf("%d transactions written before kill %d", at, k), func() bool {
			writerFailed()
			return w.written.Load() >= at
		})
		// Killed after it committed some: the next one starts from there.
		p.waitMetric(t, time.Minute, "outbox_cdc_events_published_total", 40)
		p.kill()
		p = startProcess(t, q.cfgPath, q.addr)
	}
	close(stop)
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatal("the writer did not stop")
	}
	writerFailed()
	n := w.last

	ids := map[string]string{} // the oversize events' ids
	rows, err := conn.Query(ctx, `SELECT aggregate_id, id::text FROM outbox WHERE payload->>'blob' IS NOT NULL`)
	if err == nil {
		var agg, id string
		_, err = pgx.ForEachRow(rows, []any{&agg, &id}, func() error { ids[agg] = id; return nil })
	}
	if err != nil || len(ids) != len(bad) {
		t.Fatalf("oversize events' ids: %v (%v)", ids, err)
	}

	wantTopic, wantParked := 1+len(good)*n, 0
	for _, at := range bad {
		wantTopic += at - 1
		wantParked += n - at
	}
	var problems []string
	check := func(where, key string, got, want []int) {
		if d := seqDiff(got, want); d != "" {
			problems = append(problems, fmt.Sprintf("%s %s: %s", where, key, d))
		}
	}
	failIf := func() {
		if len(problems) > 0 {
			t.Fatalf("%d transactions of %d events over 3 kills; read_committed:\n%s", n, len(aggs), strings.Join(problems, "\n"))
		}
	}
	waitCommitted(t, q.topic, wantTopic, 3*time.Minute)
	waitCommitted(t, dlqFor(q.slot), len(bad), time.Minute)
	onTopic, dlq := committedSeqs(t, q.topic), committedSeqs(t, dlqFor(q.slot))
	check("topic", "agg-0", onTopic["agg-0"], []int{0})
	for _, a := range aggs {
		if at, isBad := bad[a]; isBad {
			check("topic", a, onTopic[a], seqRange(1, at-1))
			check("DLQ", a, dlq[a], []int{at})
		} else {
			check("topic", a, onTopic[a], seqRange(1, n))
			check("DLQ", a, dlq[a], nil)
		}
	}
	if len(onTopic) != 1+len(aggs) || len(dlq) != len(bad) {
		problems = append(problems, fmt.Sprintf("keys: %d on the topic, %d in the DLQ; want %d and %d", len(onTopic), len(dlq), 1+len(aggs), len(bad)))
	}
	failIf()

	waitCommitted(t, q.parking, wantParked, time.Minute)
	parkedRecs := readIsolated(t, true, q.parking)
	parked := seqsByKey(t, parkedRecs)
	for _, a := range aggs {
		if at, isBad := bad[a]; isBad {
			check("parking", a, parked[a], seqRange(at+1, n))
		} else {
			check("parking", a, parked[a], nil)
		}
	}
	for _, r := range parkedRecs {
		qh, _ := header(r, quarantine.Header)
		tp, _ := header(r, "topic")
		if qh != ids[string(r.Key)] || tp != q.topic {
			problems = append(problems, fmt.Sprintf("parked %s seq %d: quarantine %q, topic %q; want %s and %s",
				r.Key, seqOf(t, r), qh, tp, ids[string(r.Key)], q.topic))
			break
		}
	}
	failIf()
	ls := q.list(t)
	if len(ls) != len(bad) {
		t.Fatalf("redrive --list: %+v, want the %d aggregates with an oversize event", ls, len(bad))
	}
	for _, s := range ls {
		if s.State != quarantine.StateQuarantined || s.FirstID != ids[s.Key] || s.Topic != q.topic {
			t.Fatalf("redrive --list: %+v, want %s quarantined from %s on %s", s, s.Key, ids[s.Key], q.topic)
		}
	}
	t.Logf("%d transactions of %d events over 3 kills: each event once where it belongs for read_committed", n, len(aggs))
	stopClean(t, p)
}

// TestExactlyOnceRedrive: agg-1's 2nd of 10 events is refused, so 3..10
// are parked. Once the limit is raised, redrive puts the dead letter and
// the parked events on the topic, and agg-1's next events follow them
// there: read_committed sees agg-1's 12 events once each, in order; the
// quarantine is gone from redrive --list and its state is a tombstone.
func TestExactlyOnceRedrive(t *testing.T) {
	q := newEOSQuarantineSetup(t, "eosqredrive")
	p, conn := q.start(t)
	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= 10; i++ {
			payload := fmt.Sprintf(`{"seq": %d}`, i)
			if i == 2 {
				payload = bigPayload(i)
			}
			insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload)
			insert(t, tx, "outbox", "limited", "agg-2", "Sized", fmt.Sprintf(`{"seq": %d}`, 100+i))
		}
	})
	onTopic := waitKeyCommitted(t, 2*time.Minute, q.topic, "agg-2", 10)
	if !slices.Equal(onTopic["agg-1"], []int{1}) {
		t.Fatalf("before the redrive the topic holds agg-1 %v, want 1 (2 dead-lettered, 3..10 parked)", onTopic["agg-1"])
	}
	if got := waitKeyCommitted(t, time.Minute, q.parking, "agg-1", 8); !slices.Equal(got["agg-1"], seqRange(3, 10)) {
		t.Fatalf("parking holds agg-1 %v, want 3..10", got["agg-1"])
	}

	lowerLimit(t, q.topic, 1<<20) // the operator's fix
	if code, out := q.redrive(t, "--aggregate", "agg-1"); code != 0 || !strings.Contains(out, "quarantine lifted") {
		t.Fatalf("redrive agg-1: exit %d:\n%s", code, out)
	}
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "limited", "agg-1", "Sized", `{"seq": 11}`)
		insert(t, tx, "outbox", "limited", "agg-1", "Sized", `{"seq": 12}`)
	})
	onTopic = waitKeyCommitted(t, 2*time.Minute, q.topic, "agg-1", 12)
	if d := seqDiff(onTopic["agg-1"], seqRange(1, 12)); d != "" || seqDiff(onTopic["agg-2"], seqRange(101, 110)) != "" {
		t.Fatalf("after the redrive read_committed sees agg-1 %v (%s) and agg-2 %v; want 1..12 and 101..110, once each",
			onTopic["agg-1"], d, onTopic["agg-2"])
	}
	if ls := q.list(t); len(ls) != 0 {
		t.Fatalf("still quarantined: %+v", ls)
	}
	if st := stateRecords(t, q, true, "agg-1"); len(st) == 0 || st[len(st)-1] != nil {
		t.Fatalf("agg-1's last committed state record is not a tombstone (%d records)", len(st))
	}
	stopClean(t, p)
}

// TestExactlyOnceRedriveKilled: the connector is killed (SIGKILL) as soon
// as the redrive request of an aggregate with 1,999 parked events is on
// the state topic; the restarted connector carries the request out once:
// the command answers, and read_committed sees the aggregate's 2,000
// events on the topic once each, in order, and its quarantine's tombstone.
func TestExactlyOnceRedriveKilled(t *testing.T) {
	const events = 2000
	q := newEOSQuarantineSetup(t, "eosqredrivekill")
	p, conn := q.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'limited', 'agg-1', 'Sized', CASE WHEN i = 1 THEN jsonb_build_object('seq', i, 'blob', repeat('x', $1::int))
			ELSE jsonb_build_object('seq', i) END
		FROM generate_series(1, $2::int) AS i ORDER BY i`, 2*lowered, events); err != nil {
		t.Fatal(err)
	}
	waitKeyCommitted(t, 2*time.Minute, dlqFor(q.slot), "agg-1", 1)
	if got := committedSeqs(t, q.topic)["agg-1"]; len(got) != 0 {
		t.Fatalf("the topic holds agg-1 %v (%d events) behind its dead letter, want none", got[:min(len(got), 10)], len(got))
	}
	waitKeyCommitted(t, 2*time.Minute, q.parking, "agg-1", events-1)
	lowerLimit(t, q.topic, 1<<20)

	// The command waits for the answer while the connector is killed.
	bin := connectorBinary(t)
	type result struct {
		code int
		out  string
		err  error
	}
	answered := make(chan result, 1)
	go func() {
		code, out, err := cdctest.Run(ctx, bin, nil, "redrive", "--config", q.cfgPath, "--aggregate", "agg-1", "--wait", "5m")
		answered <- result{code, out, err}
	}()
	waitFor(t, time.Minute, "the redrive request on the state topic", func() bool {
		return slices.ContainsFunc(stateRecords(t, q, false, "agg-1"), func(r *quarantine.StateRecord) bool {
			return r == nil || r.State == quarantine.StateRedrive
		})
	})
	p.kill()
	if st := stateRecords(t, q, true, "agg-1"); len(st) > 0 && st[len(st)-1] == nil {
		t.Logf("the redrive committed before the kill: the restart has nothing to carry out")
	}
	p = startProcess(t, q.cfgPath, q.addr)
	var r result
	select {
	case r = <-answered:
	case <-ctx.Done():
		t.Fatal("redrive agg-1 did not return")
	}
	if r.err != nil || r.code != 0 || !strings.Contains(r.out, "quarantine lifted") {
		t.Fatalf("redrive agg-1 over the kill: exit %d (%v):\n%s", r.code, r.err, r.out)
	}
	onTopic := waitKeyCommitted(t, 2*time.Minute, q.topic, "agg-1", events)
	if d := seqDiff(onTopic["agg-1"], seqRange(1, events)); d != "" {
		t.Fatalf("read_committed sees agg-1 on the topic: %s; want 1..%d once each", d, events)
	}
	if st := stateRecords(t, q, true, "agg-1"); len(st) == 0 || st[len(st)-1] != nil {
		t.Fatalf("agg-1's last committed state record is not a tombstone (%d records)", len(st))
	}
	stopClean(t, p)
}
