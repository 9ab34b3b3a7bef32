package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/outbox-cdc/outbox-cdc/replication"
)

// TableStatus is one outbox table as `outbox-cdc status` reports it: whether
// its inserts reach the stream now (the guard's reading).
type TableStatus struct {
	Table string `json:"table"`
	// Streamed: the table exists, has the mapped columns and is in the
	// publication, which publishes inserts.
	Streamed bool   `json:"streamed"`
	Problem  string `json:"problem,omitempty"`
	// OldestRowAge (seconds, by created_at on the database's clock) and
	// SizeBytes (pg_total_relation_size) are what outbox.retention keeps
	// down; absent when the table has no created_at column.
	OldestRowAge *float64 `json:"oldest_row_age_seconds,omitempty"`
	SizeBytes    *int64   `json:"size_bytes,omitempty"`
}

// tablesStatus reads every outbox table's publication membership.
func tablesStatus(ctx context.Context, src replication.Source) []TableStatus {
	var out []TableStatus
	for _, t := range src.Tables() {
		ts := TableStatus{Table: t.Schema + "." + t.Table}
		w := replication.NewWatch(t)
		s, err := w.Read(ctx, 0)
		w.Close()
		switch {
		case err != nil:
			ts.Problem = err.Error()
		default:
			ts.Problem = s.LeftStream(t, s.Membership) + s.SchemaProblem(t)
		}
		ts.Streamed = ts.Problem == ""
		r := replication.NewRetainer(t)
		if st, err := r.Stats(ctx); err == nil {
			age := 0.0
			if !st.Oldest.IsZero() {
				age = max(0, time.Since(st.Oldest).Seconds())
			}
			ts.OldestRowAge, ts.SizeBytes = &age, &st.Bytes
		}
		r.Close(ctx)
		out = append(out, ts)
	}
	return out
}

func printTables(w io.Writer, ts []TableStatus) {
	for _, t := range ts {
		state := "streamed"
		if !t.Streamed {
			state = "NOT streamed: " + t.Problem
		}
		fmt.Fprintf(w, "outbox table    %s, %s\n", t.Table, state)
		if t.SizeBytes != nil {
			fmt.Fprintf(w, "  rows          oldest %s old, table %s\n", (time.Duration(*t.OldestRowAge) * time.Second).Round(time.Second), bytesText(*t.SizeBytes))
		}
	}
}
