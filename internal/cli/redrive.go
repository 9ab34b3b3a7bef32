package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

type redriveOpts struct {
	aggregate  string
	skip       bool
	list, json bool
	wait       time.Duration
}

func (o *redriveOpts) register(fs *flag.FlagSet) {
	fs.StringVar(&o.aggregate, "aggregate", "", "the quarantined aggregate (record key) to redrive")
	fs.BoolVar(&o.skip, "skip", false, "lift the quarantine without republishing the dead-lettered event, nor parked events retention deleted")
	fs.DurationVar(&o.wait, "wait", 2*time.Minute, "how long to wait for the connector's answer; the request stays pending after it")
	fs.BoolVar(&o.list, "list", false, "list the quarantined aggregates")
	fs.BoolVar(&o.json, "json", false, "with --list: print JSON")
}

func (o *redriveOpts) problem() string {
	switch {
	case o.list == (o.aggregate != ""):
		return "give either --list or --aggregate KEY"
	case o.skip && o.aggregate == "":
		return "--skip needs --aggregate KEY"
	case o.json && !o.list:
		return "--json goes with --list"
	case o.wait <= 0:
		return "--wait must be positive"
	}
	return ""
}

// redrive lists quarantines or asks the connector to lift one: the
// connector, the only writer of the aggregate's events, carries it out
// (sink/quarantine/redrive.go).
func (o *redriveOpts) run(ctx context.Context, e env) int {
	cfg, pc, stdout, stderr := e.cfg, e.pc, e.stdout, e.stderr
	if cfg.QuarantineTopic() == "" {
		fmt.Fprintln(stderr, "outbox-cdc redrive: dlq.mode is skip: nothing is quarantined")
		return ExitUsage
	}
	idCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	srv, err := pc.Source.DB.Identify(idCtx)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc redrive: postgres: %v\n", err)
		return ExitFailure
	}
	sc := pc.Sink
	sc.QuarantineSource = quarantine.Source(srv.SystemID, srv.Database, pc.Source.Slot)
	c, err := sink.NewStateClient(sc)
	if err != nil {
		fmt.Fprintf(stderr, "outbox-cdc redrive: %v\n", err)
		return ExitFailure
	}
	defer c.Close()
	if o.list {
		listCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		all, err := c.List(listCtx)
		if err != nil {
			fmt.Fprintf(stderr, "outbox-cdc redrive: %v\n", err)
			return ExitFailure
		}
		printQuarantines(stdout, all, o.json)
		return ExitOK
	}
	waitCtx, cancel := context.WithTimeout(ctx, o.wait)
	defer cancel()
	err = c.Redrive(waitCtx, o.aggregate, o.skip)
	switch {
	case err == nil:
		fmt.Fprintf(stdout, "aggregate %s: quarantine lifted\n", o.aggregate)
		return ExitOK
	case errors.Is(err, quarantine.ErrNotQuarantined):
		fmt.Fprintf(stderr, "outbox-cdc redrive: aggregate %s is not quarantined (outbox-cdc redrive --list shows those that are)\n", o.aggregate)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		fmt.Fprintf(stderr, "outbox-cdc redrive: aggregate %s: no answer from the connector within %v; the request stays pending and the connector carries it out when it runs (outbox-cdc redrive --list shows it)\n",
			o.aggregate, o.wait)
	default:
		fmt.Fprintf(stderr, "outbox-cdc redrive: aggregate %s: the redrive failed, the aggregate stays quarantined: %v\n", o.aggregate, err)
	}
	return ExitFailure
}

// printQuarantines prints the set sorted by key.
func printQuarantines(w io.Writer, all map[string]*quarantine.StateRecord, asJSON bool) {
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if asJSON {
		out := make([]*quarantine.StateRecord, 0, len(keys))
		for _, k := range keys {
			out = append(out, all[k])
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AGGREGATE\tSTATE\tFIRST ID\tTOPIC\tSINCE\tREASON")
	for _, k := range keys {
		q := all[k]
		reason := q.Reason
		if q.Failure != "" {
			reason = "redrive failed: " + q.Failure
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", q.Key, q.State, q.FirstID, q.Topic, q.Since.UTC().Format(time.RFC3339), reason)
	}
	_ = tw.Flush()
}
