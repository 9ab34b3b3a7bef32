package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The large-transaction kinds (issue 37): a writer of the suite commits ONE
// PostgreSQL transaction of thousands of rows, several times the connector's
// kafka.max_buffered_records (1000 in the suite's file), and a fault hits
// while the connector publishes it. In exactly_once the connector commits it
// in parts, each its own Kafka transaction (docs/operations.md, "A
// transaction of any size"), and a restart must resume between parts; in
// at_least_once it streams through. The names keep their class's prefix, so
// the report's classes and the duplicate check's PostgreSQL lifetimes
// (pg-*) take them as they take the other kinds of the class.
const (
	fConnKillLarge  = "connector-kill-large-txn"
	fKafkaKillLarge = "kafka-kill-large-txn"
	fPGRestartLarge = "pg-restart-large-txn"
)

// A large transaction has largeRowsMin to largeRowsMin+largeRowsSpan rows
// (the last part is short most of the time), over largeAggs keys of its
// own; the fault hits 0 to largeDelayMax after its first event became
// visible, 0 to largeDelayMaxALO in at_least_once: that streams such a
// transaction within ~100 ms of its first event (a focused run, 2026-12-07:
// 4 of 7 faults hit 68–130 ms after it, all events seen), where
// exactly_once commits a part per Kafka transaction.
const (
	largeRowsMin     = 4500
	largeRowsSpan    = 3000
	largeAggs        = 4
	largeDelayMax    = 150 * time.Millisecond
	largeDelayMaxALO = 10 * time.Millisecond
	// partSize is kafka.max_buffered_records in the suite's configuration:
	// the most events a part holds.
	partSize = 1000
)

// largeTxn is what a large-transaction fault wrote, recorded in its
// faultRecord: the writers' ledger key of the transaction, its rows, and how
// many of them the live consumer had seen when the fault hit (between 1 and
// Rows-1: the fault landed while the connector was publishing it).
type largeTxn struct {
	Writer      int
	Txn         int64
	Rows        int
	SeenAtFault int
}

// largeWriter is the writer of the large transactions, made on first use;
// its aggregates are its own, so the per-key order covers its rows alone.
func (r *run) largeWriter() *writer {
	if r.large == nil {
		n := r.m.Writers + 7 + secondWriters // after the slow writers
		aggs := make([]*aggregate, largeAggs)
		for i := range aggs {
			aggs[i] = &aggregate{id: fmt.Sprintf("large-a%d", i), typ: []string{"order", "payment"}[i%2], next: 1}
		}
		r.large = newWriter(n, r.dsn, aggs, 0, r.seed, r.ledger, r.wstats)
		r.large.bucket, r.large.bulk = &r.bucket, true
		r.t.Cleanup(r.large.closeConn)
	}
	return r.large
}

// largeTxnFault commits a large transaction, waits until the connector
// publishes it (its first event visible: in exactly_once, its first part
// committed), and runs hit 0–largeDelayMax later.
func largeTxnFault(hit faultFunc) faultFunc {
	return func(r *run, ctx context.Context, f *faultRecord) (string, error) {
		w := r.largeWriter()
		rows := largeRowsMin + r.rng.IntN(largeRowsSpan+1)
		began := time.Now()
		evs, err := w.commitLarge(ctx, rows)
		if err != nil {
			return "", err
		}
		lt := &largeTxn{Writer: w.n, Txn: evs[0].Txn, Rows: rows}
		f.Large = lt
		commitTook := time.Since(began)
		seen, err := r.awaitSeen(ctx, evs[0].ID, time.Minute)
		if err != nil {
			return "", err
		}
		firstAfter := time.Since(began) - commitTook
		delay := r.between(0, largeDelayMax)
		if !exactlyOnce() {
			delay = r.between(0, largeDelayMaxALO)
		}
		sleepCtx(ctx, delay) // the fault's timing: how far into the publication it lands
		lt.SeenAtFault = r.live.countSeen(evs)
		desc, err := hit(r, ctx, f)
		return fmt.Sprintf("one transaction of %d rows (writer %d txn %d) committed in %v, %s %v after, hit %v later with %d of its events seen; %s",
			rows, w.n, lt.Txn, commitTook.Round(time.Millisecond), seen, firstAfter.Round(time.Millisecond), delay, lt.SeenAtFault, desc), err
	}
}

// awaitSeen waits until the live consumer saw id, at most timeout (a
// bound, reported; the catch-up check judges a stall), and restarts a
// connector that exited meanwhile as the schedule does (checkConnector): a
// stop on a hanging transaction after kafka-kill-after-endtxn blocks every
// read_committed reader until the runbook's abort (seed 7393848356188618370
// waited out the minute with the connector down).
func (r *run) awaitSeen(ctx context.Context, id string, timeout time.Duration) (string, error) {
	seen := r.live.watch(id)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-seen:
			return "first event seen", nil
		default:
		}
		r.checkConnector(ctx)
		if !sleepCtx(ctx, 10*time.Millisecond) { // poll interval of the live consumer's progress
			return "", ctx.Err()
		}
	}
	return fmt.Sprintf("first event NOT seen within %v", timeout), nil
}

// largeKill is connector-kill's SIGKILL and restart (0–800 ms down, now and
// then killed again in its start-up).
func largeKill(r *run, ctx context.Context, f *faultRecord) (string, error) {
	return r.killConnector(ctx, f, time.Duration(r.rng.Int64N(int64(800*time.Millisecond))))
}

// largePGRestart stops PostgreSQL as one of the pg-*-restart kinds does,
// drawn from the seed, and restarts it.
func largePGRestart(r *run, ctx context.Context, f *faultRecord) (string, error) {
	stops := []struct {
		name string
		stop func(context.Context) error
	}{
		{"fast", stopPG},
		{"crash", func(context.Context) error { return env.pg.Crash() }},
		{"immediate", func(context.Context) error { return env.pg.ImmediateStop() }},
	}
	s := stops[r.rng.IntN(len(stops))]
	desc, err := pgRestart(s.stop)(r, ctx, f)
	return s.name + " stop, " + desc, err
}

// commitLarge commits one transaction of rows events over the writer's
// aggregates (retrying as commitNext does) and records it in the ledger.
func (w *writer) commitLarge(ctx context.Context, rows int) ([]event, error) {
	w.ledger.gate.RLock()
	defer w.ledger.gate.RUnlock()
	w.txn++
	bucket := int(w.bucket.Load())
	evs := make([]event, rows)
	next := map[*aggregate]int{}
	for i := range evs {
		a := w.aggs[w.rng.IntN(len(w.aggs))]
		if _, ok := next[a]; !ok {
			next[a] = a.next
		}
		evs[i] = event{ID: newUUID(), Agg: a.id, Type: a.typ, Seq: next[a], Writer: w.n, Txn: w.txn, Bucket: bucket}
		next[a]++
	}
	if err := w.commit(ctx, evs); err != nil {
		return nil, err
	}
	for a, n := range next {
		a.next = n
	}
	w.stats.txns.Add(1)
	w.ledger.add(evs)
	return evs, nil
}

// insertBulkSQL inserts a whole large transaction in one statement, in
// the order of the arrays (WITH ORDINALITY): thousands of round trips would
// take seconds on a loaded machine, against the attempt's opTimeout.
const insertBulkSQL = `INSERT INTO outbox (id, bucket, aggregate_type, aggregate_id, event_type, payload)
	SELECT u.id::uuid, $5::int, u.typ, u.agg, 'chaos', jsonb_build_object('seq', u.seq, 'writer', $6::int, 'txn', $7::bigint, ` + lowField + `)
	FROM unnest($1::text[], $2::text[], $3::text[], $4::int[]) WITH ORDINALITY AS u(id, typ, agg, seq, ord)
	ORDER BY u.ord`

// insertAll inserts the rows of a multi-event transaction: one statement
// for a bulk writer, else one by one (each row may be of its own kind).
func (w *writer) insertAll(ctx context.Context, q execer, evs []event) error {
	if !w.bulk {
		for _, e := range evs {
			if err := w.insert(ctx, q, e); err != nil {
				return err
			}
		}
		return nil
	}
	ids, typs, aggs, seqs := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]int32, len(evs))
	for i, e := range evs {
		ids[i], typs[i], aggs[i], seqs[i] = e.ID, e.Type, e.Agg, int32(e.Seq)
	}
	_, err := q.Exec(ctx, insertBulkSQL, ids, typs, aggs, seqs, evs[0].Bucket, evs[0].Writer, evs[0].Txn)
	return err
}

// countSeen is how many of evs the live consumer has seen.
func (lc *liveConsumer) countSeen(evs []event) int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	n := 0
	for _, e := range evs {
		if _, ok := lc.seen[e.ID]; ok {
			n++
		}
	}
	return n
}

// pgTxn is a PostgreSQL transaction in the writers' ledger.
type pgTxn struct {
	writer int
	txn    int64
}

// kTxn is a Kafka transaction: under KIP-890 each has an epoch of its own.
type kTxn struct {
	pid   int64
	epoch int16
}

// part is one txn_part value's copies.
type part struct {
	in          kTxn
	n           int
	first, last time.Time // appended
}

// splitByDesign reports whether cs, every copy of a PostgreSQL
// transaction's events, are the parts the connector cut on purpose: each
// carries the headers txn (the same for all) and txn_part; each part lies in
// one Kafka transaction; the parts are 1, 2, …, n-1 and the last says "n/n".
// A part holds at most partSize events, but for a last part that a process
// started after the part before it (restarted) committed: a restart whose
// read-back held back whole transactions keeps the rest of the transaction
// whole (docs/operations.md, "A transaction of any size"); wholeRest says
// so. It returns n, or why the copies are no such parts.
func splitByDesign(cs []copyRec, restarted func(from, to time.Time) bool) (n int, wholeRest bool, why string) {
	parts := map[string]*part{}
	for _, c := range cs {
		where := fmt.Sprintf("event %s (%s/%d@%d)", c.ID, c.Topic, c.Partition, c.Offset)
		if c.Txn == "" || c.TxnPart == "" {
			return 0, false, where + " lacks the txn/txn_part headers"
		}
		if c.Txn != cs[0].Txn {
			return 0, false, fmt.Sprintf("%s says txn %s, %s", where, c.Txn, cs[0].Txn)
		}
		p := parts[c.TxnPart]
		if p == nil {
			p = &part{in: kTxn{c.Producer, c.Epoch}, first: c.Append, last: c.Append}
			parts[c.TxnPart] = p
		}
		if p.in != (kTxn{c.Producer, c.Epoch}) {
			return 0, false, fmt.Sprintf("part %s over two Kafka transactions (%s)", c.TxnPart, where)
		}
		p.n++
		p.first, p.last = minTime(p.first, c.Append), maxTime(p.last, c.Append)
		if a, b, ok := strings.Cut(c.TxnPart, "/"); ok {
			if a != b || n != 0 && strconv.Itoa(n) != a {
				return 0, false, fmt.Sprintf("%s says last part %s", where, c.TxnPart)
			}
			n, _ = strconv.Atoi(a)
		}
	}
	if n == 0 {
		return 0, false, "no event of its last part (\"n/n\")"
	}
	if len(parts) != n {
		return 0, false, fmt.Sprintf("%d distinct txn_part values for %d parts", len(parts), n)
	}
	for i := 1; i <= n; i++ {
		name := strconv.Itoa(i)
		if i == n {
			name += "/" + name
		}
		p := parts[name]
		if p == nil {
			return 0, false, fmt.Sprintf("part %d of %d missing", i, n)
		}
		if p.n <= partSize {
			continue
		}
		if i < n || i == 1 || !restarted(parts[strconv.Itoa(i-1)].last, p.first) {
			return 0, false, fmt.Sprintf("part %s holds %d events, more than kafka.max_buffered_records (%d), with no restart before it", name, p.n, partSize)
		}
		wholeRest = true
	}
	return n, wholeRest, ""
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// restartedBetween reports whether a connector process started after from
// and at or before to.
func (o *observation) restartedBetween(from, to time.Time) bool {
	for _, in := range o.Incarnations {
		if in.Start.After(from) && !in.Start.After(to) {
			return true
		}
	}
	return false
}
