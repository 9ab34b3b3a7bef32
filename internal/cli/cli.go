// Package cli implements the outbox-cdc command line: it parses arguments,
// loads the configuration and maps outcomes to exit codes (0 ok, 1 runtime or
// server prerequisite failure, 2 bad usage or configuration).
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
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
  contracts check --config FILE [--sample N] [--json]
                           for each event type in the outbox table(s): whether its subject is
                           in the schema registry, and its last N rows validated (contracts.*)
  contracts register --config FILE --schemas DIR [--dry-run] [--json]
                           register DIR's <subject>.json|.avsc|.proto files after the
                           registry's compatibility check
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

// command is a subcommand that works on a configuration: its flags, what
// is wrong with their values, and what it does once the configuration is
// loaded. Each one lives in a file of its own.
type command interface {
	register(fs *flag.FlagSet)
	problem() string // a usage problem with the flags, or ""
	run(ctx context.Context, e env) int
}

// env is what a command works with.
type env struct {
	cfg            *config.Config
	pc             pipeline.Config // the configuration translated for the pipeline
	log            *slog.Logger
	stdout, stderr io.Writer
}

// commands are the subcommands that load a configuration.
var commands = map[string]func() command{
	"run":     func() command { return &runCmd{} },
	"check":   func() command { return &checkCmd{} },
	"status":  func() command { return &statusOpts{} },
	"replay":  func() command { return &replayOpts{} },
	"verify":  func() command { return &verifyOpts{} },
	"redrive": func() command { return &redriveOpts{} },
}

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
	case "from-debezium":
		return runFromDebezium(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	name := args[0]
	newCmd, ok := commands[name]
	if name == "contracts" && len(args) > 1 {
		name = "contracts " + args[1]
		newCmd, ok = contractsCommands[args[1]]
		args = args[1:]
	}
	if !ok {
		fmt.Fprintf(stderr, "outbox-cdc: unknown command %q\n\n%s", name, usage)
		return ExitUsage
	}
	return runCommand(ctx, name, newCmd(), args[1:], stdout, stderr, environ)
}

// runCommand parses a command's flags, loads the configuration and runs it.
func runCommand(ctx context.Context, name string, cmd command, args []string, stdout, stderr io.Writer, environ []string) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", lookupEnv(environ, config.EnvConfigPath), "config file (YAML)")
	cmd.register(fs)
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if p := cmd.problem(); p != "" {
		fmt.Fprintf(stderr, "outbox-cdc %s: %s\n", name, p)
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbox-cdc %s: unexpected argument %q\n", name, fs.Arg(0))
		return ExitUsage
	}
	e, ok := load(*path, environ, stdout, stderr)
	if !ok {
		return ExitUsage
	}
	return cmd.run(ctx, e)
}

// load reads the configuration and translates it for the pipeline; it
// prints what is wrong and returns false on a bad one.
func load(path string, environ []string, stdout, stderr io.Writer) (env, bool) {
	cfg, err := config.Load(path, environ)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return env{}, false
	}
	log := newLogger(cfg.Log, stderr)
	for _, w := range cfg.Warnings() {
		log.Warn(w.Problem, "key", w.Key)
	}
	pc, err := PipelineConfig(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return env{}, false
	}
	pc.ConfigPath = path
	// The client retries TLS and SASL failures like any connection failure;
	// this says why nothing gets out.
	pc.Sink.SecurityLog = log
	return env{cfg: cfg, pc: pc, log: log, stdout: stdout, stderr: stderr}, true
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

func lookupEnv(environ []string, key string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}
