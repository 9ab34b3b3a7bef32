package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// restoredServer is a private PostgreSQL with an outbox, and the rows the
// test writes into it: rows(from, n, pad) inserts n events of aggregate type
// agg with seq from, from+1, … and pad bytes of padding.
type restoredServer struct {
	pg   *testenv.Postgres
	dsn  string
	agg  string
	rows func(from, n, pad int)
}

func newRestoredServer(ctx context.Context, t *testing.T, agg string) *restoredServer {
	t.Helper()
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	s := &restoredServer{pg: pg, dsn: pg.DSN("postgres"), agg: fmt.Sprintf("%s%d", agg, dbCounter.Add(1))}
	createOutbox(t, s.dsn, "outbox", "jsonb")
	s.rows = func(from, n, pad int) {
		exec1(t, s.dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT $1, 'k' || (i % 4), 'E', jsonb_build_object('seq', i, 'pad', repeat('x', $4))
			FROM generate_series($2::int, $2::int + $3::int - 1) i`, s.agg, from, n, pad)
	}
	return s
}

// seqsFrom counts the distinct seqs at or above from among records' values.
func seqsFrom(t *testing.T, values [][]byte, from int) int {
	t.Helper()
	seen := map[int]bool{}
	for _, v := range values {
		var ev struct{ Seq int }
		if err := json.Unmarshal(v, &ev); err == nil && ev.Seq >= from {
			seen[ev.Seq] = true
		}
	}
	return len(seen)
}

// TestRestoreUnderRunningConnector: PostgreSQL is restored from a
// file-level copy while the connector runs. When it reconnects, the
// server's WAL ends before what it had streamed: resuming would have
// PostgreSQL skip every transaction the restored server commits below that
// position. The connector exits 1 saying so; restarted, it streams from
// the restored slot and checkpoint, and the rows written after the restore
// arrive.
func TestRestoreUnderRunningConnector(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs its own PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := newRestoredServer(ctx, t, "restorerun")
	yaml := strings.Replace(yamlFor(t, s.dsn, "restorerun", ""), "publication: restorerun}", "publication: restorerun, reconnect_backoff_max: 500ms}", 1)
	cfgPath := writeConfig(t, yaml)
	p := runProc(t, cfgPath)
	s.rows(0, 10, 0)
	consumeN(t, []string{topicFor(s.agg)}, 10, time.Minute, 0)
	backup := coldCopy(ctx, t, s.pg)
	s.rows(10, 2000, 2000) // about 4 MB of WAL past the copy
	consumeN(t, []string{topicFor(s.agg)}, 2010, 2*time.Minute, 0)
	if err := s.pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.pg.RestoreData(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if err := s.pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	s.rows(5000, 50, 0) // what the restored server commits
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("the connector still runs a minute after the restore (it resumed past the restored WAL):\n%s", p.output())
	}
	if out := p.output(); p.err == nil || !strings.Contains(out, "restored from an older copy") {
		t.Fatalf("exit %v, want exit 1 saying the server was restored:\n%s", p.err, out)
	}
	first := p.output()
	p = runProc(t, cfgPath)
	defer func() {
		if t.Failed() {
			t.Logf("first run:\n%s\nafter the restart:\n%s", first, p.output())
		}
	}()
	waitFor(t, 2*time.Minute, "the 50 rows written after the restore", func() bool {
		var vals [][]byte
		for _, r := range consumeN(t, []string{topicFor(s.agg)}, 0, 0, time.Second) {
			vals = append(vals, r.Value)
		}
		return seqsFrom(t, vals, 5000) == 50
	})
	stopClean(t, p)
}
