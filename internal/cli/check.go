package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// checkCmd is outbox-cdc check: the configuration and the servers'
// prerequisites, without streaming.
type checkCmd struct{}

func (*checkCmd) register(*flag.FlagSet) {}
func (*checkCmd) problem() string        { return "" }

func (*checkCmd) run(ctx context.Context, e env) int {
	pc, stdout, stderr := e.pc, e.stdout, e.stderr
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	failed := false
	if err := replication.Check(ctx, pc.Source); err != nil {
		failed = true
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "postgres: %s\n", line)
		}
	} else if err := replication.NewMarks(pc.Source, pc.MarksTable).Check(ctx); pc.MarksTable != "" && err != nil {
		failed = true
		fmt.Fprintf(stderr, "postgres: %v\n", err)
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
