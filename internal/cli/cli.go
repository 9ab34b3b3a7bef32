// Package cli implements the outbox-cdc command line: it parses arguments,
// loads the configuration and maps outcomes to exit codes (0 ok, 1 runtime or
// server prerequisite failure, 2 bad usage or configuration).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=...".
var Version = "dev"

const usage = `usage: outbox-cdc <command> [flags]

commands:
  run      --config FILE   stream outbox inserts from PostgreSQL to Kafka
  check    --config FILE   validate the configuration and the server prerequisites
  status   --config FILE [--json] [--lsn LSN]
                           slot, confirmed and restart LSN, lag, retained WAL, checkpoint,
                           and whether the replay window covers LSN
  replay   --config FILE --from-lsn LSN [--to-lsn LSN] [--topic-prefix P]
                           publish again what was committed in [from, to)
  verify   --config FILE --since TIME [--until TIME] [--margin D] [--repair] [--json]
                           compare the outbox rows of a time range with Kafka; with
                           --repair, republish the missing ones
  redrive  --config FILE --list [--json] | --aggregate KEY [--skip] [--wait D]
                           list the quarantined aggregates (dlq.mode quarantine), or have the
                           running connector republish an aggregate's dead letter (not with
                           --skip) and parked events to their topics, in order, and lift it
  from-debezium FILE.properties
                           print the outbox-cdc YAML for a Debezium outbox connector config
  version                  print the version

The config file may also be given by OUTBOX_CDC_CONFIG; every key can be
overridden by OUTBOX_CDC_<SECTION>_<KEY> (see docs/configuration.md).
`

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// Run executes one command and returns the process exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, environ []string) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	switch args[0] {
	case "version", "--version":
		fmt.Fprintf(stdout, "outbox-cdc %s\n", Version)
		return ExitOK
	case "run", "check", "status", "replay", "verify", "redrive":
	case "from-debezium":
		return runFromDebezium(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	default:
		fmt.Fprintf(stderr, "outbox-cdc: unknown command %q\n\n%s", args[0], usage)
		return ExitUsage
	}

	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", lookupEnv(environ, config.EnvConfigPath), "config file (YAML)")
	var ro replayOpts
	var so statusOpts
	var vo verifyOpts
	var rdo redriveOpts
	switch args[0] {
	case "replay":
		fs.Var(&ro.from, "from-lsn", "first LSN to replay (required)")
		fs.Var(&ro.to, "to-lsn", "end of the range (default: the server's current WAL position)")
		fs.StringVar(&ro.prefix, "topic-prefix", "", "publish to prefixed topics instead of the normal ones")
	case "status":
		fs.BoolVar(&so.json, "json", false, "print JSON")
		fs.Var(&so.lsn, "lsn", "report whether the replay window covers this LSN")
	case "verify":
		vo.register(fs)
	case "redrive":
		rdo.register(fs)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return ExitUsage
	}
	if args[0] == "replay" && ro.from.LSN == 0 {
		fmt.Fprintln(stderr, "outbox-cdc replay: --from-lsn is required (e.g. --from-lsn 0/1A2B3C4D)")
		return ExitUsage
	}
	if args[0] == "verify" {
		if p := vo.problem(); p != "" {
			fmt.Fprintf(stderr, "outbox-cdc verify: %s\n", p)
			return ExitUsage
		}
	}
	if args[0] == "redrive" {
		if p := rdo.problem(); p != "" {
			fmt.Fprintf(stderr, "outbox-cdc redrive: %s\n", p)
			return ExitUsage
		}
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbox-cdc %s: unexpected argument %q\n", args[0], fs.Arg(0))
		return ExitUsage
	}
	cfg, err := config.Load(*path, environ)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return ExitUsage
	}
	log := newLogger(cfg.Log, stderr)
	for _, w := range cfg.Warnings() {
		log.Warn(w.Problem, "key", w.Key)
	}
	pc, err := PipelineConfig(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return ExitUsage
	}
	pc.ConfigPath = *path
	// The client retries TLS and SASL failures like any connection failure;
	// this says why nothing gets out.
	pc.Sink.Opts = append(pc.Sink.Opts, sink.SecurityFailureLog(log, time.Minute))

	switch args[0] {
	case "check":
		return check(ctx, pc, stdout, stderr)
	case "status":
		return status(ctx, cfg, pc, so, stdout, stderr)
	case "replay":
		return replay(ctx, pc, ro, log, stdout, stderr)
	case "verify":
		return verifyCmd(ctx, pc, vo, log, stdout, stderr)
	case "redrive":
		return redrive(ctx, cfg, pc, rdo, stdout, stderr)
	}
	return run(ctx, cfg, pc, log, stderr)
}

func run(ctx context.Context, cfg *config.Config, pc pipeline.Config, log *slog.Logger, stderr io.Writer) int {
	pc.Sink.Opts = append(pc.Sink.Opts, sink.RetryEOF())
	m := metrics.New()
	tp, stopTracing, err := startTracing(ctx, cfg.OTel, m, log)
	if err != nil {
		log.Error("tracing", "err", err)
		return ExitFailure
	}
	if tp != nil {
		pc.Tracer = tp
		defer stopTracing() // after the pipeline drained: every span has ended
	}
	p, err := pipeline.New(pc, m, log)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return ExitUsage
	}
	if cfg.HTTP.Listen != "" {
		srv, err := serveHTTP(cfg.HTTP, m, p, log)
		if err != nil {
			log.Error("http listener", "listen", cfg.HTTP.Listen, "err", err)
			return ExitFailure
		}
		defer srv.Close()
	}
	if err := p.Run(ctx); err != nil {
		// Logged once, here, at the top.
		log.Error("connector failed", "err", err)
		return ExitFailure
	}
	return ExitOK
}

func check(ctx context.Context, pc pipeline.Config, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	failed := false
	if err := replication.Check(ctx, pc.Source); err != nil {
		failed = true
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "postgres: %s\n", line)
		}
	} else {
		fmt.Fprintln(stdout, "postgres: ok")
	}
	s, err := sink.New(pc.Sink, slog.New(slog.DiscardHandler))
	if err == nil {
		err = s.Ping(ctx)
		s.Close()
	}
	if err == nil {
		// The connector's own topics: what run would create, and what the
		// cluster refuses (run would refuse to start).
		err = sink.EnsureOwnTopics(ctx, pc.Sink, false, checkLogger(stdout))
	}
	if err != nil {
		failed = true
		fmt.Fprintf(stderr, "kafka: %v\n", err)
	} else {
		fmt.Fprintln(stdout, "kafka: ok")
	}
	if failed {
		return ExitFailure
	}
	return ExitOK
}

// checkLogger writes check's notes (a topic run creates, a setting that
// may lose records) as log lines without a time.
func checkLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
}

// PipelineConfig translates a validated file configuration into the pipeline's.
func PipelineConfig(cfg *config.Config) (pipeline.Config, error) {
	db, err := postgresDB(cfg.Postgres)
	if err != nil {
		return pipeline.Config{}, err
	}
	var (
		tables []pipeline.Table
		srcs   []replication.OutboxTable
	)
	for _, tc := range cfg.PerTable() {
		t, src, err := outboxTable(&tc, db)
		if err != nil {
			return pipeline.Config{}, err
		}
		tables, srcs = append(tables, t), append(srcs, src)
	}
	retainFor, retainBytes, err := config.RetainWindow(cfg.Postgres.Retain)
	if err != nil { // validated already
		return pipeline.Config{}, fmt.Errorf("postgres.retain: %w", err)
	}
	primary, err := primaryDB(cfg.Postgres)
	if err != nil {
		return pipeline.Config{}, err
	}
	sec, err := kafkaSecurity(cfg.Kafka)
	if err != nil {
		return pipeline.Config{}, err
	}
	kafkaOpts, err := sink.SecurityOpts(sec)
	if err != nil {
		return pipeline.Config{}, err
	}
	src := replication.Source{
		DB: db, Slot: cfg.Postgres.Slot, Publication: cfg.Postgres.Publication,
		OutboxTable: srcs[0], Others: srcs[1:], Failover: cfg.Postgres.FailoverSlot,
		Primary: primary, CheckpointTable: cfg.Checkpoint.Store == "table",
	}
	pc := pipeline.Config{
		Source:  src,
		Mapping: tables[0].Mapping,
		Routes:  tables[0].Routes,
		More:    tables[1:],
		Sink: sink.Config{
			Brokers: cfg.Kafka.Brokers, ClientID: cfg.Kafka.ClientID, DLQTopic: cfg.Kafka.DLQTopic,
			MaxBufferedRecords: cfg.Kafka.MaxBufferedRecords, MaxBufferedBytes: cfg.Kafka.MaxBufferedBytes,
			Linger: cfg.Kafka.ProducerLinger, RequestTimeout: cfg.Kafka.RequestTimeout, Compression: cfg.Kafka.Compression,
			AutoCreateTopics: cfg.Kafka.AutoCreateTopics, TopicPartitions: int32(cfg.Kafka.TopicPartitions),
			TopicReplicationFactor: int16(cfg.Kafka.TopicReplicationFactor), UnknownTopicTimeout: cfg.Kafka.UnknownTopicTimeout,
			ParkingTopic: cfg.ParkingTopic(), MaxQuarantined: cfg.DLQ.MaxQuarantined, QuarantineTopic: cfg.QuarantineTopic(),
			Opts: kafkaOpts,
		},
		DrainTimeout:    cfg.Kafka.DrainTimeout,
		StatusInterval:  cfg.Postgres.StatusInterval,
		BackoffMax:      cfg.Postgres.ReconnectBackoffMax,
		Checkpoints:     checkpointStore(cfg, src.Writer()), // the primary of a standby
		RetainFor:       retainFor,
		RetainBytes:     retainBytes,
		Heartbeat:       cfg.Postgres.HeartbeatInterval,
		RetainedWALWarn: cfg.Postgres.RetainedWALWarnBytes,
		QueueBytes:      cfg.Postgres.QueueBytes,
		ReceiveTimeout:  cfg.Postgres.ReceiveTimeout,
		MessagePrefix:   cfg.Outbox.MessagePrefix,
		Snapshot:        cfg.Snapshot.Mode,
		SnapshotFilter:  cfg.Snapshot.Filter,
		SnapshotOrderBy: cfg.Snapshot.OrderBy,
	}
	if cfg.Kafka.ExactlyOnce() {
		pc.ExactlyOnce = &pipeline.ExactlyOnce{Interval: cfg.Kafka.TransactionInterval, PositionsTopic: cfg.Kafka.PositionsTopic}
	}
	return pc, nil
}

// outboxTable translates one outbox table's configuration (config.PerTable)
// into its mapping, routes and mapped columns.
func outboxTable(tc *config.Config, db *replication.DB) (pipeline.Table, replication.OutboxTable, error) {
	schema, table := tc.Outbox.SchemaTable()
	c := tc.Outbox.Columns
	routes := tc.Routes()
	mapping := decode.Mapping{
		Schema: schema, Table: table,
		ID: c.ID, AggregateType: c.AggregateType, AggregateID: c.AggregateID, EventType: c.EventType, Payload: c.Payload,
		HeaderColumns: headerColumns(tc.Outbox), Columns: routes.Columns(),
	}
	if err := mapping.Validate(); err != nil {
		return pipeline.Table{}, replication.OutboxTable{}, err
	}
	cols := append([]string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}, headerColumns(tc.Outbox)...)
	cols = append(cols, mapping.Columns...)
	routes.Format, routes.CloudEvents = cloudEvents(tc.Kafka, db, schema, table)
	return pipeline.Table{Mapping: mapping, Routes: routes},
		replication.OutboxTable{Schema: schema, Table: table, Columns: cols}, nil
}

// kafkaSecurity translates kafka.tls and kafka.sasl for the sink. The
// password file is read here (OAUTHBEARER token files and client secret
// files at each use), and the CA, certificate and key files by
// sink.SecurityOpts, at start.
func kafkaSecurity(k config.Kafka) (sink.Security, error) {
	sec := sink.Security{TLS: k.TLS.Sink()}
	switch k.SASL.Mechanism {
	case "":
	case sink.MechanismOAuthBearer, sink.MechanismAWSMSKIAM:
		sec.SASL = &sink.SASL{Mechanism: k.SASL.Mechanism, OAuth: k.SASL.OAuth.Sink()}
	default:
		pw, err := k.SASL.Secret()
		if err != nil {
			return sink.Security{}, err
		}
		sec.SASL = &sink.SASL{Mechanism: k.SASL.Mechanism, Username: k.SASL.Username, Password: sink.Secret(pw)}
	}
	return sec, nil
}

// postgresDB parses postgres.dsn once and gives it the password source of
// postgres.password_file or postgres.password_command, used at every
// connection attempt: the password goes to the driver's settings for that
// connect only, never into a DSN string (which could end up in a message)
// nor into the process environment. A DSN with its own password was
// rejected by validation.
func postgresDB(p config.Postgres) (*replication.DB, error) {
	return replication.ParseDB(string(p.DSN), p.PasswordSource())
}

// primaryDB parses postgres.primary_dsn like postgres.dsn; nil when unset.
func primaryDB(p config.Postgres) (*replication.DB, error) {
	if p.PrimaryDSN == "" {
		return nil, nil
	}
	d, err := replication.ParseDB(string(p.PrimaryDSN), p.PasswordSource())
	if err != nil {
		return nil, fmt.Errorf("postgres.primary_dsn: %w", err)
	}
	return d, nil
}

// checkpointStore builds the configured store; nil for none.
func checkpointStore(cfg *config.Config, db *replication.DB) offsets.Store {
	switch cfg.Checkpoint.Store {
	case "table":
		return replication.NewTableStore(db, cfg.Checkpoint.Table, cfg.Postgres.Slot)
	case "file":
		return offsets.NewFileStore(cfg.Checkpoint.File)
	}
	return nil
}

func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level)) // validated by config
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serveHTTP starts /metrics, /healthz and /readyz (and /debug/pprof/ with
// http.pprof) on http.listen.
func serveHTTP(hc config.HTTP, m *metrics.Metrics, p *pipeline.Pipeline, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", hc.Listen)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !p.Streaming() {
			http.Error(w, "not streaming", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if hc.PProf {
		// Index serves the named profiles too (heap, goroutine, allocs, ...).
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		// Serve ends with ErrServerClosed when Close is called.
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	return srv, nil
}

func lookupEnv(environ []string, key string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}
