package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// longTxn is a transaction held open across the gap on a connection of its
// own, writing eosEvent rows of writer w (transaction 1, n rows).
type longTxn struct {
	t    *testing.T
	ctx  context.Context
	conn *pgx.Conn
	tx   pgx.Tx
	agg  string
	w, n int
	next int
}

func beginLong(ctx context.Context, t *testing.T, dsn, agg string, w, n int) *longTxn {
	t.Helper()
	conn := pgConnect(t, dsn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatalf("begin long transaction %d: %v", w, err)
	}
	return &longTxn{t: t, ctx: ctx, conn: conn, tx: tx, agg: agg, w: w, n: n}
}

// insert writes the next row: its id is assigned by the first one.
func (l *longTxn) insert() {
	l.t.Helper()
	v, _ := json.Marshal(eosEvent{W: l.w, Txn: 1, I: l.next, N: l.n})
	if _, err := l.tx.Exec(l.ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, 'E', $3)`,
		l.agg, fmt.Sprintf("long%d-%d", l.w, l.next), string(v)); err != nil {
		l.t.Fatalf("long transaction %d row %d: %v", l.w, l.next, err)
	}
	l.next++
}

// takeID gives the transaction its id without writing the outbox: it holds
// the guard's bound, and the gap repair does not wait for it (it holds no
// lock on the outbox).
func (l *longTxn) takeID() {
	l.t.Helper()
	if _, err := l.tx.Exec(l.ctx, "SELECT pg_current_xact_id()"); err != nil {
		l.t.Fatalf("long transaction %d: %v", l.w, err)
	}
}

func (l *longTxn) commit() {
	l.t.Helper()
	if err := l.tx.Commit(l.ctx); err != nil {
		l.t.Fatalf("commit long transaction %d: %v", l.w, err)
	}
}

// TestGapRepairExactlyOnce: in exactly_once, the repair of a publication
// gap publishes each row once for read_committed. Writers commit multi-row
// transactions throughout; a transaction that began before them holds the
// gap's xmin bound below every one of theirs (so rows delivered and
// confirmed long before the gap are read back from the table), another
// spans the removal and the re-add, a third begins and commits inside the
// gap. The outbox leaves the publication and comes back; the connector
// exits 1, restarts and is killed (SIGKILL) during the repair: once it
// handed the repair over (its Kafka transaction not committed yet), or once
// read_committed shows a row only the repair publishes (committed, while a
// transaction left open keeps the checkpoint holding the gap, so the next
// start must tell the repair committed); it starts again.
// read_committed then sees every committed row exactly once and, per key,
// in order.
func TestGapRepairExactlyOnce(t *testing.T) {
	t.Run("killed handing the repair over", func(t *testing.T) {
		gapRepairOnce(t, "gapeos1", false, func(t *testing.T, p *process, _ string) {
			waitFor(t, time.Minute, "the restart's repair", func() bool {
				return strings.Contains(p.output(), "published the rows written while the outbox was outside the publication")
			})
		})
	})
	t.Run("killed after the repair committed", func(t *testing.T) {
		gapRepairOnce(t, "gapeos2", true, func(t *testing.T, p *process, topic string) {
			waitFor(t, time.Minute, "a row only the repair publishes, committed", func() bool {
				for _, r := range readIsolated(t, true, topic) {
					var e eosEvent
					if json.Unmarshal(r.Value, &e) == nil && e.W == 12 {
						return true
					}
				}
				return false
			})
		})
	})
}

// gapRepairOnce runs the scenario on slot; during marks when the restart
// is killed. committed: the repair committed before the kill, and the
// next start must find it so.
func gapRepairOnce(t *testing.T, slot string, committed bool, during func(t *testing.T, p *process, topic string)) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, slot)
	cfgPath := eosConfig(t, dsn, slot, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	agg := fmt.Sprintf("gapeos%d", dbCounter.Add(1))
	topic := topicFor(agg)
	var logs []string
	defer func() {
		if t.Failed() {
			t.Logf("connector logs:\n%s", strings.Join(logs, "\n----\n"))
		}
	}()

	p := startProcess(t, cfgPath, addr)
	below := beginLong(ctx, t, dsn, agg, 10, 2) // its id: below every writer's
	below.insert()
	const writers, min, rows = 3, 250, 4
	var written atomic.Int64
	stop := make(chan struct{})
	wait := eosWriters(ctx, t, dsn, agg, writers, min, rows, stop, &written)
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 200)
	spans := beginLong(ctx, t, dsn, agg, 11, 2) // across the removal and the re-add
	spans.insert()
	p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 600)

	exec1(t, dsn, "ALTER PUBLICATION "+slot+" DROP TABLE outbox")
	below.insert() // in the gap: never decoded
	below.commit()
	inside := beginLong(ctx, t, dsn, agg, 12, 1) // its id: above the bound
	inside.insert()
	inside.commit()
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("connector still running a minute after the outbox left the publication:\n%s", p.output())
	}
	logs = append(logs, p.output())
	if code := p.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(p.output(), "was removed from publication") {
		t.Fatalf("exit %d, want 1 saying the outbox left the publication:\n%s", code, p.output())
	}
	time.Sleep(300 * time.Millisecond) // writers go on: more rows of the gap
	exec1(t, dsn, "ALTER PUBLICATION "+slot+" ADD TABLE outbox")
	spans.insert() // after the re-add: decoded
	spans.commit()

	longs := []*longTxn{below, spans, inside}
	var holder *longTxn
	if committed {
		// Open across the kill: its id keeps the gap in the checkpoint. It
		// writes its row only after the kill: an outbox writer open when the
		// repair starts is waited for (it may have written before the re-add
		// committed, with an id above the re-add's).
		holder = beginLong(ctx, t, dsn, agg, 13, 1)
		holder.takeID()
		longs = append(longs, holder)
	}
	p = startProc(t, cfgPath, addr, false)
	running := p
	defer func() { // a t.Fatal before the kill
		if running != nil && t.Failed() {
			logs = append(logs, running.output())
		}
	}()
	during(t, p, topic)
	select {
	case <-p.done:
		t.Fatalf("connector exited during the repair: %v\n%s", p.err, p.output())
	default:
	}
	p.kill()
	logs = append(logs, p.output())

	p = startProcess(t, cfgPath, addr)
	running = p
	if holder != nil {
		holder.insert()
		holder.commit()
	}
	waitFor(t, 2*time.Minute, "writers' minimum", func() bool { return written.Load() >= writers*min })
	close(stop)
	last := wait()
	want := map[eosEvent]bool{}
	for w, n := range last {
		for txn := 1; txn <= n; txn++ {
			for i := range rows {
				want[eosEvent{W: w, Txn: txn, I: i, N: rows}] = true
			}
		}
	}
	for _, l := range longs {
		for i := range l.n {
			want[eosEvent{W: l.w, Txn: 1, I: i, N: l.n}] = true
		}
	}
	waitFor(t, 2*time.Minute, "every event visible to read_committed", func() bool {
		seen := map[eosEvent]bool{}
		for _, r := range readIsolated(t, true, topic) {
			var e eosEvent
			if json.Unmarshal(r.Value, &e) == nil && want[e] {
				seen[e] = true
			}
		}
		return len(seen) == len(want)
	})
	// Anything still to come (a copy) is in before the clean stop ends.
	stopClean(t, p)
	logs, running = append(logs, p.output()), nil
	if found := strings.Contains(p.output(), "the gap's rows were published before the restart"); committed != found {
		t.Errorf("the last start found the repair committed: %v, want %v", found, committed)
	}
	recs := readIsolated(t, true, topic)
	if problems := onceInOrder(recs, want); len(problems) > 0 {
		t.Errorf("read_committed, %d records for %d events: %s", len(recs), len(want), strings.Join(problems, "; "))
	}
	for i, out := range logs {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "gap") || strings.Contains(line, "publication") || strings.Contains(line, "committed position") {
				t.Logf("process %d: %s", i+1, line)
			}
		}
	}
	t.Logf("%d events (%d writer transactions of %d rows, 3 long ones); read_committed %d records, read_uncommitted %d",
		len(want), len(want)/rows, rows, len(recs), len(readIsolated(t, false, topic)))
}

// onceInOrder says what is wrong with recs, read_committed: an event of
// want missing or seen more than once, one not written, a key whose
// transactions go back.
func onceInOrder(recs []*kgo.Record, want map[eosEvent]bool) []string {
	copies := map[eosEvent]int{}
	lastByKey := map[string]int{}
	var dups, order []string
	for _, r := range recs {
		var e eosEvent
		if err := json.Unmarshal(r.Value, &e); err != nil {
			return []string{fmt.Sprintf("value %s: %v", r.Value, err)}
		}
		if copies[e]++; copies[e] == 2 {
			dups = append(dups, fmt.Sprintf("%+v (%d@%d)", e, r.Partition, r.Offset))
		}
		key := string(r.Key)
		if prev, ok := lastByKey[key]; ok && e.Txn <= prev && copies[e] == 1 {
			order = append(order, fmt.Sprintf("key %s: transaction %d after %d", key, e.Txn, prev))
		}
		lastByKey[key] = max(lastByKey[key], e.Txn)
	}
	var problems []string
	lost := 0
	for e := range want {
		if copies[e] == 0 {
			lost++
			if lost <= 10 {
				problems = append(problems, fmt.Sprintf("lost %+v", e))
			}
		}
	}
	for e := range copies {
		if !want[e] {
			problems = append(problems, fmt.Sprintf("not written: %+v", e))
		}
	}
	total := 0
	for _, n := range copies {
		total += n - 1
	}
	slices.Sort(dups)
	if len(dups) > 0 {
		problems = append(problems, fmt.Sprintf("%d duplicate copies of %d events, e.g. %s", total, len(dups), strings.Join(dups[:min(len(dups), 10)], ", ")))
	}
	if len(order) > 0 {
		problems = append(problems, fmt.Sprintf("%d order violations, e.g. %s", len(order), strings.Join(order[:min(len(order), 10)], ", ")))
	}
	if lost > 0 {
		problems = append(problems, fmt.Sprintf("%d lost in all", lost))
	}
	return problems
}
