package inbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestSchemaMatchesFile(t *testing.T) {
	got, err := Schema(DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for l := range strings.SplitSeq(SchemaSQL, "\n") {
		if !strings.HasPrefix(l, "--") {
			lines = append(lines, l)
		}
	}
	norm := func(s string) string { return strings.Join(strings.Fields(strings.ReplaceAll(s, `"`, "")), " ") }
	if norm(got) != norm(strings.Join(lines, "\n")) {
		t.Fatalf("schema.sql and Schema(%q) differ:\n%s\n---\n%s", DefaultTable, SchemaSQL, got)
	}

	got, err = Schema("App.Inbox")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "App"."Inbox" (`, `CREATE INDEX IF NOT EXISTS "Inbox_processed_at_idx" ON "App"."Inbox" (processed_at)`} {
		if !strings.Contains(got, want) {
			t.Errorf("Schema(App.Inbox) lacks %s:\n%s", want, got)
		}
	}
	for _, bad := range []string{"", "a.b.c", ".x", "x."} {
		if _, err := Schema(bad); err == nil {
			t.Errorf("Schema(%q) accepted", bad)
		}
	}
}

func TestEventID(t *testing.T) {
	r := &kgo.Record{Topic: "orders", Partition: 2, Offset: 41, Headers: []kgo.RecordHeader{{Key: "event_type", Value: []byte("X")}, {Key: "id", Value: []byte("e-1")}}}
	if got := EventID(r); got != "e-1" {
		t.Fatalf("EventID = %q", got)
	}
	r.Headers[1].Value = nil
	if got := EventID(r); got != "orders/2/41" {
		t.Fatalf("EventID without id = %q", got)
	}
	r.Headers = nil
	if got := EventID(r); got != "orders/2/41" {
		t.Fatalf("EventID without headers = %q", got)
	}
}

type nopDB struct{}

func (nopDB) Begin(context.Context) (pgx.Tx, error) { panic("not used") }

func TestNewValidatesAndSharesMetrics(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "Brokers, Group, Topics, DB, Handler") {
		t.Fatalf("New(Config{}) = %v", err)
	}
	reg := prometheus.NewRegistry()
	h := func(context.Context, pgx.Tx, *kgo.Record) error { return nil }
	for _, name := range []string{"a", "b"} {
		c, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: name, Topics: []string{"t"}, DB: nopDB{}, Handler: h, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		series[mf.GetName()] = len(mf.GetMetric())
	}
	for _, n := range []string{MetricProcessed, MetricDuplicates, MetricFailed, MetricDead, MetricHandler, MetricProcessing} {
		if series[n] != 2 {
			t.Errorf("%s: %d series, want 2 (one per consumer)", n, series[n])
		}
	}
	if series[MetricVersionSkipped] != 4 {
		t.Errorf("%s: %d series, want 4 (one per consumer and reason)", MetricVersionSkipped, series[MetricVersionSkipped])
	}
	if _, err := New(Config{Brokers: []string{"x:1"}, Group: "g", Topics: []string{"t"}, DB: nopDB{}, Handler: h, Table: "a.b.c"}); err == nil {
		t.Fatal("bad table accepted")
	}
}

// TestNewRefusesConn: a *pgx.Conn never reconnects once the server closed it
// (a restart stalled the consumer for good), so New asks for a pool.
func TestNewRefusesConn(t *testing.T) {
	h := func(context.Context, pgx.Tx, *kgo.Record) error { return nil }
	_, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, DB: (*pgx.Conn)(nil), Handler: h})
	if err == nil || !strings.Contains(err.Error(), "*pgxpool.Pool") {
		t.Fatalf("New with a *pgx.Conn = %v, want an error asking for a *pgxpool.Pool", err)
	}
}

func TestHandlerTimeoutDefault(t *testing.T) {
	h := func(context.Context, pgx.Tx, *kgo.Record) error { return nil }
	for _, tt := range []struct {
		opts []kgo.Opt
		set  time.Duration
		want time.Duration
	}{
		{nil, 0, 30 * time.Second},
		{[]kgo.Opt{kgo.RebalanceTimeout(10 * time.Second)}, 0, 5 * time.Second},
		{nil, time.Second, time.Second},
		{nil, -1, -1},
	} {
		c, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, DB: nopDB{}, Handler: h,
			KafkaOptions: tt.opts, HandlerTimeout: tt.set})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if c.cfg.HandlerTimeout != tt.want {
			t.Errorf("HandlerTimeout %v with %d options: got %v, want %v", tt.set, len(tt.opts), c.cfg.HandlerTimeout, tt.want)
		}
	}
}
