package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Restores whose WAL passed, again, the position the connector knew before
// the connector looked: the WAL end no longer tells a restored server from
// the one it replaced, and resuming at (or after) that position has
// PostgreSQL skip every transaction the restored server committed below it.

const (
	histPad   = 2000 // padding bytes per row (jsonb compresses it: a row is about 260 bytes of WAL)
	histBatch = 50   // rows per transaction when writing past a position
	histFrom  = 5000 // first seq written to the restored server
)

// coldCopy stops the server, copies its data directory (a file-level
// backup) and starts it again; it returns the copy.
func coldCopy(ctx context.Context, t *testing.T, pg *testenv.Postgres) string {
	t.Helper()
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	backup, err := pg.CopyData(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	return backup
}

// skipWithoutMarks skips on PostgreSQL 13, whose pgoutput sends no logical
// messages: a position there is checked against the WAL end only, the
// limit docs/operations.md ("Restores") states.
func skipWithoutMarks(t *testing.T) {
	t.Helper()
	if major := queryInt(t, pgConnect(t, pgServer.DSN("postgres")), "SELECT current_setting('server_version_num')::int / 10000"); major < 14 {
		t.Skipf("PostgreSQL %d decodes no history marks", major)
	}
}

// histReader reads an outbox topic from its start (read_committed) and
// counts the copies of each seq seen so far.
type histReader struct {
	cl     *kgo.Client
	copies map[int]int
}

func newHistReader(t *testing.T, topic string) *histReader {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxBytes(64<<20), kgo.MetadataMinAge(500*time.Millisecond))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	t.Cleanup(cl.Close)
	return &histReader{cl: cl, copies: map[int]int{}}
}

func (r *histReader) poll(ctx context.Context, d time.Duration) {
	pctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	r.cl.PollFetches(pctx).EachRecord(func(rec *kgo.Record) {
		var ev struct{ Seq *int }
		if json.Unmarshal(rec.Value, &ev) == nil && ev.Seq != nil {
			r.copies[*ev.Seq]++
		}
	})
}

// missing lists the seqs in [from, from+n) not seen yet.
func (r *histReader) missing(from, n int) []int {
	var m []int
	for seq := from; seq < from+n; seq++ {
		if r.copies[seq] == 0 {
			m = append(m, seq)
		}
	}
	return m
}

// duplicated counts the seqs in [from, from+n) seen more than once.
func (r *histReader) duplicated(from, n int) int {
	d := 0
	for seq := from; seq < from+n; seq++ {
		if r.copies[seq] > 1 {
			d++
		}
	}
	return d
}

func (r *histReader) waitAll(ctx context.Context, t *testing.T, from, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(r.missing(from, n)) > 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%d of seqs %d-%d not in Kafka after %v", len(r.missing(from, n)), from, from+n-1, timeout)
		}
		r.poll(ctx, 500*time.Millisecond)
	}
}

// walEnd is the server's current WAL position.
func walEnd(t *testing.T, dsn string) lsn.LSN {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	return currentLSN(t, conn)
}

// writePast commits padded rows with seqs from from on, histBatch rows a
// transaction, until the server's WAL is 256 kB past target; it returns
// how many. Small transactions matter: logical decoding skips only the
// transactions that commit before the start position.
func writePast(ctx context.Context, t *testing.T, s *restoredServer, from int, target lsn.LSN) int {
	t.Helper()
	conn := pgConnect(t, s.dsn)
	n := 0
	for currentLSN(t, conn) < target+256<<10 {
		if n >= 20000 {
			t.Fatalf("%d rows written and the WAL is still before %v", n, target+256<<10)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT $1, 'k' || (i % 4), 'E', jsonb_build_object('seq', i, 'pad', repeat('x', $4))
			FROM generate_series($2::int, $2::int + $3::int - 1) i`, s.agg, from+n, histBatch, histPad); err != nil {
			t.Fatalf("write rows from %d: %v", from+n, err)
		}
		n += histBatch
	}
	return n
}

// histSupervisor runs the connector binary as systemd or Kubernetes would:
// a run that exits is started again with the same configuration. It keeps
// every run, for the output logged when the test fails.
type histSupervisor struct {
	t       *testing.T
	cfgPath string
	runs    []*process
}

func (sv *histSupervisor) start(ready bool) *process {
	sv.t.Helper()
	addr := freeAddr(sv.t)
	p := startProc(sv.t, sv.cfgPath, addr, ready, "OUTBOX_CDC_HTTP_LISTEN="+addr)
	sv.runs = append(sv.runs, p)
	return p
}

func (sv *histSupervisor) logOnFailure() {
	if !sv.t.Failed() {
		return
	}
	for i, p := range sv.runs {
		sv.t.Logf("connector run %d (exit: %v):\n%s", i+1, p.proc.Err(), p.output())
	}
}

// logged reports whether some run's output contains s.
func (sv *histSupervisor) logged(s string) bool {
	for _, p := range sv.runs {
		if strings.Contains(p.output(), s) {
			return true
		}
	}
	return false
}

// histOutcome is what watch saw: whether every row arrived, and how the
// runs it started (or was given) ended.
type histOutcome struct {
	delivered bool
	starts    int
	refused   int      // runs that exited 1 naming the restore or the history
	last      *process // the run that delivered, or the last one
}

// refusedAll: every start, and at least two, was refused.
func (o histOutcome) refusedAll() bool { return !o.delivered && o.starts >= 2 && o.refused == o.starts }

// refusal reports whether an exited run refused to go on because of the
// restore: exit 1 with "restore" or "history" in its output.
func refusal(p *process) bool {
	out := strings.ToLower(p.output())
	return p.proc.ExitCode() == 1 && (strings.Contains(out, "restore") || strings.Contains(out, "history"))
}

// watch waits until every seq in [from, from+n) is in Kafka, starting a
// run if p is nil and again whenever one exits, up to maxStarts runs in all.
// It returns once they all arrived (the last run still running), once the
// last run allowed exited, or after timeout.
func (sv *histSupervisor) watch(ctx context.Context, r *histReader, p *process, from, n, maxStarts int, timeout time.Duration) histOutcome {
	sv.t.Helper()
	if p == nil {
		p = sv.start(false)
	}
	o := histOutcome{starts: 1}
	deadline := time.Now().Add(timeout)
	for {
		r.poll(ctx, 500*time.Millisecond)
		o.last = p
		if len(r.missing(from, n)) == 0 {
			o.delivered = true
			return o
		}
		if p.proc.Exited() {
			if refusal(p) {
				o.refused++
			}
			sv.t.Logf("connector run %d exited (%v) after the restore", len(sv.runs), p.proc.Err())
			if o.starts == maxStarts {
				return o
			}
			p = sv.start(false)
			o.starts++
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return o
		}
	}
}

// requireDelivered fails the test with the rows the restored server wrote
// that never reached Kafka; with them delivered, it reads on a little for
// late copies and stops the run cleanly.
func (sv *histSupervisor) requireDelivered(ctx context.Context, r *histReader, o histOutcome, from, n int) {
	sv.t.Helper()
	if !o.delivered {
		m := r.missing(from, n)
		sv.t.Fatalf("LOST: %d of the %d rows written to the restored server (seqs %d-%d) never reached Kafka "+
			"(missing %d-%d); %d start(s), %d refused naming the restore, last run exited: %v (%v); "+
			"log says \"resuming after the position committed to Kafka\": %v",
			len(m), n, from, from+n-1, m[0], m[len(m)-1], o.starts, o.refused, o.last.proc.Exited(), o.last.proc.Err(),
			sv.logged("resuming after the position committed to Kafka"))
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		r.poll(ctx, 500*time.Millisecond)
	}
	stopClean(sv.t, o.last)
}

// reconnectIn matches the wait the connector logs when its replication
// connection is lost.
var reconnectIn = regexp.MustCompile(`(?m)replication connection lost; reconnecting.* in=([0-9][0-9.]*[a-zµ]+)\s*$`)

// waitLongBackoff returns once p has just logged a reconnect wait of at
// least atLeast among its log lines after the first seen, or after max.
func waitLongBackoff(t *testing.T, p *process, seen int, atLeast, max time.Duration) time.Duration {
	t.Helper()
	for deadline := time.Now().Add(max); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		m := reconnectIn.FindAllStringSubmatch(p.output(), -1)
		if len(m) <= seen {
			continue
		}
		seen = len(m)
		if d, err := time.ParseDuration(m[len(m)-1][1]); err == nil && d >= atLeast {
			return d
		}
	}
	t.Logf("no reconnect wait of %v or more logged within %v; restarting PostgreSQL anyway", atLeast, max)
	return 0
}

// TestHistoryRestoreRunningDefaults guards a restore under a running
// at_least_once connector with the default reconnect backoff (30 s): the
// restored server writes past the position the connector had streamed
// before the connector reconnects, so the WAL-end check passes and the
// resumed stream skips what it committed below that position. Every row
// written after the restore must reach Kafka, across restarts if the
// connector exits on finding the restore.
func TestHistoryRestoreRunningDefaults(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs its own PostgreSQL")
	}
	skipWithoutMarks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := newRestoredServer(ctx, t, "histrun")
	sv := &histSupervisor{t: t, cfgPath: writeConfig(t, yamlFor(t, s.dsn, "histrun", ""))}
	defer sv.logOnFailure()
	p := sv.start(true)
	s.rows(0, 10, 0)
	r := newHistReader(t, topicFor(s.agg))
	r.waitAll(ctx, t, 0, 10, time.Minute)
	backup := coldCopy(ctx, t, s.pg)
	s.rows(10, 2000, histPad)
	r.waitAll(ctx, t, 10, 2000, 2*time.Minute)
	streamed := walEnd(t, s.dsn)
	seen := len(reconnectIn.FindAllString(p.output(), -1))
	if err := s.pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.pg.RestoreData(ctx, backup); err != nil {
		t.Fatal(err)
	}
	wait := waitLongBackoff(t, p, seen, 12*time.Second, time.Minute)
	began := time.Now()
	if err := s.pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	n := writePast(ctx, t, s, histFrom, streamed)
	t.Logf("restored server: %d rows written, WAL past %v, %v after its restart (the connector's reconnect was due in %v)",
		n, streamed, time.Since(began).Round(time.Millisecond), wait)
	o := sv.watch(ctx, r, p, histFrom, n, 4, 2*time.Minute)
	sv.requireDelivered(ctx, r, o, histFrom, n)
}

// restoreWhileStopped runs the connector, takes a file-level copy of the
// stopped server, has the connector publish 2000 padded rows more (512 kB
// of WAL past the copy) and stop, restores the copy, and writes rows into the
// restored server until its WAL passes the position the connector had
// stored; nothing runs then. It returns the topic's reader and how many
// rows, seqs from histFrom, the restored server has.
func restoreWhileStopped(ctx context.Context, t *testing.T, s *restoredServer, sv *histSupervisor) (*histReader, int) {
	t.Helper()
	p := sv.start(true)
	s.rows(0, 10, 0)
	r := newHistReader(t, topicFor(s.agg))
	r.waitAll(ctx, t, 0, 10, time.Minute)
	stopClean(t, p)
	backup := coldCopy(ctx, t, s.pg)
	p = sv.start(true)
	s.rows(10, 2000, histPad)
	r.waitAll(ctx, t, 10, 2000, 2*time.Minute)
	stopClean(t, p)
	stored := walEnd(t, s.dsn)
	if err := s.pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.pg.RestoreData(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if err := s.pg.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	n := writePast(ctx, t, s, histFrom, stored)
	t.Logf("restored server: %d rows written, WAL past %v, the end before the restore", n, stored)
	return r, n
}

// TestHistoryRestoreExactlyOnceRestart guards an exactly_once connector
// started after a restore done while it was stopped, once the restored
// server's WAL passed the position committed to Kafka: trusting that
// position skips every row committed below it. Either every row written to
// the restored server arrives once (read_committed), or every start is
// refused naming the restore, and after the fix the refusal gives (a
// tombstone for the position's key) every row arrives once.
func TestHistoryRestoreExactlyOnceRestart(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs its own PostgreSQL")
	}
	skipWithoutMarks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := newRestoredServer(ctx, t, "histeos")
	sv := &histSupervisor{t: t, cfgPath: eosConfig(t, s.dsn, "histeos", freeAddr(t))}
	defer sv.logOnFailure()
	r, n := restoreWhileStopped(ctx, t, s, sv)
	o := sv.watch(ctx, r, nil, histFrom, n, 3, 90*time.Second)
	if o.refusedAll() {
		t.Logf("all %d starts after the restore were refused; forgetting the committed position with a tombstone", o.starts)
		forgetKafkaPosition(ctx, t, s.dsn, "histeos")
		o = sv.watch(ctx, r, nil, histFrom, n, 2, 90*time.Second)
	}
	sv.requireDelivered(ctx, r, o, histFrom, n)
	if d := r.duplicated(histFrom, n); d > 0 {
		t.Fatalf("read_committed has %d of the %d rows written to the restored server more than once", d, n)
	}
}

// forgetKafkaPosition writes the tombstone an exactly_once refusal names:
// the position's key, system identifier/database/slot, on the positions
// topic (TestExactlyOnceRestoreRefused).
func forgetKafkaPosition(ctx context.Context, t *testing.T, dsn, slot string) {
	t.Helper()
	var sysID string
	if err := pgConnect(t, dsn).QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&sysID); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaServer.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	key := sysID + "/postgres/" + slot
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: positionsFor(slot), Key: []byte(key)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// TestHistoryRestoreFileStoreRestart guards an at_least_once connector
// with checkpoint.store file, started after a restore done while it was
// stopped, once the restored server's WAL passed the checkpoint in the
// file: trusting the file skips every row committed below it. Every row
// written to the restored server must arrive (duplicates allowed), at once
// or after every start was refused naming the restore and the file was
// removed, as the refusal says.
func TestHistoryRestoreFileStoreRestart(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs its own PostgreSQL")
	}
	skipWithoutMarks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := newRestoredServer(ctx, t, "histfile")
	file := filepath.Join(t.TempDir(), "checkpoint.json")
	sv := &histSupervisor{t: t, cfgPath: writeConfig(t, yamlFor(t, s.dsn, "histfile",
		fmt.Sprintf("checkpoint: {store: file, file: %q}\n", file)))}
	defer sv.logOnFailure()
	r, n := restoreWhileStopped(ctx, t, s, sv)
	o := sv.watch(ctx, r, nil, histFrom, n, 3, 90*time.Second)
	if o.refusedAll() {
		t.Logf("all %d starts after the restore were refused; removing the checkpoint file", o.starts)
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		o = sv.watch(ctx, r, nil, histFrom, n, 2, 90*time.Second)
	}
	sv.requireDelivered(ctx, r, o, histFrom, n)
}
