package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/bench/relay"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv/cdctest"
)

const (
	database    = "bench"
	outboxTable = "public.outbox"
	pollTable   = "public.outbox_polling"
	publication = "outbox_cdc"
	dlqTopic    = "bench.dlq"
)

// pgSettings are added to the harness defaults (wal_level=logical,
// fsync=off, full_page_writes=off). A larger max_wal_size keeps the preload
// from checkpointing every few seconds.
var pgSettings = map[string]string{
	"max_wal_size":       "8GB",
	"checkpoint_timeout": "30min",
}

// env is the servers and the shared state of one benchmark run.
type env struct {
	log     *slog.Logger
	pg      *testenv.Postgres
	kafka   *testenv.Kafka
	dsn     string
	brokers []string
	kcl     *kgo.Client
	adm     *kadm.Client
	conn    *pgx.Conn // setup and bookkeeping statements only

	workDir      string
	connectorBin string
	minimalBin   string // "" when the minimal connector does not run
	pgPID        int    // postmaster
	kafkaPID     int    // broker JVM; 0 when external
	partitions   int
	background   float64       // busy cores before the servers started
	quietBudget  time.Duration // left to spend waiting for a quiet machine
	// debeziumLibs is the Debezium/Connect classpath directory; empty when
	// Debezium does not run, debeziumSkipped then says why (if asked for).
	debeziumLibs    string
	debeziumSkipped string
}

func startEnv(ctx context.Context, opts options, log *slog.Logger) (_ *env, err error) {
	e := &env{log: log, partitions: opts.Partitions, quietBudget: opts.QuietBudget}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.workDir, err = os.MkdirTemp("", "outbox-bench-"); err != nil {
		return nil, err
	}
	if e.connectorBin, err = connectorBinary(ctx, opts, e.workDir, log); err != nil {
		return nil, err
	}
	if opts.Minimal || opts.has("capacity") {
		if e.minimalBin, err = minimalBinary(ctx, opts, e.workDir, log); err != nil {
			return nil, err
		}
	}
	if opts.Debezium {
		if e.debeziumLibs, err = debeziumLibs(ctx); err != nil {
			e.debeziumSkipped = err.Error()
			log.Warn("DEBEZIUM SKIPPED: its jars cannot be fetched; the report says so", "err", err)
			err = nil
		}
	}
	// What the machine does without us: other users' load skews every
	// number, so it is measured and reported.
	b0, _, t0 := machineTicks()
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return nil, err
	}
	b1, _, t1 := machineTicks()
	if t1 > t0 {
		e.background = float64(b1-b0) / float64(t1-t0) * float64(runtime.NumCPU())
	}
	if e.background > 0.25 {
		log.Warn("the machine is busy before the benchmark starts; results will be skewed", "busy_cores", round(e.background, 2))
	}

	log.Info("starting PostgreSQL and Kafka")
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if e.pg, err = testenv.StartPostgres(sctx, testenv.PostgresOptions{Settings: pgSettings}); err != nil {
		return nil, err
	}
	if e.pg.External() {
		return nil, errors.New("the benchmark needs its own PostgreSQL (CPU is read from /proc): unset " + testenv.EnvPGDSN)
	}
	// A deleted topic's files go at once instead of a minute later (Kafka's
	// default file.delete.delay.ms), so the drains' 1,000,000-record topics
	// are not deleted during the first steady run: before each run the
	// benchmark waits for a quiet machine, which this wait can see.
	if e.kafka, err = testenv.StartKafka(sctx, testenv.KafkaOptions{Properties: map[string]string{"file.delete.delay.ms": "0"}}); err != nil {
		return nil, err
	}
	e.brokers = e.kafka.Brokers()
	if e.dsn, err = e.pg.CreateDatabase(sctx, database); err != nil {
		return nil, err
	}
	if e.conn, err = pgx.Connect(sctx, e.dsn); err != nil {
		return nil, fmt.Errorf("connect %s: %w", database, err)
	}
	if e.kcl, err = kgo.NewClient(kgo.SeedBrokers(e.brokers...)); err != nil {
		return nil, err
	}
	e.adm = kadm.NewClient(e.kcl)
	if err := e.createSchema(sctx); err != nil {
		return nil, err
	}
	if err := e.createTopics(sctx, dlqTopic); err != nil {
		return nil, err
	}
	if e.pgPID, err = postmasterPID(e.pg.DataDir()); err != nil {
		return nil, err
	}
	if !e.kafka.External() {
		e.kafkaPID = findProcess(filepath.Join(filepath.Dir(e.kafka.LogDir()), "server.properties"))
	}
	log.Info("servers up", "postgres", e.pg.Version(), "kafka", e.kafka.Version(), "postmaster", e.pgPID, "kafka_pid", e.kafkaPID)
	return e, nil
}

func (e *env) close() {
	if e.kcl != nil {
		e.kcl.Close()
	}
	if e.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		e.conn.Close(ctx)
		cancel()
	}
	if e.kafka != nil {
		if err := e.kafka.Close(); err != nil {
			e.log.Warn("stop kafka", "err", err)
		}
	}
	if e.pg != nil {
		if err := e.pg.Close(); err != nil {
			e.log.Warn("stop postgres", "err", err)
		}
	}
	if e.workDir != "" {
		_ = os.RemoveAll(e.workDir)
	}
}

// createSchema creates the connector's outbox table (sql/outbox.sql), its
// publication, and the polling relay's table. The publication must exist
// before any slot the drain creates: pgoutput looks it up in the catalog as
// of each change.
func (e *env) createSchema(ctx context.Context) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	ddl, err := os.ReadFile(filepath.Join(root, "sql", "outbox.sql"))
	if err != nil {
		return err
	}
	stmts := []string{
		string(ddl),
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", publication, outboxTable),
		fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", dbzPublication, outboxTable),
		fmt.Sprintf(relay.Schema, pollTable, "outbox_polling"),
	}
	for _, s := range stmts {
		if _, err := e.conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	}
	return nil
}

// createTopics creates topics with the configured partition count, so no
// measurement includes auto-creation.
func (e *env) createTopics(ctx context.Context, topics ...string) error {
	resp, err := e.adm.CreateTopics(ctx, int32(e.partitions), 1, nil, topics...)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	for _, r := range resp.Sorted() {
		if r.Err != nil {
			return fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// deleteTopics frees the broker's disk after a scenario; failure only logs.
func (e *env) deleteTopics(ctx context.Context, topics ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := cdctest.DeleteTopics(ctx, e.adm, topics...); err != nil {
		e.log.Warn("delete topics", "err", err)
	}
}

// topicRecords is the number of records in a topic (all offsets start at 0).
func (e *env) topicRecords(ctx context.Context, topic string) (int64, error) {
	offs, err := e.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	if err := offs.Error(); err != nil {
		return 0, err
	}
	var n int64
	offs.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, nil
}

func (e *env) exec(ctx context.Context, sql string, args ...any) error {
	_, err := e.conn.Exec(ctx, sql, args...)
	return err
}

// createSlot creates a pgoutput slot and returns its consistent point.
func (e *env) createSlot(ctx context.Context, name string) (string, error) {
	var lsn string
	err := e.conn.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", name).Scan(&lsn)
	if err != nil {
		return "", fmt.Errorf("create slot %s: %w", name, err)
	}
	return lsn, nil
}

// dropSlots drops the named slots, waiting up to 10 s each for a walsender
// that is still going away; failures only log (a left-over slot retains WAL,
// which the next scenario survives).
func (e *env) dropSlots(ctx context.Context, names ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, n := range names {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := cdctest.DropSlot(sctx, e.conn, n)
		cancel()
		if err != nil {
			e.log.Warn("drop slot", "slot", n, "err", err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitSlotInactive waits until no walsender holds slot.
func (e *env) waitSlotInactive(ctx context.Context, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for e.slotPID(ctx, slot) != 0 {
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return fmt.Errorf("slot %s still active after its client exited: %w", slot, err)
		}
	}
	return nil
}

// slotPID is the walsender serving an active slot, or 0.
func (e *env) slotPID(ctx context.Context, slot string) int {
	var pid *int32
	if err := e.conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid); err != nil || pid == nil {
		return 0
	}
	return int(*pid)
}

func (e *env) currentLSN(ctx context.Context) (string, error) {
	var lsn string
	err := e.conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	return lsn, err
}

// walBytes is the WAL distance between two LSNs.
func (e *env) walBytes(ctx context.Context, from, to string) (int64, error) {
	var n int64
	err := e.conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint", to, from).Scan(&n)
	return n, err
}

// prebuilt is the absolute path of a binary given by flag -name, which
// must exist.
func prebuilt(name, path string) (string, error) {
	p, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("-%s: %w", name, err)
	}
	return p, nil
}

// connectorBinary returns opts.Connector or builds ./cmd/outbox-cdc.
func connectorBinary(ctx context.Context, opts options, workDir string, log *slog.Logger) (string, error) {
	if opts.Connector != "" {
		return prebuilt("connector", opts.Connector)
	}
	out := filepath.Join(workDir, "outbox-cdc")
	log.Info("building the connector", "out", out)
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	return out, cdctest.Build(bctx, opts.Go, out, "-trimpath")
}

// info describes the machine and the servers for the report.
func (e *env) info(ctx context.Context) EnvInfo {
	in := EnvInfo{
		GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, Cores: runtime.NumCPU(),
		CPU: cpuModel(), MemGiB: memTotalGiB(), Postgres: e.pg.Version(), Kafka: e.kafka.Version(),
		PGSettings: pgSettings, Partitions: e.partitions, BackgroundBusyCores: round(e.background, 2),
	}
	if root, err := testenv.RepoRoot(); err == nil {
		cmd := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD")
		cmd.Dir = root
		if b, err := cmd.Output(); err == nil {
			in.Commit = strings.TrimSpace(string(b))
		}
		// diff-index is read-only (git status may rewrite the index).
		cmd = exec.CommandContext(ctx, "git", "diff-index", "--quiet", "HEAD", "--")
		cmd.Dir = root
		if err := cmd.Run(); err != nil {
			in.Commit += " (with uncommitted changes)"
		}
	}
	return in
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memTotalGiB() float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / (1 << 20)
		}
	}
	return 0
}

// waitQuiet waits, within what is left of the run's quiet budget, until the
// machine is nearly idle (under 0.3 busy cores over 2 s, our idle servers
// included): other users of a shared machine skew every number, most of all
// the drain ratio, whose two sides run one after the other.
func (e *env) waitQuiet(ctx context.Context, what string) {
	const threshold = 0.3
	start := time.Now()
	defer func() { e.quietBudget = max(0, e.quietBudget-time.Since(start)) }()
	for i := 0; ; i++ {
		b0, _, t0 := machineTicks()
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return
		}
		b1, _, t1 := machineTicks()
		busy := 0.0
		if t1 > t0 {
			busy = float64(b1-b0) / float64(t1-t0) * float64(runtime.NumCPU())
		}
		waited := time.Since(start).Round(time.Second)
		switch {
		case busy < threshold:
			if i > 0 {
				e.log.Info("machine quiet", "before", what, "waited", waited)
			}
			return
		case time.Since(start) >= e.quietBudget:
			e.log.Warn("machine busy, starting anyway; this run's numbers are skewed", "before", what,
				"busy_cores", round(busy, 2), "waited", waited)
			return
		case i == 0:
			e.log.Info("machine busy, waiting for it to calm down", "before", what, "busy_cores", round(busy, 2),
				"budget_left", e.quietBudget.Round(time.Second))
		}
	}
}
