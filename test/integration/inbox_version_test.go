package integration

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestInboxApplyVersion: the version guard applies an event only when its
// aggregate version is newer than the last one the consumer applied to that
// aggregate, as the seeds' consumers do; records without a version pass.
func TestInboxApplyVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	ic := ibNew(t, dsn, "unused", "unused", newIBCalls().handler(nil)) // never run: only its ApplyVersion
	defer ic.c.Close()
	rec := func(aggregate, version string) *kgo.Record {
		r := ibEvent("t", aggregate, "", 0)
		if version != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "aggregate_version", Value: []byte(version)})
		}
		return r
	}
	for i, step := range []struct {
		rec  *kgo.Record
		want bool
	}{
		{rec("o-1", "2"), true},
		{rec("o-1", "1"), false}, // older, arriving late (a replay, a repair)
		{rec("o-1", "2"), false}, // the same version again
		{rec("o-1", "3"), true},
		{rec("o-2", "1"), true}, // another aggregate
		{rec("o-1", ""), true},  // no version: no guard
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ic.c.ApplyVersion(ctx, tx, step.rec)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got != step.want {
			t.Errorf("step %d (%s version %s): applied %v, want %v", i, step.rec.Key, step.rec.Headers[len(step.rec.Headers)-1].Value, got, step.want)
		}
	}
	var v int64
	if err := conn.QueryRow(ctx, `SELECT version FROM inbox_versions WHERE consumer_name = 'inventory' AND aggregate_type = 'order' AND aggregate_id = 'o-1'`).Scan(&v); err != nil || v != 3 {
		t.Fatalf("stored version of o-1: %d (%v), want 3", v, err)
	}
}
