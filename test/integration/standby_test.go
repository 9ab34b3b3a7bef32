package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// standbyAggregate is the aggregate type (and so the topic) of the events
// TestStandbyDecoding writes.
const standbyAggregate = "standbydecode"

// TestStandbyDecoding: the connector streams from a slot on a hot standby
// (PostgreSQL 16+, PG 16 docs "Logical Decoding on Standby") while a writer
// inserts outbox rows on the primary. postgres.primary_dsn names the
// primary, where the heartbeat and the checkpoint table are written. Every
// event arrives, in order per aggregate; the standby's slot advances, also
// while the outbox is quiet; the primary's checkpoint table holds the
// position.
func TestStandbyDecoding(t *testing.T) {
	needPrimaryAndStandby(t, 16, "logical decoding on a standby")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	primary, _, sdsn := startPrimaryAndStandby(ctx, t)
	pdsn := primary.DSN("standby")

	const slot = "standbydecode"
	cfg := testConfig(t, sdsn, "public.outbox", slot)
	cfg.Postgres.PrimaryDSN = config.DSN(pdsn)
	cfg.Postgres.HeartbeatInterval = 300 * time.Millisecond
	started := time.Now()
	c := startConnector(t, cfg)
	ready := time.Since(started)
	if c.logged("heartbeat disabled") {
		t.Errorf("the heartbeat was disabled although postgres.primary_dsn is set")
	}

	// One writer on the primary, one row per transaction, aggregates in turn.
	const events, aggregates = 400, 4
	errs := make(chan error, 1)
	firstAt := make(chan time.Time, 1)
	go func() {
		errs <- writeSequenced(ctx, pdsn, events, aggregates, firstAt)
	}()
	var first time.Time
	select {
	case first = <-firstAt:
	case err := <-errs:
		t.Fatalf("writer committed nothing: %v", err)
	}
	waitFor(t, time.Minute, "the first event published", func() bool { return testutil.ToFloat64(c.m.Published) >= 1 })
	toFirst := time.Since(first)
	if err := <-errs; err != nil {
		t.Fatalf("writer: %v", err)
	}

	recs := consumeN(t, []string{topicFor(standbyAggregate)}, events, 2*time.Minute, 2*time.Second)
	last := map[string]int{}
	seen := map[string]bool{}
	dups := 0
	for _, r := range recs {
		var ev struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Fatalf("payload %q: %v", r.Value, err)
		}
		key := fmt.Sprintf("%s/%d", ev.Agg, ev.Seq)
		if seen[key] {
			dups++
			continue
		}
		seen[key] = true
		if prev, ok := last[ev.Agg]; ok && ev.Seq != prev+1 {
			t.Errorf("aggregate %s: event %d after %d", ev.Agg, ev.Seq, prev)
		}
		last[ev.Agg] = ev.Seq
	}
	lost := events - len(seen)

	// Quiet: no outbox writes; the heartbeat on the primary still moves the
	// standby's slot.
	quietFrom := slotConfirmed(t, sdsn, slot)
	quietStart := time.Now()
	var quietTo lsn.LSN
	waitFor(t, 30*time.Second, "the standby's slot to advance while the outbox is quiet", func() bool {
		quietTo = slotConfirmed(t, sdsn, slot)
		return quietTo > quietFrom
	})
	// Once more: the first move may be the last events' trailing WAL; the
	// heartbeat (every 300 ms) moves it again well within the idle
	// checkpoint interval (10 s).
	quietMid := quietTo
	waitFor(t, 5*time.Second, "the standby's slot to advance again while the outbox is quiet", func() bool {
		quietTo = slotConfirmed(t, sdsn, slot)
		return quietTo > quietMid
	})
	quietAfter := time.Since(quietStart)

	// The checkpoint is written on the primary and replayed by the standby.
	pconn := pgConnect(t, pdsn)
	var saved lsn.LSN
	waitFor(t, 30*time.Second, "the primary's checkpoint table to hold the streamed position", func() bool {
		err := pconn.QueryRow(ctx, "SELECT lsn FROM outbox_cdc.checkpoints WHERE slot = $1", slot).Scan(&saved)
		return err == nil && saved >= quietFrom
	})
	t.Logf("standby: %d events written on the primary, %d records consumed from the standby's slot, %d lost, %d duplicates; "+
		"connector ready %.2fs after start, first event published %.2fs after its commit; while quiet the slot moved %v -> %v -> %v "+
		"(%d bytes) within %.2fs; checkpoint on the primary %v",
		events, len(recs), lost, dups, ready.Seconds(), toFirst.Seconds(), quietFrom, quietMid, quietTo, quietTo-quietFrom,
		quietAfter.Seconds(), saved)
	if lost > 0 {
		t.Errorf("%d events never published", lost)
	}
}

// TestStandbyTableStoreNeedsPrimary: a standby is read-only, so
// checkpoint.store table without postgres.primary_dsn is refused at start
// (exit 1) with the key to set, by run and check alike.
func TestStandbyTableStoreNeedsPrimary(t *testing.T) {
	needPrimaryAndStandby(t, 16, "logical decoding on a standby")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, _, sdsn := startPrimaryAndStandby(ctx, t)
	cfg := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: nostore}\ncheckpoint: {store: table}\nkafka: {brokers: [%s]}\nhttp: {listen: ''}\n",
		sdsn, kafkaServer.Brokers()[0]))
	for _, cmd := range []string{"check", "run"} {
		code, out := runBinary(t, time.Minute, nil, cmd, "--config", cfg)
		if code != 1 || !strings.Contains(out, "postgres.primary_dsn") || !strings.Contains(out, "checkpoint.store: file") {
			t.Errorf("%s: exit %d, want 1 naming postgres.primary_dsn:\n%s", cmd, code, out)
		}
	}
}

// TestStandbyBefore16: below PostgreSQL 16 a standby cannot decode; the
// connector says so (exit 1) instead of failing on the slot.
func TestStandbyBefore16(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs its own primary and standby; the suite's PostgreSQL is external")
	}
	if major := pgServer.Major(); major >= 16 {
		t.Skipf("PostgreSQL %s decodes on a standby; TestStandbyDecoding covers it", pgServer.Version())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, _, sdsn := startPrimaryAndStandby(ctx, t)
	cfg := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: old}\ncheckpoint: {store: none}\nkafka: {brokers: [%s]}\nhttp: {listen: ''}\n",
		sdsn, kafkaServer.Brokers()[0]))
	code, out := runBinary(t, time.Minute, nil, "run", "--config", cfg)
	if code != 1 || !strings.Contains(out, "needs 16 or later") {
		t.Errorf("exit %d, want 1 saying a standby needs 16:\n%s", code, out)
	}
}

// startPrimaryAndStandby starts a primary with an outbox table in database
// "standby" and a hot standby of it (hot_standby_feedback on, a physical
// slot), and returns the standby's DSN of that database.
func startPrimaryAndStandby(ctx context.Context, t *testing.T) (primary, standby *testenv.Postgres, standbyDSN string) {
	t.Helper()
	primary, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatalf("start primary: %v", err)
	}
	t.Cleanup(func() { primary.Close() })
	pdsn, err := primary.CreateDatabase(ctx, "standby")
	if err != nil {
		t.Fatal(err)
	}
	createOutbox(t, pdsn, "outbox", "jsonb")
	standby, err = testenv.StartStandby(ctx, primary, testenv.StandbyOptions{Slot: "standby1",
		Settings: map[string]string{"hot_standby_feedback": "on"}})
	if err != nil {
		t.Fatalf("start standby: %v", err)
	}
	t.Cleanup(func() { standby.Close() })
	return primary, standby, standby.DSN("standby")
}

// writeSequenced inserts n events on dsn, one per transaction, over
// aggregates aggregate ids in turn, each with its sequence number in the
// payload; it sends the time of the first commit on first.
func writeSequenced(ctx context.Context, dsn string, n, aggregates int, first chan<- time.Time) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i := range n {
		agg := fmt.Sprintf("a%d", i%aggregates)
		payload := fmt.Sprintf(`{"agg": %q, "seq": %d}`, agg, i/aggregates)
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, $2, 'written', $3)`, standbyAggregate, agg, payload); err != nil {
			return fmt.Errorf("insert %d: %w", i, err)
		}
		if i == 0 {
			first <- time.Now()
		}
	}
	return nil
}

// needPrimaryAndStandby skips a test that starts its own primary and
// standby when the suite's server is external or older than min.
func needPrimaryAndStandby(t *testing.T, min int, feature string) {
	t.Helper()
	if pgServer.External() {
		t.Skip("needs its own primary and standby; the suite's PostgreSQL is external")
	}
	if major := pgServer.Major(); major < min {
		t.Skipf("%s needs PostgreSQL %d or later; the suite runs %s (set %s to a %d+ bin directory)",
			feature, min, pgServer.Version(), testenv.EnvPGBinDir, min)
	}
}
