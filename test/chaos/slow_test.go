package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Backdated rows and long transactions in the workload. With probability
// backdateProb a transaction of the outbox and billing.events writers gives
// its rows a created_at hours in the past, as an application may (an import,
// a replay, a clock far behind): retention must not take them for delivered
// by their age, and a repair that selects rows by created_at misses them.
// Two slow writers, one per table, with aggregates of their own, keep every
// transaction (2–4 rows) open holdMin–holdMax before its COMMIT, so faults
// land while it is open and it commits after them (or is retried); a quarter
// of their transactions are backdated too.

const (
	backdateProb     = 0.03
	slowBackdateProb = 0.25
	backdateMin      = time.Hour
	backdateMax      = 6 * time.Hour
	holdMin, holdMax = 2 * time.Second, 6 * time.Second
	// slowInterval is the slow writers' mean pause between transactions.
	slowInterval = 300 * time.Millisecond
)

const (
	insertBackdatedSQL = `INSERT INTO outbox (id, bucket, aggregate_type, aggregate_id, event_type, payload, created_at)
	VALUES ($1::uuid, $7::int, $2, $3, 'chaos', jsonb_build_object('seq', $4::int, 'writer', $5::int, 'txn', $6::bigint, 'backdated', true, ` + lowField + `),
		now() - make_interval(secs => $8::float8))`
	secondInsertBackdatedSQL = `INSERT INTO billing.events (event_id, kind, invoice_id, name, body, region, created_at)
	VALUES ($1::uuid, $2, $3, 'Billed', jsonb_build_object('seq', $4::int, 'writer', $5::int, 'txn', $6::bigint, 'backdated', true, ` + lowField + `), 'eu',
		now() - make_interval(secs => $7::float8))`
)

// insertBackdated writes e's row with created_at e.Backdate before now().
func insertBackdated(ctx context.Context, q execer, e event) error {
	secs := e.Backdate.Seconds()
	if strings.HasPrefix(e.Type, secondTablePrefix) {
		_, err := q.Exec(ctx, secondInsertBackdatedSQL, e.ID, strings.TrimPrefix(e.Type, secondTablePrefix), e.Agg, e.Seq, e.Writer, e.Txn, secs)
		return err
	}
	_, err := q.Exec(ctx, insertBackdatedSQL, e.ID, e.Type, e.Agg, e.Seq, e.Writer, e.Txn, e.Bucket, secs)
	return err
}

// markBackdated backdates the rows of a new transaction, with the writer's
// probability (one age for the whole transaction).
func (w *writer) markBackdated(evs []event) {
	if w.backdate == 0 || w.rng.Float64() >= w.backdate {
		return
	}
	d := (backdateMin + time.Duration(w.rng.Int64N(int64(backdateMax-backdateMin)))).Round(time.Second)
	for i := range evs {
		if !evs[i].Message {
			evs[i].Backdate = d
		}
	}
}

// heldLog records the slow writers' holds: when each attempt's transaction
// was held open.
type heldLog struct {
	mu      sync.Mutex
	spans   [][2]time.Time
	writers map[int]bool
}

// holdOpen keeps the writer's open transaction for its hold, if it has one;
// false when ctx ended first (the attempt is then rolled back).
func (w *writer) holdOpen(ctx context.Context) bool {
	if w.holdMax == 0 {
		return true
	}
	d := w.holdMin + time.Duration(w.rng.Int64N(int64(w.holdMax-w.holdMin)+1))
	from := time.Now()
	ok := sleepCtx(ctx, d) // the transaction stays open across whatever fault comes
	w.held.mu.Lock()
	w.held.spans = append(w.held.spans, [2]time.Time{from, time.Now()})
	w.held.mu.Unlock()
	return ok
}

// startSlowWriters starts the two slow writers; they stop with the others
// (stop) and report to r.workers.
func (r *run) startSlowWriters(ctx context.Context, stop <-chan struct{}, wg *sync.WaitGroup, m mode, seed uint64) {
	r.held = &heldLog{writers: map[int]bool{}}
	for i, aggs := range [][]*aggregate{
		{{id: "slow-a0", typ: "order", next: 1}, {id: "slow-a1", typ: "payment", next: 1}},
		{{id: "inv-slow-a0", typ: secondTablePrefix + "invoice", next: 1}},
	} {
		n := m.Writers + 5 + secondWriters + i // after the compacted topic's writer
		// multi 1: every transaction has 2–4 rows, in BEGIN … COMMIT.
		wr := newWriter(n, r.dsn, aggs, 1, seed, r.ledger, r.wstats)
		wr.bucket = &r.bucket
		wr.backdate, wr.holdMin, wr.holdMax, wr.held = slowBackdateProb, holdMin, holdMax, r.held
		if i == 1 {
			wr.ins, wr.lookup = insertSecond, committedSQL("billing.events", "event_id")
		}
		r.held.writers[n] = true
		wg.Go(func() {
			if err := wr.run(ctx, stop, slowInterval); err != nil {
				r.workers <- fmt.Errorf("slow writer %d: %w", n, err)
			}
		})
	}
}

// verifySince is the --since of the run's verify: early enough for the
// backdated rows (the database holds this run's rows only).
func verifySince(flowStart time.Time) time.Time { return flowStart.Add(-backdateMax - time.Minute) }

// slowReport is what the backdated rows and the held transactions did (the
// report's "backdated_and_held" section).
type slowReport struct {
	BackdatedRows    int    `json:"backdated_rows"`
	BackdatedDeleted int    `json:"backdated_rows_deleted_by_retention"`
	HeldTxns         int    `json:"held_transactions_committed"`
	HeldAttempts     int    `json:"held_attempts"`
	HeldDuringFault  int    `json:"held_attempts_open_during_a_fault"`
	VerifySince      string `json:"verify_since"`
}

// slowCounts fills the report's section.
func (o *observation) slowCounts(events []event) *slowReport {
	sr := &slowReport{VerifySince: verifySince(o.FlowStart).UTC().Format(time.RFC3339)}
	retDeleted := o.retentionDeleted()
	txns := map[[2]int64]bool{}
	for _, e := range events {
		if e.Backdate > 0 {
			sr.BackdatedRows++
			if retDeleted[e.ID] {
				sr.BackdatedDeleted++
			}
		}
		if o.Held != nil && o.Held.Writers[e.Writer] {
			txns[[2]int64{int64(e.Writer), e.Txn}] = true
		}
	}
	sr.HeldTxns = len(txns)
	if o.Held == nil {
		return sr
	}
	sr.HeldAttempts = len(o.Held.Spans)
	for _, s := range o.Held.Spans {
		for _, f := range o.Faults {
			if f.Start.Before(s[1]) && f.End.After(s[0]) {
				sr.HeldDuringFault++
				break
			}
		}
	}
	return sr
}

func (sr *slowReport) String() string {
	return fmt.Sprintf("%d backdated rows (%d deleted by retention); %d held transactions committed, %d held attempts, %d of them open during a fault; verify --since %s",
		sr.BackdatedRows, sr.BackdatedDeleted, sr.HeldTxns, sr.HeldAttempts, sr.HeldDuringFault, sr.VerifySince)
}
