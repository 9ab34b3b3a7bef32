package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Table-less events (outbox.message_prefix): some of the writers'
// transactions also call pg_logical_emit_message(true, prefix, content)
// with the event fields the connector maps (docs/guide.md, "Table-less:
// Emit"). PostgreSQL decodes a logical message whatever the publication
// holds (pgoutput's messages option filters by prefix only), so a
// publication gap hides a mixed transaction's rows and not its messages:
// the gap repair, which reads the gap's rows back from the table, must skip
// only what it published (pipeline/backfill.go), losing neither.

const (
	// messagePrefix is outbox.message_prefix of the run's connector.
	messagePrefix = "chaos-outbox"
	// messageProb is the share of a writer's transactions that also emit a
	// table-less event.
	messageProb = 0.2
	// emitSQL emits one table-less event carrying the fields a row has
	// (its payload too: seq, writer, txn), inside the caller's transaction.
	emitSQL = `SELECT pg_logical_emit_message(true, $1::text, jsonb_build_object(
		'id', $2::text, 'aggregate_type', $3::text, 'aggregate_id', $4::text, 'event_type', 'chaos',
		'payload', jsonb_build_object('seq', $5::int, 'writer', $6::int, 'txn', $7::bigint))::text)`
)

// messageSection is the connector's outbox.message_prefix line (inside
// its outbox section).
func messageSection() string { return fmt.Sprintf("  message_prefix: %q\n", messagePrefix) }

// emitMessage writes e as a table-less event.
func emitMessage(ctx context.Context, q execer, e event) error {
	_, err := q.Exec(ctx, emitSQL, messagePrefix, e.ID, e.Type, e.Agg, e.Seq, e.Writer, e.Txn)
	return err
}

// addMessage adds, with probability msgProb, one table-less event of one of
// the writer's message aggregates to the transaction's events, before or
// after a row (the transaction keeps a row: an unknown commit is settled
// by looking a row up).
func (w *writer) addMessage(evs []event, next map[*aggregate]int, bucket int) []event {
	if len(w.msgAggs) == 0 || w.rng.Float64() >= w.msgProb {
		return evs
	}
	a := w.msgAggs[w.rng.IntN(len(w.msgAggs))]
	if _, ok := next[a]; !ok {
		next[a] = a.next
	}
	m := event{ID: newUUID(), Agg: a.id, Type: a.typ, Seq: next[a], Writer: w.n, Txn: w.txn, Bucket: bucket, Message: true}
	next[a]++
	at := w.rng.IntN(len(evs) + 1)
	return append(evs[:at], append([]event{m}, evs[at:]...)...)
}

// firstRow is the first event of evs that is a row.
func firstRow(evs []event) event {
	for _, e := range evs {
		if !e.Message {
			return e
		}
	}
	return evs[0]
}

// messageAggs are writer n's aggregates of table-less events.
func messageAggs(n int) []*aggregate {
	return []*aggregate{{id: fmt.Sprintf("w%d-m0", n), typ: []string{"order", "payment"}[n%2], next: 1}}
}

// gapMixer is the writer of ops-publication-gap-messages: every one of its
// transactions inserts a row and emits a table-less event.
func (r *run) gapMixer() *writer {
	if r.mixer == nil {
		n := r.m.Writers + 2 + secondWriters // after the billing writers
		r.mixer = newWriter(n, r.dsn, []*aggregate{{id: "gapmix-r", typ: "order", next: 1}}, 0.5, r.seed, r.ledger, r.wstats)
		r.mixer.bucket = &r.bucket
		r.mixer.msgAggs = []*aggregate{{id: "gapmix-m", typ: "payment", next: 1}}
		r.mixer.msgProb = 1
		r.t.Cleanup(r.mixer.closeConn)
	}
	return r.mixer
}

// mixDuring commits mixed transactions (rows and table-less events) for
// d, at least two; it returns their events.
func (r *run) mixDuring(ctx context.Context, d time.Duration) ([]event, error) {
	w := r.gapMixer()
	end := time.Now().Add(d)
	var out []event
	for n := 0; n < 2 || time.Now().Before(end); n++ {
		evs, err := w.commitNext(ctx)
		if err != nil {
			return out, err
		}
		out = append(out, evs...)
		if !sleepCtx(ctx, 50*time.Millisecond) { // pacing of the mixed transactions
			return out, ctx.Err()
		}
	}
	return out, nil
}

// awaitMixed waits until every event of the gap's mixed transactions has
// been consumed after the restart and says how many rows and messages
// there were; a missing one is an operations failure.
func (r *run) awaitMixed(ctx context.Context, evs []event) string {
	deadline := time.Now().Add(time.Minute)
	var rows, msgs int
	var missing []string
	for _, e := range evs {
		if e.Message {
			msgs++
		} else {
			rows++
		}
		select {
		case <-r.live.watch(e.ID):
			continue
		case <-time.After(time.Until(deadline)): // the minute the catch-up may take
		case <-ctx.Done():
		}
		if _, ok := r.live.seenAt(e.ID); ok { // seen, though the deadline had passed when its turn came
			continue
		}
		kind := "row"
		if e.Message {
			kind = "message"
		}
		missing = append(missing, fmt.Sprintf("%s %s (%s seq %d, txn %d)", kind, e.ID, e.Agg, e.Seq, e.Txn))
	}
	if len(missing) > 0 {
		r.opsFailed(fOpsPubGapMsg, "%d of the gap's mixed events not consumed within 1m of the restart: %s", len(missing), strings.Join(missing, "; "))
		return fmt.Sprintf("; %d mixed transactions in the gap (%d rows, %d messages), %d NOT consumed", countTxns(evs), rows, msgs, len(missing))
	}
	return fmt.Sprintf("; %d mixed transactions in the gap (%d rows, %d messages), all consumed", countTxns(evs), rows, msgs)
}

func countTxns(evs []event) int {
	seen := map[int64]bool{}
	for _, e := range evs {
		seen[e.Txn] = true
	}
	return len(seen)
}
