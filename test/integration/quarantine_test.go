package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// seqsByKey groups the records' seq by key, in the order read.
func seqsByKey(t *testing.T, recs []*kgo.Record) map[string][]int {
	t.Helper()
	m := map[string][]int{}
	for _, r := range recs {
		m[string(r.Key)] = append(m[string(r.Key)], seqOf(t, r))
	}
	return m
}

// TestQuarantineParksLaterEvents: the broker refuses the first of 20 events
// of aggregate agg-1 (its topic's limit was lowered after the connector read
// it), in one transaction with the other 19 and with 20 events of agg-2 in
// the same partition. agg-1 is quarantined: its refused event is
// dead-lettered, the 19 later ones are parked in order with the quarantine
// header, and none reaches the event topic; agg-2 reaches it complete and
// in order.
func TestQuarantineParksLaterEvents(t *testing.T) {
	const (
		events  = 20
		lowered = 64 << 10
	)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	topic := limitedTopic(t, 1, 1<<20)
	cfg := testConfig(t, dsn, "public.outbox", "quarantine")
	cfg.Kafka.Topics = map[string]string{"limited": topic}
	cfg.DLQ.Mode = config.DLQQuarantine
	cfg.Kafka.ParkingTopic = "parking.quarantine." + runID
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	// The connector learns the topic and its 1 MiB limit.
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "limited", "agg-0", "Sized", `{"seq": 0}`) })
	consumeN(t, []string{topic}, 1, time.Minute, 0)

	lowerLimit(t, topic, lowered)

	var refusedID string
	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= events; i++ {
			payload := fmt.Sprintf(`{"seq": %d, "pad": %q}`, i, strings.Repeat("p", 50))
			if i == 1 {
				payload = fmt.Sprintf(`{"seq": %d, "blob": %q}`, i, strings.Repeat("x", 2*lowered))
			}
			id := insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload)
			if i == 1 {
				refusedID = id
			}
			insert(t, tx, "outbox", "limited", "agg-2", "Sized", fmt.Sprintf(`{"seq": %d}`, 100+i))
		}
	})
	parked := consumeN(t, []string{cfg.Kafka.ParkingTopic}, events-1, 2*time.Minute, 3*time.Second)
	var wantParked, wantOther []int
	for i := 2; i <= events; i++ {
		wantParked = append(wantParked, i)
	}
	for i := 1; i <= events; i++ {
		wantOther = append(wantOther, 100+i)
	}
	if got := seqsByKey(t, parked); len(got) != 1 || !slices.Equal(got["agg-1"], wantParked) {
		t.Fatalf("parking topic holds %v, want agg-1 %v", got, wantParked)
	}
	for _, r := range parked {
		q, _ := header(r, quarantine.Header)
		tp, _ := header(r, "topic")
		if q != refusedID || tp != topic {
			t.Fatalf("parked seq %d: quarantine %q, topic %q; want %s and %s", seqOf(t, r), q, tp, refusedID, topic)
		}
	}
	got := seqsByKey(t, consumeN(t, []string{topic}, 1+events, time.Minute, 3*time.Second))
	if len(got["agg-1"]) != 0 || !slices.Equal(got["agg-2"], wantOther) || !slices.Equal(got["agg-0"], []int{0}) {
		t.Fatalf("event topic holds %v, want agg-0 [0], agg-2 %v and no agg-1", got, wantOther)
	}
	dlq := consumeN(t, []string{dlqFor("quarantine")}, 1, time.Minute, 3*time.Second)
	if len(dlq) != 1 || seqOf(t, dlq[0]) != 1 || string(dlq[0].Key) != "agg-1" {
		t.Fatalf("%d dead letters, want exactly agg-1's seq 1", len(dlq))
	}
	// The metrics follow the acknowledgements, which a consumer may see first.
	waitFor(t, 10*time.Second, "19 parked events and 1 quarantined aggregate in the metrics", func() bool {
		return testutil.ToFloat64(c.m.Parked) == events-1 && testutil.ToFloat64(c.m.Quarantined) == 1
	})
}

// quarantineSetup is a database whose outbox routes aggregate_type
// "limited" to a topic of its own with a 1 MiB limit, and the YAML of a
// connector binary for it (dlq.mode quarantine by default) with parking and
// quarantine topics of the test's own.
type quarantineSetup struct {
	dsn, slot, topic, parking, state, cfgPath, addr string
}

func newQuarantineSetup(t *testing.T, slot string) *quarantineSetup {
	t.Helper()
	q := &quarantineSetup{dsn: newDatabase(t), slot: slot, topic: limitedTopic(t, 1, 1<<20),
		parking: "parking." + slot + "." + runID, state: "quarantine." + slot + "." + runID, addr: freeAddr(t)}
	createOutbox(t, q.dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, q.dsn, slot)
	q.cfgPath = writeConfig(t, fmt.Sprintf(`postgres: {dsn: %q, slot: %s, publication: %s}
kafka: {brokers: [%s], dlq_topic: %s, topic: %q, topics: {limited: %s}, parking_topic: %s, quarantine_topic: %s}
http: {listen: %q}
`, q.dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, q.topic, q.parking, q.state, q.addr))
	return q
}

// lowered is the limit the topic gets once the connector knows it as 1 MiB:
// the broker refuses what the connector lets through.
const lowered = 64 << 10

// start starts the connector binary, lets it learn the topic's 1 MiB limit
// and lowers the limit.
func (q *quarantineSetup) start(t *testing.T) (*process, *pgx.Conn) {
	t.Helper()
	p := startProcess(t, q.cfgPath, q.addr)
	conn := pgConnect(t, q.dsn)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "limited", "agg-0", "Sized", `{"seq": 0}`) })
	consumeN(t, []string{q.topic}, 1, time.Minute, 0)
	lowerLimit(t, q.topic, lowered)
	return p, conn
}

// redrive runs outbox-cdc redrive with args and returns its exit code and output.
func (q *quarantineSetup) redrive(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return runBinary(t, 3*time.Minute, nil, append([]string{"redrive", "--config", q.cfgPath}, args...)...)
}

// list returns the quarantined aggregates as outbox-cdc redrive --list --json prints them.
func (q *quarantineSetup) list(t *testing.T) []quarantine.StateRecord {
	t.Helper()
	code, out := q.redrive(t, "--list", "--json")
	var got []quarantine.StateRecord
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("redrive --list --json: exit %d:\n%s", code, out)
	}
	return got
}

// firstSeqs is the seq of each record of key in order, first occurrences only.
func firstSeqs(t *testing.T, recs []*kgo.Record, key string) []int {
	t.Helper()
	var out []int
	seen := map[int]bool{}
	for _, r := range recs {
		if s := seqOf(t, r); string(r.Key) == key && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func seqRange(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// TestQuarantineSurvivesRestartAndRedrives: 20 events of agg-1, the 5th
// refused by the broker (the topic's limit lowered), with agg-2's traffic in
// the same transaction, and 5 events of agg-3 with the 2nd refused. agg-1's
// 4 first events reach the topic, its 15 later ones are parked in order,
// agg-2 is untouched. After a restart of the connector agg-1's new events
// are still parked. redrive --skip lifts agg-3 without its dead letter;
// once the limit is raised, redrive of agg-1 puts all its events on the
// topic in order, and its next event follows them there.
func TestQuarantineSurvivesRestartAndRedrives(t *testing.T) {
	q := newQuarantineSetup(t, "qredrive")
	p, conn := q.start(t)

	payload := func(i int, big bool) string {
		if big {
			return fmt.Sprintf(`{"seq": %d, "blob": %q}`, i, strings.Repeat("x", 2*lowered))
		}
		return fmt.Sprintf(`{"seq": %d}`, i)
	}
	var firstID string
	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= 20; i++ {
			if id := insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload(i, i == 5)); i == 5 {
				firstID = id
			}
			insert(t, tx, "outbox", "limited", "agg-2", "Sized", payload(100+i, false))
			if i <= 5 {
				insert(t, tx, "outbox", "limited", "agg-3", "Sized", payload(300+i, i == 2))
			}
		}
	})
	parked := consumeN(t, []string{q.parking}, 15+3, 2*time.Minute, 3*time.Second)
	if got := firstSeqs(t, parked, "agg-1"); !slices.Equal(got, seqRange(6, 20)) {
		t.Fatalf("parking holds agg-1 %v, want 6..20", got)
	}
	onTopic := consumeN(t, []string{q.topic}, 1+4+20+1, time.Minute, 3*time.Second)
	got := seqsByKey(t, onTopic)
	if !slices.Equal(got["agg-1"], seqRange(1, 4)) || !slices.Equal(got["agg-2"], seqRange(101, 120)) || !slices.Equal(got["agg-3"], []int{301}) {
		t.Fatalf("topic holds %v, want agg-1 1..4, agg-2 101..120, agg-3 301", got)
	}
	if ls := q.list(t); len(ls) != 2 || ls[0].Key != "agg-1" || ls[0].FirstID != firstID || ls[0].State != quarantine.StateQuarantined ||
		ls[0].Topic != q.topic || !strings.Contains(ls[0].Reason, "max.message.bytes") || ls[1].Key != "agg-3" {
		t.Fatalf("redrive --list: %+v, want agg-1 from %s for max.message.bytes on %s, and agg-3", ls, firstID, q.topic)
	}

	// A restart keeps diverting.
	stopClean(t, p)
	p = startProcess(t, q.cfgPath, q.addr)
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload(21, false))
		insert(t, tx, "outbox", "limited", "agg-2", "Sized", payload(121, false))
	})
	parked = consumeN(t, []string{q.parking}, 15+3+1, time.Minute, 3*time.Second)
	if got := firstSeqs(t, parked, "agg-1"); !slices.Equal(got, seqRange(6, 21)) {
		t.Fatalf("after the restart parking holds agg-1 %v, want 6..21", got)
	}

	// --skip: agg-3's parked events go to the topic, its dead letter does not.
	if code, out := q.redrive(t, "--aggregate", "agg-3", "--skip"); code != 0 || !strings.Contains(out, "quarantine lifted") {
		t.Fatalf("redrive --skip agg-3: exit %d:\n%s", code, out)
	}
	// Redriving agg-1 while the limit is still low fails; it stays quarantined.
	if code, out := q.redrive(t, "--aggregate", "agg-1"); code != 1 || !strings.Contains(out, "MESSAGE_TOO_LARGE") {
		t.Fatalf("redrive agg-1 before the fix: exit %d, want 1 naming the refusal:\n%s", code, out)
	}
	view := func(when string) { // the consumer's view, for the closing note
		byKey := func(topic string) map[string][]int {
			return seqsByKey(t, consumeN(t, []string{topic}, 0, 0, 2*time.Second))
		}
		t.Logf("%s: topic %s %v; DLQ %v; parking %v", when, q.topic, byKey(q.topic), byKey(dlqFor(q.slot)), byKey(q.parking))
	}
	view("before the redrive")
	lowerLimit(t, q.topic, 1<<20) // the operator's fix
	if code, out := q.redrive(t, "--aggregate", "agg-1"); code != 0 || !strings.Contains(out, "quarantine lifted") {
		t.Fatalf("redrive agg-1: exit %d:\n%s", code, out)
	}
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload(22, false)) })
	onTopic = consumeN(t, []string{q.topic}, 1+22+21+4, time.Minute, 3*time.Second)
	got = seqsByKey(t, onTopic)
	if !slices.Equal(got["agg-1"], seqRange(1, 22)) || !slices.Equal(got["agg-3"], []int{301, 303, 304, 305}) {
		t.Fatalf("topic holds agg-1 %v and agg-3 %v; want 1..22 and 301, 303..305", got["agg-1"], got["agg-3"])
	}
	if ls := q.list(t); len(ls) != 0 {
		t.Fatalf("still quarantined: %+v", ls)
	}
	view("after the redrive")
	p.waitMetric(t, 10*time.Second, "outbox_cdc_events_published_total", 1)
	stopClean(t, p)
}

// TestRedriveSurvivesConnectorKill: the connector is killed (SIGKILL)
// while it republishes thousands of parked events; the request stays on
// the state topic and the restarted connector carries it out again from
// the start: every event of the aggregate reaches the topic, the first
// occurrences in order.
func TestRedriveSurvivesConnectorKill(t *testing.T) {
	const events = 4000
	q := newQuarantineSetup(t, "qkill")
	p, conn := q.start(t)
	if _, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'limited', 'agg-1', 'Sized', CASE WHEN i = 1 THEN jsonb_build_object('seq', i, 'blob', repeat('x', $1::int))
			ELSE jsonb_build_object('seq', i) END
		FROM generate_series(1, $2::int) AS i ORDER BY i`, 2*lowered, events); err != nil {
		t.Fatal(err)
	}
	consumeN(t, []string{q.parking}, events-1, 2*time.Minute, time.Second)
	lowerLimit(t, q.topic, 1<<20)

	// The CLI gives up waiting soon; the request stays.
	code, out := q.redrive(t, "--aggregate", "agg-1", "--wait", "1s")
	if code != 1 || !strings.Contains(out, "stays pending") {
		t.Logf("redrive --wait 1s: exit %d:\n%s", code, out) // the redrive may already be done: then the kill comes too late
	}
	waitFor(t, time.Minute, "the redrive under way", func() bool {
		return len(consumeN(t, []string{q.topic}, 0, 0, 200*time.Millisecond)) > 1+50
	})
	p.kill()
	during := len(consumeN(t, []string{q.topic}, 0, 0, time.Second)) - 1
	if during >= events {
		t.Fatalf("the redrive finished (%d records) before the kill: make it slower", during)
	}
	if ls := q.list(t); len(ls) != 1 || ls[0].State != quarantine.StateRedrive {
		t.Fatalf("after the kill: %+v, want agg-1 with its request pending", ls)
	}
	p = startProcess(t, q.cfgPath, q.addr)
	waitFor(t, 2*time.Minute, "the quarantine lifted", func() bool { return len(q.list(t)) == 0 })
	onTopic := consumeN(t, []string{q.topic}, 1+events, time.Minute, 3*time.Second)
	if got := firstSeqs(t, onTopic, "agg-1"); !slices.Equal(got, seqRange(1, events)) {
		t.Fatalf("agg-1's first occurrences on the topic: %d events, want 1..%d in order", len(got), events)
	}
	t.Logf("%d records republished before the kill, %d on the topic in all", during, len(onTopic)-1)
	stopClean(t, p)
}

// TestVerifyRepairParksQuarantined: rows written while the slot is gone are
// never decoded; verify --repair republishes them. agg-1 is quarantined
// (its 2nd event refused), so its missing row goes to the parking topic
// behind the dead letter, never to the topic ahead of it; agg-2's missing
// row goes to the topic.
func TestVerifyRepairParksQuarantined(t *testing.T) {
	q := newQuarantineSetup(t, "qverify")
	p, conn := q.start(t)
	var since time.Time // after agg-0, which start wrote
	if err := conn.QueryRow(context.Background(), "SELECT now()").Scan(&since); err != nil {
		t.Fatal(err)
	}
	big := fmt.Sprintf(`{"seq": 2, "blob": %q}`, strings.Repeat("x", 2*lowered))
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "limited", "agg-1", "Sized", `{"seq": 1}`)
		insert(t, tx, "outbox", "limited", "agg-1", "Sized", big)
		insert(t, tx, "outbox", "limited", "agg-1", "Sized", `{"seq": 3}`)
	})
	consumeN(t, []string{q.parking}, 1, time.Minute, 0)
	// No slot: the next rows are never decoded.
	stopClean(t, p)
	dropReleasedSlot(t, q.dsn, "qverify")
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "limited", "agg-1", "Sized", `{"seq": 4}`)
		insert(t, tx, "outbox", "limited", "agg-2", "Sized", `{"seq": 201}`)
	})
	p = startProcess(t, q.cfgPath, q.addr)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "limited", "agg-1", "Sized", `{"seq": 5}`) })
	consumeN(t, []string{q.parking}, 2, time.Minute, 0)

	// The connector runs on beside the repair.
	code, v, out := runVerifyJSON(t, 2*time.Minute, "--config", q.cfgPath, "--since", since.UTC().Format(time.RFC3339Nano), "--repair")
	if code != 0 || v.Missing.Count != 2 || v.Repair == nil || v.Repair.Parked != 1 || v.Repair.Published != 1 || v.Repair.Failed != 0 {
		t.Fatalf("verify --repair: exit %d, %+v (repair %+v); want exit 0, 2 missing, 1 parked, 1 published:\n%s", code, v, v.Repair, out)
	}
	parked := consumeN(t, []string{q.parking}, 3, time.Minute, 2*time.Second)
	if got := firstSeqs(t, parked, "agg-1"); !slices.Equal(got, []int{3, 5, 4}) {
		t.Fatalf("parking holds agg-1 %v, want 3 5 and the repaired 4", got)
	}
	onTopic := seqsByKey(t, consumeN(t, []string{q.topic}, 0, 0, 2*time.Second))
	if !slices.Equal(onTopic["agg-1"], []int{1}) || !slices.Equal(onTopic["agg-2"], []int{201}) {
		t.Fatalf("topic holds %v, want agg-1 1 only (its 2 is dead-lettered) and agg-2 201", onTopic)
	}
	if ls := q.list(t); len(ls) != 1 || ls[0].Key != "agg-1" || ls[0].State != quarantine.StateQuarantined {
		t.Fatalf("after the repair: %+v, want agg-1 still quarantined", ls)
	}
	stopClean(t, p)
}

// TestQuarantineTopicMustBeCompacted: an existing quarantine topic that is
// not compacted would lose quarantines: the connector refuses to start and
// says how to fix it.
func TestQuarantineTopicMustBeCompacted(t *testing.T) {
	q := newQuarantineSetup(t, "qnotcompact")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := newAdmin(t).CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, q.state); err != nil {
		t.Fatal(err)
	}
	code, out := runBinary(t, time.Minute, nil, "run", "--config", q.cfgPath)
	if code != 1 || !strings.Contains(out, "cleanup.policy delete") || !strings.Contains(out, "cleanup.policy=compact") {
		t.Fatalf("exit %d, want 1 naming the policy and the fix:\n%s", code, out)
	}
}
