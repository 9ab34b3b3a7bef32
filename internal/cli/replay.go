package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
)

// lsnFlag parses an LSN flag.
type lsnFlag struct{ lsn.LSN }

func (f *lsnFlag) Set(s string) error {
	v, err := lsn.Parse(s)
	if err != nil {
		return err
	}
	f.LSN = v
	return nil
}

// replayOpts is outbox-cdc replay.
type replayOpts struct {
	from, to lsnFlag
	prefix   string
}

func (o *replayOpts) register(fs *flag.FlagSet) {
	fs.Var(&o.from, "from-lsn", "first LSN to replay (required)")
	fs.Var(&o.to, "to-lsn", "end of the range (default: the server's current WAL position)")
	fs.StringVar(&o.prefix, "topic-prefix", "", "publish to prefixed topics instead of the normal ones")
}

func (o *replayOpts) problem() string {
	if o.from.LSN == 0 {
		return "--from-lsn is required (e.g. --from-lsn 0/1A2B3C4D)"
	}
	return ""
}

// run publishes again what was committed in [from, to).
func (o *replayOpts) run(ctx context.Context, e env) int {
	pc, log, stdout, stderr := e.pc, e.log, e.stdout, e.stderr
	pc.Checkpoints = nil // a replay never moves the connector's checkpoint
	pc.Snapshot = "none"
	pc.Replay = &pipeline.Replay{From: o.from.LSN, To: o.to.LSN, TopicPrefix: o.prefix,
		Progress: func(pr pipeline.ReplayProgress) {
			pct := 0.0
			if pr.To > pr.From && pr.At > pr.From {
				pct = min(100, 100*float64(pr.At-pr.From)/float64(pr.To-pr.From))
			}
			if pr.Done {
				pct = 100
				fmt.Fprintf(stdout, "replay done: %d events from %v to %v\n", pr.Events, pr.From, pr.To)
				return
			}
			fmt.Fprintf(stdout, "replay: %5.1f%% at %v, %d events\n", pct, pr.At, pr.Events)
		}}
	p, err := pipeline.New(pc, metrics.New(), log)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc: %v\n", err)
		return ExitUsage
	}
	if err := p.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "outbox-cdc replay: %v\n", err)
		return ExitFailure
	}
	return ExitOK
}
