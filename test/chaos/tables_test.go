package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// A second outbox table in the same connector (outbox.tables): billing.events
// has other column names, a header column of its own and its own topic. Its
// writers record their events in the same ledger, with Type
// "billing.<aggregate_type>" so that the checker's topic rule
// (<prefix>.<Type>) names the table's topic; their aggregates are theirs
// alone, so the checker's per-aggregate order is order per aggregate per
// table.

const (
	// secondTablePrefix starts the ledger Type of billing.events rows.
	secondTablePrefix = "billing."
	// secondWriters write billing.events beside the outbox writers.
	secondWriters  = 2
	secondTableDDL = `CREATE SCHEMA billing;
CREATE TABLE billing.events (
	event_id uuid PRIMARY KEY,
	kind text NOT NULL,
	invoice_id text,
	name text NOT NULL,
	body jsonb,
	region text,
	created_at timestamptz NOT NULL DEFAULT now())`
	secondInsertSQL = `INSERT INTO billing.events (event_id, kind, invoice_id, name, body, region)
	VALUES ($1::uuid, $2, $3, 'Billed', jsonb_build_object('seq', $4::int, 'writer', $5::int, 'txn', $6::bigint, ` + lowField + `), 'eu')`
	// secondTableRows is added to the checker's read of the outbox table.
	secondTableRows = ` UNION ALL SELECT event_id::text, invoice_id, (body->>'seq')::int, NULL::timestamptz, '' FROM billing.events`
)

// secondTopic is the topic of billing.events rows (kind invoice).
func secondTopic(prefix string) string { return prefix + "." + secondTablePrefix + "invoice" }

// outboxSection is the connector's outbox section: both tables, the second
// with its own mapping, header column and topic.
func outboxSection(prefix string) string {
	return fmt.Sprintf(`outbox:
`+messageSection()+retentionSection()+`  tables:
    - table: public.outbox
    - table: billing.events
      columns: {id: event_id, aggregate_type: kind, aggregate_id: invoice_id, event_type: name, payload: body}
      header_columns: [region]
      topic: %q
`, prefix+"."+secondTablePrefix+"{aggregate_type}")
}

// insertSecond writes e to billing.events.
func insertSecond(ctx context.Context, q execer, e event) error {
	_, err := q.Exec(ctx, secondInsertSQL, e.ID, strings.TrimPrefix(e.Type, secondTablePrefix), e.Agg, e.Seq, e.Writer, e.Txn)
	return err
}

// startSecondWriters starts the writers of billing.events; they stop with
// the outbox writers (stop) and report to r.workers.
func (r *run) startSecondWriters(ctx context.Context, stop <-chan struct{}, wg *sync.WaitGroup, m mode, seed uint64) {
	// The checker covers the second table only if its writers committed.
	r.t.Cleanup(func() {
		n := 0
		for _, e := range r.ledger.all() {
			if strings.HasPrefix(e.Type, secondTablePrefix) {
				n++
			}
		}
		r.t.Logf("chaos: %d of %d committed events are billing.events rows (topic %s)", n, r.ledger.len(), secondTopic(r.prefix))
		if n == 0 {
			r.t.Errorf("no billing.events row was committed: the second outbox table was not exercised")
		}
	})
	for i := range secondWriters {
		n := m.Writers + 2 + i // after the burst and oversize writers
		aggs := []*aggregate{{id: fmt.Sprintf("inv-w%d-a0", n), typ: secondTablePrefix + "invoice", next: 1},
			{id: fmt.Sprintf("inv-w%d-a1", n), typ: secondTablePrefix + "invoice", next: 1}}
		wr := newWriter(n, r.dsn, aggs, m.Multi, seed, r.ledger, r.wstats)
		wr.ins, wr.lookup = insertSecond, committedSQL("billing.events", "event_id")
		wr.backdate = backdateProb // slow_test.go
		wg.Go(func() {
			// Twice the outbox writers' pause: the second table is the smaller stream.
			if err := wr.run(ctx, stop, 2*m.Interval); err != nil {
				r.workers <- fmt.Errorf("billing writer %d: %w", n, err)
			}
		})
	}
}
