package integration

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
)

// Two outbox tables in one connector (outbox.tables): public.outbox in the
// default shape, and billing.events with other column names, a header column
// of its own, its own topic and the CloudEvents binary format.

// billingTopic is the topic of billing.events rows of aggType.
func billingTopic(aggType string) string { return "billing." + aggType + "." + runID }

func createBillingOutbox(t *testing.T, dsn string) {
	t.Helper()
	exec1(t, dsn, `CREATE SCHEMA billing`)
	exec1(t, dsn, `CREATE TABLE billing.events (
		event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		kind text NOT NULL,
		invoice_id text,
		name text NOT NULL,
		body text,
		region text,
		created_at timestamptz NOT NULL DEFAULT now())`)
}

// tablesYAML is the outbox section of both tables.
func tablesYAML() string {
	return fmt.Sprintf(`outbox:
  tables:
    - table: public.outbox
      header_columns: [tenant]
    - table: billing.events
      columns: {id: event_id, aggregate_type: kind, aggregate_id: invoice_id, event_type: name, payload: body}
      header_columns: [region]
      topic: %q
      format: cloudevents-binary
`, "billing.{aggregate_type}."+runID)
}

// tablesConfig is testConfig with both tables.
func tablesConfig(t *testing.T, dsn, slot string) *config.Config {
	cfg := testConfig(t, dsn, "", slot)
	cfg.Outbox.Tables = []config.OutboxTable{
		{Table: "public.outbox", HeaderColumns: []string{"tenant"}},
		{Table: "billing.events", Columns: config.Columns{ID: "event_id", AggregateType: "kind", AggregateID: "invoice_id",
			EventType: "name", Payload: "body"}, HeaderColumns: []string{"region"}, Topic: "billing.{aggregate_type}." + runID,
			Format: "cloudevents-binary"},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// tablesDB is a new database with both outbox tables, and a connection to it.
func tablesDB(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	createBillingOutbox(t, dsn)
	return dsn, pgConnect(t, dsn)
}

// tablesConfigFile writes the binary's configuration for both tables with
// slot (and publication) slot.
func tablesConfigFile(t *testing.T, dsn, slot string) string {
	t.Helper()
	return writeConfig(t, yamlFor(t, dsn, slot, tablesYAML()))
}

// writeBoth writes seq of aggregate key to both tables in one transaction,
// the billing row first when billingFirst.
func writeBoth(ctx context.Context, conn *pgx.Conn, aggType, key string, seq int, billingFirst bool) error {
	order := []string{
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant)
			VALUES ($1, $2, 'E', jsonb_build_object('seq', $3::int), 'acme')`,
		`INSERT INTO billing.events (kind, invoice_id, name, body, region)
			VALUES ($1, $2, 'Billed', json_build_object('seq', $3::int)::text, 'eu')`,
	}
	if billingFirst {
		order[0], order[1] = order[1], order[0]
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, q := range order {
			if _, err := tx.Exec(ctx, q, aggType, key, seq); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkTableRecords checks one table's records: every seq 1..last[key] of
// every key is there, and per key the sequence only goes back where a
// replayed tail starts (at-least-once after a kill).
func checkTableRecords(t *testing.T, name string, recs []*kgo.Record, last map[string]int) {
	t.Helper()
	type ev struct {
		key string
		seq int
	}
	seen := map[ev]bool{}
	for _, r := range recs {
		seen[ev{string(r.Key), seqOf(t, r)}] = true
	}
	for key, n := range last {
		for i := 1; i <= n; i++ {
			if !seen[ev{key, i}] {
				t.Errorf("%s: event %s/%d lost", name, key, i)
			}
		}
	}
	for _, rs := range byPartition(recs) {
		prev := map[string]int{}
		for _, r := range rs {
			k, s := string(r.Key), seqOf(t, r)
			if p, ok := prev[k]; ok && s != p+1 && s > p {
				t.Errorf("%s: key %s: seq %d after %d (gap or reorder)", name, k, s, p)
			}
			prev[k] = s
		}
	}
}

// checkShapes checks each table's records carry that table's headers and
// format, and nothing of the other table's.
func checkShapes(t *testing.T, orders, billing []*kgo.Record) {
	t.Helper()
	for _, r := range orders {
		if v, _ := header(r, "tenant"); v != "acme" {
			t.Fatalf("outbox record on %s: tenant header %q, want acme", r.Topic, v)
		}
		if _, ok := header(r, "region"); ok {
			t.Fatalf("outbox record on %s has the billing table's region header", r.Topic)
		}
		if _, ok := header(r, "ce_id"); ok {
			t.Fatalf("outbox record on %s is a CloudEvent; its table's format is plain", r.Topic)
		}
	}
	for _, r := range billing {
		if v, _ := header(r, "region"); v != "eu" {
			t.Fatalf("billing record on %s: region header %q, want eu", r.Topic, v)
		}
		if _, ok := header(r, "tenant"); ok {
			t.Fatalf("billing record on %s has the outbox table's tenant header", r.Topic)
		}
		if v, _ := header(r, "ce_type"); v != "Billed" {
			t.Fatalf("billing record on %s: ce_type %q, want Billed (cloudevents-binary from the name column)", r.Topic, v)
		}
		if v, _ := header(r, "ce_source"); !strings.HasSuffix(v, "/billing.events") {
			t.Fatalf("billing record on %s: ce_source %q, want the billing table's", r.Topic, v)
		}
	}
}

// TestTablesKill9 runs the real binary on two outbox tables while writers
// commit transactions that write both, interleaved, and kills it with
// SIGKILL twice: every event is on its own table's topic, in order per
// aggregate per table, nothing lost.
func TestTablesKill9(t *testing.T) {
	dsn, _ := tablesDB(t)
	addr := freeAddr(t)
	cfgPath := tablesConfigFile(t, dsn, "tables_kill9")
	env := []string{"OUTBOX_CDC_HTTP_LISTEN=" + addr, "OUTBOX_CDC_POSTGRES_STATUS_INTERVAL=100ms", "OUTBOX_CDC_POSTGRES_RECONNECT_BACKOFF_MAX=1s"}
	p := startProc(t, cfgPath, addr, true, env...)

	// Three writers, each of its own aggregate, commit transactions that
	// write both tables (in either order); the connector is killed twice
	// while they run.
	ws := make([]*bothWriter, 3)
	for i := range ws {
		ws[i] = startBothWriter(t, dsn, "tbl", fmt.Sprintf("w%d", i))
	}
	for k := 1; k <= 2; k++ {
		for _, w := range ws {
			w.advance(t, 50, fmt.Sprintf("before kill %d", k))
		}
		p.kill()
		p = startProc(t, cfgPath, addr, true, env...)
	}
	for _, w := range ws {
		w.advance(t, 20, "after the last restart")
	}
	lastBy, n := map[string]int{}, 0
	for i, w := range ws {
		lastBy[fmt.Sprintf("w%d", i)] = w.finish(t)
		n += lastBy[fmt.Sprintf("w%d", i)]
	}
	orders := consumeN(t, []string{topicFor("tbl")}, n, 2*time.Minute, 2*time.Second)
	billing := consumeN(t, []string{billingTopic("tbl")}, n, 2*time.Minute, time.Second)
	checkTableRecords(t, "public.outbox", orders, lastBy)
	checkTableRecords(t, "billing.events", billing, lastBy)
	checkShapes(t, orders, billing)
	t.Logf("%d transactions over two tables; %d and %d records after 2 kills", n, len(orders), len(billing))
	// The last incarnation published events of both tables, each counted
	// under its own table label.
	for _, table := range []string{"public.outbox", "billing.events"} {
		name := fmt.Sprintf(`outbox_cdc_events_published_total{table=%q}`, table)
		if v, err := metricValue(addr, name); err != nil || v < 1 {
			t.Errorf("%s = %v (%v), want at least 1", name, v, err)
		}
	}
	stopClean(t, p)
}

// TestTablesSnapshotAndReplay: rows already in both tables when the slot is
// created are published by the snapshot, each on its table's topic; a
// replay of a range republishes the events of both tables.
func TestTablesSnapshotAndReplay(t *testing.T) {
	dsn, conn := tablesDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := 1; i <= 20; i++ {
		if err := writeBoth(ctx, conn, "snap", "k", i, i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	cfg := tablesConfig(t, dsn, "tables_snap")
	cfg.Snapshot.Mode = "pending"
	cfg.Postgres.Retain = "1GB"
	c := startConnector(t, cfg)
	for i := 21; i <= 30; i++ { // streamed after the snapshot
		if err := writeBoth(ctx, conn, "snap", "k", i, false); err != nil {
			t.Fatal(err)
		}
	}
	orders := consumeN(t, []string{topicFor("snap")}, 30, time.Minute, 2*time.Second)
	billing := consumeN(t, []string{billingTopic("snap")}, 30, time.Minute, time.Second)
	if len(orders) != 30 || len(billing) != 30 {
		t.Fatalf("%d and %d records, want exactly 30 of each (snapshot then stream, no duplicate)", len(orders), len(billing))
	}
	checkTableRecords(t, "public.outbox", orders, map[string]int{"k": 30})
	checkTableRecords(t, "billing.events", billing, map[string]int{"k": 30})
	checkShapes(t, orders, billing)
	for _, table := range []string{"public.outbox", "billing.events"} {
		if n := testutil.ToFloat64(c.m.SnapshotEvents.WithLabelValues(table)); n != 20 {
			t.Errorf("snapshot_events_total{table=%q} = %v, want 20", table, n)
		}
	}

	// Replay a range written while the connector runs.
	from := currentLSN(t, conn)
	for i := 31; i <= 40; i++ {
		if err := writeBoth(ctx, conn, "snap", "k", i, i%2 == 1); err != nil {
			t.Fatal(err)
		}
	}
	to := currentLSN(t, conn)
	consumeN(t, []string{topicFor("snap")}, 40, time.Minute, 0)
	cfgPath := tablesConfigFile(t, dsn, "tables_snap")
	code, out := runBinary(t, 2*time.Minute, nil, "replay", "--config", cfgPath,
		"--from-lsn", from.String(), "--to-lsn", to.String(), "--topic-prefix", "again.")
	if code != 0 || !strings.Contains(out, "replay done: 20 events") {
		t.Fatalf("replay: exit %d, want 0 and 20 events (10 per table):\n%s", code, out)
	}
	ro := consumeN(t, []string{"again." + topicFor("snap")}, 10, time.Minute, 2*time.Second)
	rb := consumeN(t, []string{"again." + billingTopic("snap")}, 10, time.Minute, time.Second)
	if len(ro) != 10 || len(rb) != 10 {
		t.Fatalf("replayed %d and %d records, want exactly 10 of each", len(ro), len(rb))
	}
	for i, r := range ro {
		if s := seqOf(t, r); s != 31+i {
			t.Errorf("replayed outbox record %d: seq %d, want %d", i, s, 31+i)
		}
	}
	for i, r := range rb {
		if s := seqOf(t, r); s != 31+i {
			t.Errorf("replayed billing record %d: seq %d, want %d", i, s, 31+i)
		}
	}
	checkShapes(t, ro, rb)
}

// TestTablesVerify: rows of both tables written while the slot is gone are
// never streamed; verify reads every table, reports them missing, and
// --repair republishes each by its own table's routing.
func TestTablesVerify(t *testing.T) {
	dsn, conn := tablesDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var since time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&since); err != nil {
		t.Fatal(err)
	}
	cfg := tablesConfig(t, dsn, "tables_verify")
	c := startConnector(t, cfg)
	for i := 1; i <= 10; i++ {
		if err := writeBoth(ctx, conn, "ver", "k", i, i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	consumeN(t, []string{topicFor("ver")}, 10, time.Minute, 0)
	consumeN(t, []string{billingTopic("ver")}, 10, time.Minute, 0)
	c.stop(t)
	dropReleasedSlot(t, dsn, "tables_verify")
	for i := 11; i <= 13; i++ { // never decoded: no slot
		if err := writeBoth(ctx, conn, "ver", "k", i, false); err != nil {
			t.Fatal(err)
		}
	}

	cfgPath := tablesConfigFile(t, dsn, "tables_verify")
	sinceArg := since.Add(-time.Second).UTC().Format(time.RFC3339Nano)
	code, v, out := runVerifyJSON(t, 2*time.Minute, "--config", cfgPath, "--since", sinceArg)
	if code != 1 || v.Rows != 26 || v.Missing.Count != 6 || v.Found != 20 || len(v.Topics) != 2 {
		t.Fatalf("verify --json: exit %d, %+v; want exit 1, 26 rows of two tables on two topics, 6 missing, 20 found:\n%s", code, v, out)
	}
	code, v, out = runVerifyJSON(t, 2*time.Minute, "--config", cfgPath, "--since", sinceArg, "--repair")
	if code != 0 || v.Repair == nil || v.Repair.Published != 6 || v.Repair.Failed != 0 {
		t.Fatalf("verify --repair: exit %d, %+v (repair %+v); want exit 0 and 6 republished:\n%s", code, v, v.Repair, out)
	}
	orders := consumeN(t, []string{topicFor("ver")}, 13, time.Minute, 2*time.Second)
	billing := consumeN(t, []string{billingTopic("ver")}, 13, time.Minute, time.Second)
	checkTableRecords(t, "public.outbox", orders, map[string]int{"k": 13})
	checkTableRecords(t, "billing.events", billing, map[string]int{"k": 13})
	checkShapes(t, orders, billing)
}

// bothWriter writes transactions to both tables (writeBoth) until stopped.
type bothWriter struct {
	n    atomic.Int64 // last seq committed
	stop chan struct{}
	done chan error
}

func startBothWriter(t *testing.T, dsn, aggType, key string) *bothWriter {
	t.Helper()
	w := &bothWriter{stop: make(chan struct{}), done: make(chan error, 1)}
	conn := pgConnect(t, dsn)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		for i := 1; ; i++ {
			select {
			case <-w.stop:
				w.done <- nil
				return
			default:
			}
			if err := writeBoth(ctx, conn, aggType, key, i, i%3 == 0); err != nil {
				w.done <- err
				return
			}
			w.n.Store(int64(i))
			time.Sleep(5 * time.Millisecond) // pacing: a steady stream of small transactions
		}
	}()
	t.Cleanup(func() { w.finish(t) })
	return w
}

// advance waits until n more transactions are committed.
func (w *bothWriter) advance(t *testing.T, n int64, what string) {
	t.Helper()
	at := w.n.Load() + n
	waitFor(t, time.Minute, fmt.Sprintf("%d transactions %s", n, what), func() bool { return w.n.Load() >= at })
}

// finish stops the writer and returns the last seq it committed.
func (w *bothWriter) finish(t *testing.T) int {
	t.Helper()
	select {
	case <-w.stop:
	default:
		close(w.stop)
		if err := <-w.done; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	return int(w.n.Load())
}

// TestTablesSecondLeavesStream: the second outbox table is removed from the
// publication while a writer writes both. The guard of that table stops the
// connector (exit 1, naming it), status reports it, and after the fix a
// restart publishes every event of both tables, the second table's gap read
// back from the table.
func TestTablesSecondLeavesStream(t *testing.T) {
	dsn, _ := tablesDB(t)
	cfgPath := tablesConfigFile(t, dsn, "tables_leave")
	var w *bothWriter
	code, out := runUntilExit(t, cfgPath, time.Minute, func(*process) {
		w = startBothWriter(t, dsn, "leave", "k")
		w.advance(t, 20, "before billing.events leaves the stream")
		exec1(t, dsn, "ALTER PUBLICATION tables_leave DROP TABLE billing.events")
	})
	// The log quotes the error: the table's quoted name is escaped there.
	if want := `outbox table \"billing\".\"events\" was removed from publication tables_leave`; code != 1 || !strings.Contains(out, want) {
		t.Fatalf("exit %d, want 1 saying %q:\n%s", code, want, out)
	}
	w.advance(t, 10, "in the gap")
	code, st := runBinary(t, time.Minute, nil, "status", "--config", cfgPath)
	if code != 0 || !strings.Contains(st, "outbox table    public.outbox, streamed") ||
		!strings.Contains(st, "outbox table    billing.events, NOT streamed: outbox table \"billing\".\"events\" was removed from publication") {
		t.Fatalf("status: exit %d, want 0 with public.outbox streamed and billing.events not:\n%s", code, st)
	}
	exec1(t, dsn, "ALTER PUBLICATION tables_leave ADD TABLE billing.events")
	w.advance(t, 10, "after the fix")
	addr := freeAddr(t)
	p := startProc(t, cfgPath, addr, true, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	w.advance(t, 10, "while the connector runs again")
	last := w.finish(t)
	orders := consumeN(t, []string{topicFor("leave")}, last, time.Minute, 2*time.Second)
	billing := consumeN(t, []string{billingTopic("leave")}, last, time.Minute, time.Second)
	checkTableRecords(t, "public.outbox", orders, map[string]int{"k": last})
	checkTableRecords(t, "billing.events", billing, map[string]int{"k": last})
	checkShapes(t, orders, billing)
	// The gap's transactions wrote both tables: both were read back.
	for _, table := range []string{"public.outbox", "billing.events"} {
		name := fmt.Sprintf(`outbox_cdc_backfilled_events_total{table=%q}`, table)
		if v, err := metricValue(addr, name); err != nil || v < 10 {
			t.Errorf("%s = %v (%v), want at least the 10 rows written in the gap", name, v, err)
		}
	}
	stopClean(t, p)
	if t.Failed() {
		t.Logf("first run:\n%s\nafter the fix:\n%s", out, p.output())
	}
}
