package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// ibVersioned is an event of aggregate with the version it brought the
// aggregate to; no version header when version is "".
func ibVersioned(topic, aggregate, id, version string) *kgo.Record {
	r := ibEvent(topic, aggregate, id, 0)
	if version != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "aggregate_version", Value: []byte(version)})
	}
	return r
}

// TestInboxApplyVersion: the version guard applies an event unless its
// aggregate version is older than the last one the consumer applied to that
// aggregate, or it is that version's event already applied. The events of
// one change (two outbox rows stamped with the same version) are all
// applied. Each skip is counted by its reason; records without a version
// pass.
func TestInboxApplyVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	ic := ibNew(t, dsn, "unused", "unused", newIBCalls().handler(nil)) // never run: only its ApplyVersion
	defer ic.c.Close()
	noID := func(offset int64, version string) *kgo.Record {
		r := ibVersioned("t", "o-3", "", version)
		r.Offset = offset // its event id is "t/0/<offset>"
		return r
	}
	for i, step := range []struct {
		rec  *kgo.Record
		want bool
	}{
		{ibVersioned("t", "o-1", "e-a", "2"), true},
		{ibVersioned("t", "o-1", "e-b", "2"), true},  // the same change's second event
		{ibVersioned("t", "o-1", "e-a", "2"), false}, // the same event again (its inbox row cleaned up)
		{ibVersioned("t", "o-1", "e-c", "1"), false}, // older, arriving late (a replay, a repair)
		{ibVersioned("t", "o-1", "e-d", "3"), true},
		{ibVersioned("t", "o-1", "e-b", "2"), false}, // the change before, now older
		{ibVersioned("t", "o-2", "e-e", "1"), true},  // another aggregate
		{ibVersioned("t", "o-1", "e-f", ""), true},   // no version: no guard
		{noID(7, "1"), true},                         // without an id: keyed by offset
		{noID(8, "1"), true},
		{noID(7, "1"), false},
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
			v, _ := inbox.AggregateVersion(step.rec)
			t.Errorf("step %d (%s, event %s, version %d): applied %v, want %v", i, step.rec.Key, inbox.EventID(step.rec), v, got, step.want)
		}
	}
	var v int64
	if err := conn.QueryRow(ctx, `SELECT version FROM inbox_versions WHERE consumer_name = 'inventory' AND aggregate_type = 'order' AND aggregate_id = 'o-1'`).Scan(&v); err != nil || v != 3 {
		t.Fatalf("stored version of o-1: %d (%v), want 3", v, err)
	}
	for reason, want := range map[string]float64{"older": 2, "applied": 2} {
		if got := ibVersionSkips(t, ic, reason); got != want {
			t.Errorf("%s{reason=%q} = %v, want %v", inbox.MetricVersionSkipped, reason, got, want)
		}
	}
}

// TestInboxApplyVersionOneChange: an application that writes two outbox
// rows for one change of an aggregate stamps both with the aggregate's new
// version; a handler guarded by ApplyVersion applies both, and still drops
// an older event arriving after them.
func TestInboxApplyVersionOneChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	var c atomic.Pointer[inbox.Consumer]
	var mu sync.Mutex
	var seen []string
	handler := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		ok, err := c.Load().ApplyVersion(ctx, tx, rec)
		if err != nil {
			return err
		}
		mu.Lock()
		seen = append(seen, inbox.EventID(rec))
		mu.Unlock()
		if !ok {
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO handled (event_id) VALUES ($1)`, inbox.EventID(rec))
		return err
	}
	ic := ibStart(t, dsn, topic, "inbox-"+topic, handler)
	c.Store(ic.c)
	ibProduce(ctx, t,
		ibVersioned(topic, "o-1", "placed", "1"),
		ibVersioned(topic, "o-1", "paid", "2"),           // one change: the order is paid …
		ibVersioned(topic, "o-1", "invoice-issued", "2"), // … and its invoice issued, in the same transaction
		ibVersioned(topic, "o-1", "placed-copy", "1"),    // an older event republished late
	)
	ibWait(t, ctx, "4 events seen", func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 4 })
	ic.stop(t)
	got := ibHandledRows(ctx, t, conn)
	if want := []string{"placed", "paid", "invoice-issued"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("applied %v, want %v (seen %v)", got, want, seen)
	}
}

// ibVersionSkips is the consumer's count of ApplyVersion skips for reason.
func ibVersionSkips(t *testing.T, ic *ibConsumer, reason string) float64 {
	t.Helper()
	mfs, err := ic.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != inbox.MetricVersionSkipped {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] == "inventory" && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("metric %s{consumer=inventory,reason=%s} not registered", inbox.MetricVersionSkipped, reason)
	return 0
}

// TestInboxApplyVersionOlderTable: a version table created by an older
// release (without event_ids) makes ApplyVersion fail saying what to run;
// CreateTable adds the column and keeps the versions recorded.
func TestInboxApplyVersionOlderTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := newDatabase(t)
	conn := olConn(ctx, t, dsn)
	if _, err := conn.Exec(ctx, `CREATE TABLE inbox_versions (consumer_name text NOT NULL, aggregate_type text NOT NULL,
		aggregate_id text NOT NULL, version bigint NOT NULL, PRIMARY KEY (consumer_name, aggregate_type, aggregate_id));
		INSERT INTO inbox_versions VALUES ('inventory', 'order', 'o-1', 5)`); err != nil {
		t.Fatal(err)
	}
	ic := ibNew(t, dsn, "unused", "unused", newIBCalls().handler(nil))
	defer ic.c.Close()
	apply := func(rec *kgo.Record) (bool, error) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		ok, err := ic.c.ApplyVersion(ctx, tx, rec)
		if err == nil {
			err = tx.Commit(ctx)
		}
		return ok, err
	}
	if _, err := apply(ibVersioned("t", "o-1", "e-a", "6")); err == nil || !strings.Contains(err.Error(), "run inbox.CreateTable") {
		t.Fatalf("ApplyVersion on the older table: %v, want an error saying to run inbox.CreateTable", err)
	}
	if err := inbox.CreateTable(ctx, conn, inbox.DefaultTable); err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		id, version string
		want        bool
	}{{"e-z", "5", true}, {"e-y", "4", false}, {"e-a", "6", true}} {
		ok, err := apply(ibVersioned("t", "o-1", step.id, step.version))
		if err != nil || ok != step.want {
			t.Errorf("step %d (event %s, version %s) after CreateTable: applied %v (%v), want %v", i, step.id, step.version, ok, err, step.want)
		}
	}
}
