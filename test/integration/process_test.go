package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

// process is the real connector binary running in the background
// (cdctest.Process); done, err and cmd mirror it for the tests that read
// them.
type process struct {
	proc *cdctest.Process
	cmd  *exec.Cmd
	log  string
	addr string
	done chan struct{}
	err  error // set before done is closed
}

func startProcess(t *testing.T, configPath, addr string) *process {
	t.Helper()
	return startProc(t, configPath, addr, true)
}

// startProc starts the binary with extra environment entries; with
// waitReady it returns once /readyz answers 200.
func startProc(t *testing.T, configPath, addr string, waitReady bool, env ...string) *process {
	t.Helper()
	pr, err := cdctest.Start(cdctest.Command(connectorBinary(t), env, "run", "--config", configPath),
		cdctest.Options{Name: "connector", Log: filepath.Join(t.TempDir(), "connector.log")})
	if err != nil {
		t.Fatal(err)
	}
	p := &process{proc: pr, cmd: pr.Cmd, log: pr.LogPath, addr: addr, done: make(chan struct{})}
	go func() {
		<-pr.Done()
		p.err = pr.Err()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	if !waitReady {
		return p
	}
	if err := pr.WaitOK(context.Background(), addr, "/readyz", time.Minute); err != nil {
		if errors.Is(err, cdctest.ErrExited) {
			t.Fatalf("connector exited at start: %v\n%s", pr.Err(), p.output())
		}
		t.Fatalf("timed out after %v waiting for connector /readyz: %v", time.Minute, err)
	}
	return p
}

func (p *process) kill() {
	_ = p.proc.Kill()
	<-p.done
}

// stopClean sends SIGTERM and expects exit 0.
func stopClean(t *testing.T, p *process) {
	t.Helper()
	err := p.proc.Stop(time.Minute)
	switch {
	case errors.Is(err, cdctest.ErrStillRunning):
		t.Fatal("connector did not exit within 1m of SIGTERM")
	case errors.Is(err, cdctest.ErrExited):
		t.Fatalf("%v\n%s", err, p.output())
	case err != nil:
		t.Errorf("%v\n%s", err, p.output())
	}
	<-p.done
}

func (p *process) output() string { return p.proc.Output() }

// waitMetric waits until the process's unlabelled metric name is at least
// min; it fails the test at once if the process exits meanwhile.
func (p *process) waitMetric(t *testing.T, timeout time.Duration, name string, min float64) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%s >= %v", name, min), func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited while waiting for %s >= %v: %v\n%s", name, min, p.proc.Err(), p.output())
		}
		v, err := metricValue(p.addr, name)
		return err == nil && v >= min
	})
}

// scrape reads one metric from the connector's /metrics (cdctest.Metrics.Value).
func scrape(t *testing.T, addr, name string) float64 {
	t.Helper()
	v, err := metricValue(addr, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// metricValue reads one metric from the connector's /metrics: the sum of
// its series (cdctest.Metrics.Value).
func metricValue(addr, name string) (float64, error) {
	return cdctest.Metric(context.Background(), addr, name)
}

// peakRSS is the process's resident set high-water mark (VmHWM).
func peakRSS(t *testing.T, p *process) int64 {
	t.Helper()
	hwm, _, err := p.proc.Memory()
	if err != nil {
		t.Fatalf("read status: %v", err)
	}
	return hwm
}

// TestKill9LosesNothing writes events from several writers while the real
// binary is killed with SIGKILL and restarted; every committed event must be
// in Kafka afterwards, and per aggregate the order holds but for replays.
func TestKill9LosesNothing(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "kill9")
	cfgPath := writeConfig(t, fmt.Sprintf(`
postgres:
  dsn: %s
  slot: kill9
  publication: kill9
  status_interval: 100ms
  reconnect_backoff_max: 1s
outbox:
  table: public.outbox
kafka:
  brokers: [%s]
  dlq_topic: %s
  topic: %q
http:
  listen: %s
`, dsn, strings.Join(kafkaServer.Brokers(), ", "), dlqFor("kill9"), topicTemplate, addr))

	p := startProcess(t, cfgPath, addr)

	// Each writer writes at least perWriter events and goes on until the
	// kills are over, so every kill lands while the writers run. The kills
	// come at points of the writers' progress, not after fixed sleeps.
	const writers, perWriter = 4, 250
	var (
		wg        sync.WaitGroup
		written   atomic.Int64
		last      [writers]int // last seq committed per writer, read after wg.Wait
		killsDone = make(chan struct{})
	)
	errs := make(chan error, writers)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for w := 0; w < writers; w++ {
		wg.Go(func() {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			for i := 1; ; i++ {
				if i > perWriter {
					select {
					case <-killsDone:
						return
					default:
					}
				}
				_, err := conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('kill', $1, 'E', jsonb_build_object('seq', $2::int))`, fmt.Sprintf("w%d", w), i)
				if err != nil {
					errs <- err
					return
				}
				last[w] = i
				written.Add(1)
				time.Sleep(2 * time.Millisecond) // pacing: a steady stream of small transactions
			}
		})
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()
	// Kill the connector three times while the writers run, after every
	// quarter of the minimum they write.
	for k := 1; k <= 3; k++ {
		at := int64(k * writers * perWriter / 4)
		waitFor(t, 2*time.Minute, fmt.Sprintf("%d events written before kill %d", at, k), func() bool {
			select {
			case <-writersDone: // all failed: the errors are reported below
				return true
			default:
			}
			return written.Load() >= at
		})
		p.kill()
		p = startProcess(t, cfgPath, addr)
	}
	close(killsDone)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}

	want := int(written.Load())
	recs := consumeN(t, []string{topicFor("kill")}, want, 2*time.Minute, 2*time.Second)
	type ev struct {
		key string
		seq int
	}
	seen := map[ev]int{}
	for _, r := range recs {
		var v struct{ Seq int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("value %s: %v", r.Value, err)
		}
		seen[ev{string(r.Key), v.Seq}]++
	}
	for w := 0; w < writers; w++ {
		for i := 1; i <= last[w]; i++ {
			if seen[ev{fmt.Sprintf("w%d", w), i}] == 0 {
				t.Errorf("event w%d/%d lost", w, i)
			}
		}
	}
	t.Logf("%d events written, %d records consumed, %d duplicates over 3 kills", want, len(recs), len(recs)-len(seen))

	// Per key, a sequence only goes back when a replayed tail starts, and a
	// replay restarts at an event already seen.
	for _, rs := range byPartition(recs) {
		last := map[string]int{}
		for _, r := range rs {
			var v struct{ Seq int }
			_ = json.Unmarshal(r.Value, &v)
			k := string(r.Key)
			if prev, ok := last[k]; ok && v.Seq != prev+1 && v.Seq > prev {
				t.Errorf("key %s: seq %d after %d (gap)", k, v.Seq, prev)
			}
			last[k] = v.Seq
		}
	}

	// A clean stop: SIGTERM drains, confirms, exits 0.
	stopClean(t, p)
}

// TestMetricsEndpoint checks that the contract's metrics are exported.
func TestMetricsEndpoint(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	addr := freeAddr(t)
	dropSlotAtEnd(t, dsn, "metrics")
	cfgPath := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: metrics, publication: metrics}\nkafka: {brokers: [%s], topic: %q}\nhttp: {listen: %q}\n",
		dsn, kafkaServer.Brokers()[0], topicTemplate, addr))
	startProcess(t, cfgPath, addr)
	exec1(t, dsn, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('metrics', 'a', 'E', '{}')`)
	consumeN(t, []string{topicFor("metrics")}, 1, time.Minute, 0)
	var body string
	waitFor(t, 30*time.Second, "published counter", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return strings.Contains(body, `outbox_cdc_events_published_total{table="public.outbox"} 1`)
	})
	for _, name := range []string{"outbox_cdc_events_published_total", "outbox_cdc_events_dead_lettered_total",
		"outbox_cdc_confirmed_lsn", "outbox_cdc_replication_lag_bytes", "outbox_cdc_inflight_events",
		"outbox_cdc_commit_to_ack_seconds_bucket", "outbox_cdc_connected 1"} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestBadConfigExitsTwo checks exit code 2 and a message naming the key.
func TestBadConfigExitsTwo(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"typo", "postgres: {dns: x}\nkafka: {brokers: [127.0.0.1:9092]}\n", []string{"postgres.dns", "postgres.dsn"}},
		{"missing brokers", "postgres: {dsn: 'postgres://u@h/db'}\n", []string{"kafka.brokers", "OUTBOX_CDC_KAFKA_BROKERS"}},
		{"bad template", "postgres: {dsn: 'postgres://u@h/db'}\nkafka: {brokers: [h:1], topic: 'x.{event}'}\n", []string{"kafka.topic"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runBinary(t, 30*time.Second, nil, "run", "--config", writeConfig(t, tt.yaml))
			if code != 2 {
				t.Fatalf("exit code %d, want 2\n%s", code, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not mention %q:\n%s", w, out)
				}
			}
		})
	}
	// The password must not appear in the message.
	code, out := runBinary(t, 30*time.Second, []string{"OUTBOX_CDC_POSTGRES_DSN=postgres://u:s3cretpw@h/db"},
		"run", "--config", writeConfig(t, "kafka: {brokers: [bad]}\n"))
	if code != 2 || strings.Contains(out, "s3cretpw") {
		t.Fatalf("exit %d, output leaks password or wrong code:\n%s", code, out)
	}
}

// TestMissingPrerequisitesExitOne checks wal_level=replica and a role that
// cannot create the publication: exit 1, saying what to change.
func TestMissingPrerequisitesExitOne(t *testing.T) {
	if pgServer.External() {
		t.Skip("needs its own PostgreSQL cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("wal_level replica", func(t *testing.T) {
		pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Settings: map[string]string{"wal_level": "replica"}})
		if err != nil {
			t.Fatalf("start postgres: %v", err)
		}
		defer pg.Close()
		dsn := pg.DSN("postgres")
		createOutbox(t, dsn, "outbox", "jsonb")
		cfg := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q}\nkafka: {brokers: [%s]}\nhttp: {listen: ''}\n", dsn, kafkaServer.Brokers()[0]))
		for _, cmd := range []string{"check", "run"} {
			code, out := runBinary(t, time.Minute, nil, cmd, "--config", cfg)
			if code != 1 || !strings.Contains(out, "wal_level") || !strings.Contains(out, "wal_level = logical") {
				t.Errorf("%s: exit %d, want 1 with the wal_level fix:\n%s", cmd, code, out)
			}
		}
	})

	t.Run("no privilege to create the publication", func(t *testing.T) {
		dsn := newDatabase(t)
		createOutbox(t, dsn, "outbox", "jsonb")
		exec1(t, dsn, "DO $$ BEGIN CREATE ROLE cdc_app LOGIN REPLICATION; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
		exec1(t, dsn, "GRANT SELECT ON outbox TO cdc_app")
		appDSN := strings.Replace(dsn, "postgres@", "cdc_app@", 1)
		cfg := writeConfig(t, fmt.Sprintf("postgres: {dsn: %q, slot: noprivs, publication: noprivs}\nkafka: {brokers: [%s]}\nhttp: {listen: ''}\n",
			appDSN, kafkaServer.Brokers()[0]))
		code, out := runBinary(t, time.Minute, nil, "run", "--config", cfg)
		if code != 1 || !strings.Contains(out, "CREATE PUBLICATION") {
			t.Errorf("exit %d, want 1 with the statement for the table owner:\n%s", code, out)
		}
		exec1(t, dsn, "REVOKE SELECT ON outbox FROM cdc_app")
		code, out = runBinary(t, time.Minute, nil, "check", "--config", cfg)
		if code != 1 || !strings.Contains(out, "GRANT SELECT") {
			t.Errorf("check: exit %d, want 1 with the GRANT to run:\n%s", code, out)
		}
	})
}
