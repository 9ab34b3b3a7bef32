// Command minimal-connector is the smallest correct outbox connector
// (bench/minimal): the floor outbox-bench holds outbox-cdc's defaults
// against. It streams an existing pgoutput slot into Kafka, producing with
// franz-go's defaults and a 10 ms linger, and confirms the slot only up to
// transactions Kafka acknowledged in full. SIGINT or SIGTERM stop it; it
// exits 0 after a clean stop, 1 on an error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/outbox-cdc/outbox-cdc/bench/minimal"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "minimal-connector:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg, level, err := parseFlags(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return minimal.Run(ctx, cfg, log)
}

func parseFlags(args []string) (minimal.Config, slog.Level, error) {
	var cfg minimal.Config
	var level slog.Level
	fs := flag.NewFlagSet("minimal-connector", flag.ContinueOnError)
	fs.StringVar(&cfg.DSN, "dsn", "", "PostgreSQL connection string (replication=database is added)")
	fs.StringVar(&cfg.Slot, "slot", "", "an existing pgoutput replication slot")
	fs.StringVar(&cfg.Publication, "publication", "outbox_cdc", "publication of the outbox table")
	brokers := fs.String("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers, comma list")
	fs.StringVar(&cfg.TopicPrefix, "topic-prefix", "outbox.event.", "a record's topic is this prefix + its aggregate_type")
	fs.DurationVar(&cfg.Linger, "linger", 10*time.Millisecond, "producer linger")
	fs.DurationVar(&cfg.Status, "status-interval", time.Second, "how often the confirmed position is reported")
	fs.DurationVar(&cfg.Grace, "grace", 30*time.Second, "after a stop, how long produced records may take to be acknowledged")
	fs.Int64Var(&cfg.StopAfter, "stop-after", 0, "exit 0 once this many events are confirmed (0: run until stopped)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return cfg, level, err
	}
	if fs.NArg() > 0 {
		return cfg, level, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for b := range strings.SplitSeq(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.Brokers = append(cfg.Brokers, b)
		}
	}
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return cfg, level, fmt.Errorf("-log-level: %w", err)
	}
	return cfg, level, cfg.Validate()
}
