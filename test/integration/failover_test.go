package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// TestFailover: a connector on a failover slot follows a promoted standby.
// Writers insert outbox rows without pause, the primary is killed (-9) and
// the standby promoted; the connector, whose DSN lists both servers with
// target_session_attrs=read-write, reconnects on its own and streams from
// the slot the standby synchronized. Every row the new primary holds
// reaches Kafka (none lost, none that it lacks), duplicates are counted,
// and a restart on the new primary trusts the checkpoint.
func TestFailover(t *testing.T) {
	needPrimaryAndStandby(t, 17, "failover slots")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatalf("start primary: %v", err)
	}
	t.Cleanup(func() { primary.Close() }) // cleanups run last-in first-out: after the connector stopped
	pdsn, err := primary.CreateDatabase(ctx, "failover")
	if err != nil {
		t.Fatal(err)
	}
	createOutbox(t, pdsn, "outbox", "jsonb")
	standby, err := testenv.StartStandby(ctx, primary, testenv.StandbyOptions{Slot: "standby1"})
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { standby.Close() })
	// Synchronous replication: a commit the writer saw succeed is on the
	// standby, so it survives the failover and must reach Kafka.
	exec1(t, primary.DSN("postgres"), "ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
	exec1(t, primary.DSN("postgres"), "SELECT pg_reload_conf()")

	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/failover?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	const slot = "failover"
	cfg := testConfig(t, dsn, "public.outbox", slot)
	cfg.Postgres.FailoverSlot = "on"
	fast := func(pc *pipeline.Config) { pc.MonitorInterval = 200 * time.Millisecond }
	c := startConnector(t, cfg, fast)
	waitFor(t, 30*time.Second, "outbox_cdc_slot_failover_ready 1", func() bool {
		return testutil.ToFloat64(c.m.SlotFailoverReady) == 1
	})
	if !c.logged("failover slot ready") {
		t.Errorf("the connector did not log that the slot is ready for failover")
	}

	w := startWriters(ctx, dsn, 4)
	sconn := pgConnect(t, standby.DSN("failover"))
	waitFor(t, time.Minute, "the standby to synchronize the slot", func() bool {
		var ok bool
		err := sconn.QueryRow(ctx, `SELECT synced AND NOT temporary AND confirmed_flush_lsn IS NOT NULL
			FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&ok)
		return err == nil && ok
	})
	waitFor(t, time.Minute, "events written and published before the failover", func() bool {
		return w.committed() >= 200 && testutil.ToFloat64(c.m.Published) >= 100
	})
	sconn.Close(ctx)

	killed := time.Now()
	if err := primary.Crash(); err != nil {
		t.Fatalf("kill primary: %v", err)
	}
	waitFor(t, 30*time.Second, "the connector to notice the loss", func() bool { return !c.p.Streaming() })
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("promote: %v", err)
	}
	promoted := time.Now()
	waitFor(t, 2*time.Minute, "the connector to stream from the new primary", c.p.Streaming)
	followed := time.Now()
	before := w.committed()
	waitFor(t, time.Minute, "writes on the new primary", func() bool { return w.committed() >= before+200 })
	acked, uncertain, werrs := w.stop()

	// What the new primary holds is what was committed: every row of it
	// must be published, and nothing else.
	nconn := pgConnect(t, standby.DSN("failover"))
	rows, err := nconn.Query(ctx, "SELECT id::text FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	held := make(map[string]bool, len(ids))
	for _, id := range ids {
		held[id] = true
	}
	for _, id := range acked {
		if !held[id] {
			t.Errorf("row %s was committed on the old primary but is missing on the promoted standby (synchronous replication broken?)", id)
		}
	}
	recs := consumeN(t, []string{topicFor("failover")}, len(held), 2*time.Minute, 3*time.Second)
	seen := map[string]int{}
	for _, r := range recs {
		id, _ := header(r, "id")
		seen[id]++
	}
	var lost, foreign []string
	for id := range held {
		if seen[id] == 0 {
			lost = append(lost, id)
		}
	}
	for id := range seen {
		if !held[id] {
			foreign = append(foreign, id)
		}
	}
	dups := len(recs) - len(seen)
	t.Logf("failover: %d events committed (%d acknowledged to writers, %d commits interrupted by the kill, %d write errors), "+
		"%d records consumed, %d lost, %d duplicates, %d published that the new primary lacks; "+
		"stream back %.2fs after the kill, %.2fs after the promotion (promotion took %.2fs)",
		len(held), len(acked), uncertain, werrs, len(recs), len(lost), dups, len(foreign),
		followed.Sub(killed).Seconds(), followed.Sub(promoted).Seconds(), promoted.Sub(killed).Seconds())
	if len(lost) > 0 {
		t.Errorf("%d committed events never published, e.g. %v", len(lost), lost[:min(5, len(lost))])
	}
	if len(foreign) > 0 {
		t.Errorf("%d events published that the new primary does not hold (sent before the standby had them), e.g. %v",
			len(foreign), foreign[:min(5, len(foreign))])
	}

	// A restart on the new primary (another timeline) trusts the checkpoint
	// the connector saved after following it.
	c.stop(t)
	c2 := startConnector(t, cfg, fast)
	if c2.logged("ignoring the checkpoint") {
		t.Errorf("the restart after the failover ignored the checkpoint")
	}
}

// writers insert one outbox row per transaction on as many connections,
// reconnecting after errors, until stopped.
type writers struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	acked     []string // committed: the COMMIT succeeded
	uncertain int      // the connection broke before the COMMIT's answer
	errs      int
}

func startWriters(ctx context.Context, dsn string, n int) *writers {
	ctx, cancel := context.WithCancel(ctx)
	w := &writers{cancel: cancel}
	for i := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.run(ctx, dsn, i)
		}()
	}
	return w
}

func (w *writers) run(ctx context.Context, dsn string, n int) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := pgx.Connect(cctx, dsn)
			cancel()
			if err != nil {
				w.count(&w.errs)
				time.Sleep(50 * time.Millisecond) // pacing: the primary is down until the standby is promoted
				continue
			}
			conn = c
		}
		id := newUUID()
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := conn.Exec(ictx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, 'failover', $2, 'written', '{}')`, id, fmt.Sprintf("w%d", n))
		cancel()
		switch {
		case err == nil:
			w.mu.Lock()
			w.acked = append(w.acked, id)
			w.mu.Unlock()
		case ctx.Err() != nil:
			return // stopped: an insert cut short counts for nothing
		default:
			w.count(&w.uncertain)
			conn.Close(context.Background())
			conn = nil
		}
	}
}

func (w *writers) count(n *int) {
	w.mu.Lock()
	*n++
	w.mu.Unlock()
}

func (w *writers) committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// stop ends the writers and returns the committed ids, the inserts whose
// outcome is unknown and the failed connection attempts.
func (w *writers) stop() (acked []string, uncertain, errs int) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked, w.uncertain, w.errs
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// TestFailoverSlotOnBefore17: postgres.failover_slot on (here from the
// environment) is refused (exit 1)
// on a server without failover slots, with the prerequisite and its fix.
func TestFailoverSlotOnBefore17(t *testing.T) {
	if major := pgServer.Major(); major >= 17 {
		t.Skipf("PostgreSQL %s has failover slots; TestFailover covers it", pgServer.Version())
	}
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	code, out := runBinary(t, time.Minute, []string{"OUTBOX_CDC_POSTGRES_FAILOVER_SLOT=on"}, "run", "--config",
		writeConfig(t, yamlFor(t, dsn, "failover_on", "")))
	if code != 1 || !strings.Contains(out, "failover slots need PostgreSQL 17") || !strings.Contains(out, "postgres.failover_slot: auto") {
		t.Fatalf("failover_slot on with PostgreSQL %s: exit %d, want 1 with the version prerequisite:\n%s", pgServer.Version(), code, out)
	}
}
