package replication

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SampleRows reads, from every outbox table (specs[i] for Tables()[i]),
// the last n rows of each event type in the snapshot order (spec.OrderBy,
// created_at or the primary key, as the snapshot orders them), oldest
// first, each table's rows by event type: the rows `outbox-cdc contracts
// check` validates. Every type present in a table has at least one row, so
// the read also lists the types. It reads the whole table once (a window
// over event_type), in one read-only repeatable-read transaction; Close
// ends it.
func (s Source) SampleRows(ctx context.Context, specs []RowSpec, n int) (*Rows, error) {
	if n < 1 {
		return nil, fmt.Errorf("contracts check: sample of %d rows per type", n)
	}
	r, err := s.begin(ctx, "contracts check")
	if err != nil {
		return nil, err
	}
	err = s.queryEach(r, specs, func(t Source, spec RowSpec) error {
		order, err := t.snapshotOrder(ctx, r.tx, spec.OrderBy)
		if err != nil {
			return err
		}
		return t.query(ctx, r, spec, sampleFilter(t.Schema, t.Table, spec.Mapping.EventType, order, n),
			append([]string{spec.Mapping.EventType}, order...))
	})
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// sampleFilter selects the last n rows of each event type by order. A row
// is named by (tableoid, ctid): ctid alone repeats across the partitions
// of a partitioned outbox.
func sampleFilter(schema, table, eventType string, order []string, n int) string {
	desc := make([]string, len(order))
	for i, c := range order {
		if !strings.HasPrefix(c, "(") { // a column; an expression is used as is
			c = pgx.Identifier{c}.Sanitize()
		}
		desc[i] = c + " DESC"
	}
	return fmt.Sprintf("(tableoid, ctid) IN (SELECT tableoid, ctid FROM (SELECT tableoid, ctid, row_number() OVER "+
		"(PARTITION BY %s ORDER BY %s) AS sample_rank FROM %s) sample WHERE sample_rank <= %d)",
		pgx.Identifier{eventType}.Sanitize(), strings.Join(desc, ", "), pgx.Identifier{schema, table}.Sanitize(), n)
}
