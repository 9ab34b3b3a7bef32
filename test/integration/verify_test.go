package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ledgerWriter commits one outbox row per transaction until stopped and
// keeps the id of every committed row: the test's own account of what was
// written.
type ledgerWriter struct {
	stop, done chan struct{}
	mu         sync.Mutex
	ids        []string
	err        error
}

func startLedgerWriter(t *testing.T, dsn, aggType string) *ledgerWriter {
	w := &ledgerWriter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			w.err = err
			return
		}
		defer conn.Close(context.Background())
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			var id string
			if err := conn.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, $2, 'E', jsonb_build_object('seq', $3::int)) RETURNING id::text`,
				aggType, fmt.Sprintf("k%d", i%4), i).Scan(&id); err != nil {
				w.err = err
				return
			}
			w.mu.Lock()
			w.ids = append(w.ids, id)
			w.mu.Unlock()
			time.Sleep(3 * time.Millisecond) // pacing: a steady trickle of transactions
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *ledgerWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ids)
}

// advance waits until the writer committed n more rows.
func (w *ledgerWriter) advance(t *testing.T, n int, phase string) {
	t.Helper()
	from := w.count()
	waitFor(t, time.Minute, fmt.Sprintf("%d more rows written %s", n, phase), func() bool {
		select {
		case <-w.done:
			t.Fatalf("writer stopped %s: %v", phase, w.err)
		default:
		}
		return w.count() >= from+n
	})
}

func (w *ledgerWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// written stops the writer and returns every committed id.
func (w *ledgerWriter) written(t *testing.T) []string {
	t.Helper()
	w.halt()
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	return w.ids
}

// verifyJSON is the part of `verify --json` the tests read.
type verifyJSON struct {
	Column      string   `json:"column"`
	Topics      []string `json:"topics"`
	Rows        int64    `json:"rows"`
	RecordsRead int64    `json:"records_read"`
	Found       int64    `json:"found"`
	Outside     int64    `json:"records_outside_range"`
	Missing     struct {
		Count int64    `json:"count"`
		First []string `json:"first"`
	} `json:"missing"`
	Duplicated struct {
		Count int64 `json:"count"`
	} `json:"duplicated"`
	OutOfOrder struct {
		Count int64 `json:"count"`
	} `json:"out_of_order"`
	Repair *struct {
		Published    int64  `json:"published"`
		DeadLettered int64  `json:"dead_lettered"`
		Parked       int64  `json:"parked"`
		Failed       int64  `json:"failed"`
		Error        string `json:"error"`
	} `json:"repair"`
	Seconds float64 `json:"seconds"`
}

// runVerify runs `outbox-cdc verify --json` with args; stdout alone is the
// JSON, so the binary is run here rather than with runBinary.
func runVerifyJSON(t *testing.T, timeout time.Duration, args ...string) (int, verifyJSON, string) {
	t.Helper()
	code, out := runBinary(t, timeout, nil, append([]string{"verify", "--json"}, args...)...)
	// Progress and logs go to stderr, combined here: the JSON object is the
	// part from the first line that is exactly "{".
	i := strings.Index(out, "\n{\n")
	j := i + 1
	if strings.HasPrefix(out, "{\n") {
		j = 0
	} else if i < 0 {
		t.Fatalf("verify --json printed no JSON object (exit %d):\n%s", code, out)
	}
	end := strings.Index(out[j:], "\n}\n")
	if end < 0 {
		t.Fatalf("verify --json: unterminated JSON (exit %d):\n%s", code, out)
	}
	var v verifyJSON
	if err := json.Unmarshal([]byte(out[j:j+end+3]), &v); err != nil {
		t.Fatalf("verify --json output is not JSON: %v\n%s", err, out)
	}
	return code, v, out
}

// TestVerifyRepair: rows written while the slot is gone are never published;
// verify finds exactly them, --repair republishes them, and a second verify
// finds nothing missing.
func TestVerifyRepair(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "verify")
	conn := pgConnect(t, dsn)
	var since time.Time
	if err := conn.QueryRow(context.Background(), "SELECT now()").Scan(&since); err != nil {
		t.Fatal(err)
	}
	c := startConnector(t, cfg)
	w := startLedgerWriter(t, dsn, "verify")
	w.advance(t, 40, "while the connector runs")

	// Stop the connector and drop its slot while the writer goes on: the
	// next start creates a new slot at the then current WAL position, so
	// what was written in between is never decoded.
	c.stop(t)
	dropReleasedSlot(t, dsn, "verify")
	w.advance(t, 40, "while the slot is gone")
	startConnector(t, cfg)
	w.advance(t, 40, "after the new slot")
	ids := w.written(t)

	end := currentLSN(t, conn)
	waitFor(t, time.Minute, "checkpoint past the last write", func() bool { return checkpointLSN(t, conn, "verify") >= end })
	topic := topicFor("verify")
	recs := consumeUpTo(t, []string{topic}, len(ids), 10*time.Second, 2*time.Second)
	consumed := map[string]bool{}
	for _, r := range recs {
		id, _ := header(r, "id")
		consumed[id] = true
	}
	lost := map[string]bool{}
	for _, id := range ids {
		if !consumed[id] {
			lost[id] = true
		}
	}
	t.Logf("wrote %d rows, %d records consumed (%d distinct), %d never published", len(ids), len(recs), len(consumed), len(lost))
	if len(lost) == 0 {
		t.Fatal("no row was lost while the slot was gone: the test shows nothing")
	}

	cfgPath := writeConfig(t, yamlFor(t, dsn, "verify", ""))
	sinceArg := since.Add(-time.Second).UTC().Format(time.RFC3339Nano)

	// Text output: exit 1 with the count.
	code, out := runBinary(t, 2*time.Minute, nil, "verify", "--config", cfgPath, "--since", sinceArg)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("missing         %d (first: ", len(lost))) {
		t.Fatalf("verify: exit %d, want 1 reporting %d missing:\n%s", code, len(lost), out)
	}

	// JSON: exactly the lost rows.
	code, v, out := runVerifyJSON(t, 2*time.Minute, "--config", cfgPath, "--since", sinceArg)
	if code != 1 || v.Rows != int64(len(ids)) || v.Missing.Count != int64(len(lost)) || v.Found != int64(len(ids)-len(lost)) ||
		v.Column != "created_at" || v.Outside != 0 || len(v.Topics) != 1 || v.Topics[0] != topic {
		t.Fatalf("verify --json: exit %d, %+v; want exit 1, %d rows, %d missing, %d found in %s:\n%s",
			code, v, len(ids), len(lost), len(ids)-len(lost), topic, out)
	}
	if len(v.Missing.First) == 0 || len(v.Missing.First) > 10 {
		t.Fatalf("missing.first has %d ids, want 1 to 10", len(v.Missing.First))
	}
	for _, id := range v.Missing.First {
		if !lost[id] {
			t.Errorf("verify reports %s missing; it was published", id)
		}
	}
	if v.OutOfOrder.Count != 0 {
		t.Errorf("%d records out of order before any repair", v.OutOfOrder.Count)
	}

	// Repair: exactly the lost rows, acknowledged.
	code, v, out = runVerifyJSON(t, 2*time.Minute, "--config", cfgPath, "--since", sinceArg, "--repair")
	if code != 0 || v.Repair == nil || v.Repair.Published != int64(len(lost)) || v.Repair.Failed != 0 || v.Missing.Count != int64(len(lost)) {
		t.Fatalf("verify --repair: exit %d, %+v (repair %+v); want exit 0 and %d republished:\n%s", code, v, v.Repair, len(lost), out)
	}
	t.Logf("verify --repair republished %d rows in %.1fs", v.Repair.Published, v.Seconds)

	// A second verify: nothing missing.
	code, out = runBinary(t, 2*time.Minute, nil, "verify", "--config", cfgPath, "--since", sinceArg)
	if code != 0 || !strings.Contains(out, "missing         0\n") {
		t.Fatalf("verify after the repair: exit %d, want 0 with 0 missing:\n%s", code, out)
	}
	t.Logf("second verify:\n%s", out)

	// The consumer has every id now.
	recs = consumeUpTo(t, []string{topic}, len(recs)+len(lost), time.Minute, 2*time.Second)
	for _, r := range recs {
		id, _ := header(r, "id")
		consumed[id] = true
	}
	for _, id := range ids {
		if !consumed[id] {
			t.Errorf("row %s still not in %s after the repair", id, topic)
		}
	}
}

// TestVerifyUsage: bad flags and a table verify cannot read by time exit 2
// with what to do.
func TestVerifyUsage(t *testing.T) {
	dsn := newDatabase(t)
	exec1(t, dsn, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		aggregate_type text NOT NULL, aggregate_id text, event_type text NOT NULL, payload jsonb)`)
	cfgPath := writeConfig(t, yamlFor(t, dsn, "verifyusage", ""))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", cfgPath}, "--since is required"},
		{[]string{"--config", cfgPath, "--since", "yesterday"}, "RFC 3339"},
		{[]string{"--config", cfgPath, "--since", "2025-01-02T00:00:00Z", "--until", "2025-01-01T00:00:00Z"}, "--until must be after --since"},
		{[]string{"--config", cfgPath, "--since", "2025-01-01T00:00:00Z"}, "has no created_at column"},
		{[]string{"--config", cfgPath, "--since", "2025-01-01T00:00:00Z"}, "set snapshot.order_by"},
	} {
		code, out := runBinary(t, time.Minute, nil, append([]string{"verify"}, tc.args...)...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("verify %v: exit %d, want 2 saying %q:\n%s", tc.args, code, tc.want, out)
		}
	}
}

// TestVerifyBench measures verify and verify --repair on 1,000,000 rows
// (OUTBOX_CDC_VERIFY_BENCH=1; OUTBOX_CDC_VERIFY_BENCH_ROWS to change the
// count): a verify that finds every row missing (the table reads alone), the
// repair that publishes them all, and a verify that finds them all.
func TestVerifyBench(t *testing.T) {
	if os.Getenv("OUTBOX_CDC_VERIFY_BENCH") != "1" {
		t.Skip("set OUTBOX_CDC_VERIFY_BENCH=1 to measure verify on a million rows")
	}
	n := 1_000_000
	if s := os.Getenv("OUTBOX_CDC_VERIFY_BENCH_ROWS"); s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			t.Fatalf("OUTBOX_CDC_VERIFY_BENCH_ROWS: %v", err)
		}
	}
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	exec1(t, dsn, "CREATE INDEX ON outbox (created_at)")
	start := time.Now()
	// One transaction, 1000 aggregates; created_at rises with g, in the
	// last hours (records with older timestamps would meet the broker's
	// time retention).
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT 'vbench', 'k' || (g % 1000), 'E', jsonb_build_object('seq', g), now() - interval '2 hours' + g * interval '1 ms'
		FROM generate_series(1, $1::int) g`, n)
	exec1(t, dsn, "VACUUM ANALYZE outbox")
	t.Logf("inserted %d rows in %.1fs", n, time.Since(start).Seconds())
	cfgPath := writeConfig(t, yamlFor(t, dsn, "vbench", ""))
	since := time.Now().Add(-3 * time.Hour).UTC().Format(time.RFC3339)

	report := func(what string, code, want int, v verifyJSON, out string) {
		t.Helper()
		if code != want {
			t.Fatalf("%s: exit %d, want %d:\n%s", what, code, want, out)
		}
		t.Logf("%s: %d rows, %d records, %d missing in %.1fs: %.0f rows/s", what, v.Rows, v.RecordsRead, v.Missing.Count,
			v.Seconds, float64(v.Rows)/v.Seconds)
	}
	code, v, out := runVerifyJSON(t, 20*time.Minute, "--config", cfgPath, "--since", since)
	report("verify, nothing in Kafka", code, 1, v, out)
	code, v, out = runVerifyJSON(t, 30*time.Minute, "--config", cfgPath, "--since", since, "--repair")
	report("verify --repair, every row", code, 0, v, out)
	if v.Repair == nil || v.Repair.Published != int64(n) {
		t.Fatalf("repair %+v, want %d published", v.Repair, n)
	}
	code, v, out = runVerifyJSON(t, 20*time.Minute, "--config", cfgPath, "--since", since)
	report("verify, every row in Kafka", code, 0, v, out)
	if v.Found != int64(n) || v.OutOfOrder.Count != 0 || v.Duplicated.Count != 0 {
		t.Fatalf("after the repair: %+v", v)
	}
}
