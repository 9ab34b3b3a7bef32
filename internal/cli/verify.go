package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/retention"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/verify"
)

// progressEvery is how often verify prints its progress on stderr.
const progressEvery = 3 * time.Second

// timeFlag parses an RFC 3339 time.
type timeFlag struct{ time.Time }

func (f *timeFlag) String() string {
	if f.IsZero() {
		return ""
	}
	return f.Format(time.RFC3339Nano)
}

func (f *timeFlag) Set(s string) error {
	t, err := time.Parse(time.RFC3339, s) // fractional seconds are accepted too
	if err != nil {
		return fmt.Errorf("want an RFC 3339 time such as 2025-06-01T12:00:00Z: %w", err)
	}
	f.Time = t
	return nil
}

type verifyOpts struct {
	since, until timeFlag
	// hold is the lost slot's repair hold, read at start (loadHold);
	// holdSince where its events may begin in Kafka (zero: unknown).
	hold         retention.Hold
	holdSince    time.Time
	margin       time.Duration
	repair, json bool
}

func (o *verifyOpts) register(fs *flag.FlagSet) {
	fs.Var(&o.since, "since", "first row time to verify, RFC 3339 (required)")
	fs.Var(&o.until, "until", "end of the range, RFC 3339 (default: no end)")
	fs.DurationVar(&o.margin, "margin", 5*time.Minute,
		"read Kafka from this long before --since: record timestamps are commit times, which can trail the row's time")
	fs.BoolVar(&o.repair, "repair", false, "republish the missing rows")
	fs.BoolVar(&o.json, "json", false, "print JSON")
}

// problem is what is wrong with the flags, or "".
func (o *verifyOpts) problem() string {
	switch {
	case o.since.IsZero():
		return "--since is required (e.g. --since 2025-06-01T00:00:00Z)"
	case !o.until.IsZero() && !o.until.After(o.since.Time):
		return "--until must be after --since"
	case o.margin < 0:
		return "--margin must not be negative"
	}
	return ""
}

// VerifyReport is what `outbox-cdc verify --json` prints.
type VerifyReport struct {
	Since  time.Time  `json:"since"`
	Until  *time.Time `json:"until,omitempty"`
	Column string     `json:"column"` // the time column selecting the rows
	verify.Report
	Seconds float64 `json:"seconds"`
}

// RepairReport is what --repair did.
type RepairReport = verify.Repair

func printVerifyProgress(p *verify.Progress, w io.Writer) {
	fmt.Fprintf(w, "verify: %s: rows read %d, records read %d, rows checked %d, republished %d\n",
		p.Phase.Load(), p.Rows.Load(), p.Records.Load(), p.Checked.Load(), p.Republished.Load())
}

// run compares the outbox rows of the range with Kafka.
func (o *verifyOpts) run(ctx context.Context, e env) int {
	start := time.Now()
	if err := o.loadHold(ctx, e.pc); err != nil {
		fmt.Fprintf(e.stderr, "outbox-cdc verify: %v\n", err)
		return ExitFailure
	}
	vts, code := o.openTables(ctx, e.pc, e.stderr)
	defer func() {
		for _, vt := range vts {
			vt.rr.Close()
		}
	}()
	if code != ExitOK {
		return code
	}
	var pr verify.Progress
	pr.Phase.Store("reading rows")
	stop := printProgress(&pr, e.stderr)
	rep, err := o.verify(ctx, e.pc, vts, &pr, e.log)
	stop()
	if err != nil {
		fmt.Fprintf(e.stderr, "outbox-cdc verify: %v\n", err)
		return ExitFailure
	}
	rep.Seconds = time.Since(start).Seconds()
	if o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printVerify(e.stdout, rep)
	}
	return verifyExit(rep)
}

// verifyExit is verify's exit code: with --repair whether it republished
// every missing row, without it whether none is missing.
func verifyExit(rep *VerifyReport) int {
	if rep.Repair != nil {
		if !rep.Repaired() {
			return ExitFailure
		}
		return ExitOK
	}
	if rep.Missing.Count > 0 {
		return ExitFailure
	}
	return ExitOK
}

// openTables opens the range read of every outbox table; the exit code is
// ExitOK or the failure's (whatever it opened is in the tables returned).
func (o *verifyOpts) openTables(ctx context.Context, pc pipeline.Config, stderr io.Writer) ([]verifyTable, int) {
	tables := []pipeline.Table{{Mapping: pc.Mapping, Routes: pc.Routes}}
	tables = append(tables, pc.More...)
	var vts []verifyTable
	for i, src := range pc.Source.Tables() {
		rt, err := router.New(tables[i].Routes)
		if err != nil {
			fmt.Fprintf(stderr, "outbox-cdc verify: %v\n", err)
			return vts, ExitUsage
		}
		spec := replication.RowSpec{Mapping: tables[i].Mapping, OrderBy: pc.SnapshotOrderBy, Table: i}
		rr, err := src.ReadRange(ctx, spec, o.since.Time, o.until.Time, o.hold)
		var pre *fault.PrerequisiteError
		switch {
		case errors.As(err, &pre):
			// The table cannot be read by time: fix the configuration or the
			// table; exit 1 stays "rows are missing".
			fmt.Fprintf(stderr, "outbox-cdc verify: %s\n  fix: %s\n", pre.Problem, pre.Fix)
			return vts, ExitUsage
		case err != nil:
			fmt.Fprintf(stderr, "outbox-cdc verify: %v\n", err)
			return vts, ExitFailure
		}
		vts = append(vts, verifyTable{rt: rt, rr: rr})
	}
	return vts, ExitOK
}

// printProgress prints pr every progressEvery until the returned stop is
// called (which waits for the printer to end).
func printProgress(pr *verify.Progress, w io.Writer) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				printVerifyProgress(pr, w)
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}

// verifyTable is one outbox table's rows and the router of its records.
type verifyTable struct {
	rt *router.Router
	rr *replication.RangeRead
}

// eachRow calls f for every row of every table, table after table, in
// each table's order.
func eachRow(ctx context.Context, vts []verifyTable, f func(vt verifyTable, ev *decode.Event, at time.Time)) error {
	for _, vt := range vts {
		if err := vt.rr.Start(ctx); err != nil {
			return err
		}
		for vt.rr.Next() {
			ev, at, err := vt.rr.Row()
			if err != nil {
				return err
			}
			f(vt, &ev, at)
		}
		if err := vt.rr.Err(); err != nil {
			return err
		}
	}
	return nil
}

// verify runs verify.Run over the tables, Kafka and, with --repair, the
// repair sink. With several outbox tables the rows are each table's in
// turn, each routed by its own table.
func (o *verifyOpts) verify(ctx context.Context, pc pipeline.Config, vts []verifyTable, pr *verify.Progress, log *slog.Logger) (*VerifyReport, error) {
	var cols []string
	for _, vt := range vts {
		if !slices.Contains(cols, vt.rr.Column) {
			cols = append(cols, vt.rr.Column)
		}
	}
	rep := &VerifyReport{Since: o.since.Time, Column: strings.Join(cols, ",")}
	if !o.until.IsZero() {
		rep.Until = &o.until.Time
	}
	// The connector's retention (outbox.retention) deletes no row while
	// verify reads the rows twice and republishes the missing ones.
	release, err := replication.VerifyLock(ctx, pc.Source.Tables())
	if err != nil {
		return nil, err
	}
	defer release()
	var republish verify.OpenRepublisher[tableRow]
	if o.repair {
		republish = openRepairSink(pc, log)
	}
	r, err := verify.Run(ctx, o.config(pc, pr, log), tableRows(vts), kafkaRecords{pc.Sink}, republish)
	if err != nil {
		return nil, err
	}
	rep.Report = *r
	return rep, nil
}

// config is verify.Run's: the range, the side topics (the dead-letter topic
// always, the parking topic in dlq.mode quarantine) and the holds a whole
// repair lifts.
func (o *verifyOpts) config(pc pipeline.Config, pr *verify.Progress, log *slog.Logger) verify.Config {
	cfg := verify.Config{Since: o.since.Time, Until: o.until.Time, Margin: o.margin,
		SideTopics: []string{pc.Routes.DLQTopic}, HeldSince: o.holdSince, Log: log, Progress: pr}
	if p := pc.Sink.ParkingTopic; p != "" {
		cfg.SideTopics = append(cfg.SideTopics, p)
	}
	if h := o.hold; h.Set() {
		holds := replication.NewHolds(pc.Source.Writer(), pc.HoldsTable, pc.Source.Slot)
		cfg.Held = verify.HoldFunc(func(ctx context.Context) (bool, error) { return holds.Clear(ctx, h) })
	}
	if cs := pc.Checkpoints; cs != nil {
		// A hold by time, offsets.Checkpoint.RepairSince, written by an
		// earlier version, is cleared from at most its time.
		since := o.since.Time
		cfg.TimeHold = verify.HoldFunc(func(ctx context.Context) (bool, error) { return cs.ClearRepair(ctx, since) })
	}
	return cfg
}

// loadHold reads the lost slot's repair hold (replication.Holds): a
// verify without --until reads its rows whatever their time, and Kafka from
// where their events may be.
func (o *verifyOpts) loadHold(ctx context.Context, pc pipeline.Config) error {
	if pc.HoldsTable == "" || !o.until.IsZero() {
		return nil
	}
	h, since, err := replication.NewHolds(pc.Source.Writer(), pc.HoldsTable, pc.Source.Slot).Load(ctx)
	if err != nil {
		return err
	}
	o.hold, o.holdSince = h, since
	return nil
}

// tableRow is a row as the repair sink needs it.
type tableRow struct {
	rt *router.Router
	ev *decode.Event
	at time.Time
}

// tableRows reads the outbox tables' ranges (verify.Rows).
type tableRows []verifyTable

func (vts tableRows) Read(ctx context.Context, route bool, f func(verify.Row, tableRow)) error {
	var rec router.Record
	return eachRow(ctx, vts, func(vt verifyTable, ev *decode.Event, at time.Time) {
		row := verify.Row{ID: ev.ID.Bytes}
		if route {
			routeRow(vt.rt, ev, at, &rec)
			row.Topic = rec.Topic
		}
		f(row, tableRow{rt: vt.rt, ev: ev, at: at})
	})
}

// routeRow gives ev's record (in rec): its topic, or the dead-letter one.
func routeRow(rt *router.Router, ev *decode.Event, at time.Time, rec *router.Record) {
	if reason := rt.Route(ev, at, rec); reason != "" {
		rt.DeadLetter(ev, at, reason, rec)
	}
}

// kafkaRecords reads the topics' records (verify.Records).
type kafkaRecords struct{ cfg sink.Config }

func (k kafkaRecords) Read(ctx context.Context, topics []string, from time.Time, f func(verify.Record)) ([]string, error) {
	st, err := sink.ReadRange(ctx, k.cfg, topics, from, func(r sink.ReadRecord) error {
		f(verify.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, ID: r.ID, HasID: r.HasID})
		return nil
	})
	return st.MissingTopics, err
}

// openRepairSink opens the producer that republishes missing rows
// (verify.OpenRepublisher).
func openRepairSink(pc pipeline.Config, log *slog.Logger) verify.OpenRepublisher[tableRow] {
	return func(ctx context.Context, stop context.CancelCauseFunc, done func(verify.Outcome)) (verify.Republisher[tableRow], error) {
		s, err := pipeline.OpenRepairSink(ctx, pc, stop, log)
		if err != nil {
			return nil, err
		}
		return &repairSink{s: s, done: done, contracts: pipeline.NewRepairContracts(pc, log)}, nil
	}
}

// repairSink republishes rows through the sink, each checked against its
// event contract as the stream checks it (contracts.*; nil: off).
type repairSink struct {
	s         *sink.Sink
	done      func(verify.Outcome)
	rec       router.Record
	contracts *pipeline.RepairContracts
}

func (r *repairSink) Republish(ctx context.Context, row tableRow) {
	// The row's time column stands in for the commit time, which is gone.
	if reason := row.rt.Route(row.ev, row.at, &r.rec); reason != "" {
		row.rt.DeadLetter(row.ev, row.at, reason, &r.rec)
	} else if err := r.contracts.Check(ctx, row.rt, row.ev, row.at, &r.rec); err != nil {
		// contracts' fail, or the end while the row waits for the
		// registry: not republished, and counted as failed.
		r.done(verify.Outcome{Err: fmt.Errorf("event %s not republished: %w", row.ev.ID.Bytes, err)})
		return
	}
	// An error here is ctx's; Delivered has counted the record.
	_ = r.s.Produce(ctx, &r.rec, r)
}

// Delivered runs on a client goroutine.
func (r *repairSink) Delivered(o sink.Outcome) {
	r.done(verify.Outcome{DeadLettered: o.DeadLettered, Parked: o.Parked, Err: o.Err})
}

func (r *repairSink) Flush(ctx context.Context) error { return r.s.Flush(ctx) }
func (r *repairSink) Close()                          { r.s.Close() }

func printVerify(w io.Writer, r *VerifyReport) {
	until := "no end"
	if r.Until != nil {
		until = r.Until.Format(time.RFC3339)
	}
	fmt.Fprintf(w, "rows            %d (%s from %s, %s)\n", r.Rows, r.Column, r.Since.Format(time.RFC3339), until)
	fmt.Fprintf(w, "topics          %s\n", strings.Join(r.Topics, ", "))
	if len(r.MissingTopics) > 0 {
		fmt.Fprintf(w, "missing topics  %s\n", strings.Join(r.MissingTopics, ", "))
	}
	fmt.Fprintf(w, "records read    %d (%d outside the range, %d without id)\n", r.RecordsRead, r.Outside, r.WithoutID)
	fmt.Fprintf(w, "found           %d (%d in the dead-letter or parking topic)\n", r.Found, r.DeadLettered)
	for _, f := range []struct {
		name string
		f    verify.Finding
	}{{"missing", r.Missing}, {"duplicated", r.Duplicated}, {"out of order", r.OutOfOrder}} {
		fmt.Fprintf(w, "%-15s %d", f.name, f.f.Count)
		if len(f.f.First) > 0 {
			fmt.Fprintf(w, " (first: %s)", strings.Join(f.f.First, " "))
		}
		fmt.Fprintln(w)
	}
	if p := r.Repair; p != nil {
		fmt.Fprintf(w, "republished     %d (%d to the dead-letter topic, %d parked behind a quarantine, %d failed)\n",
			p.Published+p.DeadLettered+p.Parked, p.DeadLettered, p.Parked, p.Failed)
		if p.Error != "" {
			fmt.Fprintf(w, "repair error    %s\n", p.Error)
		}
		if p.HoldCleared {
			fmt.Fprintf(w, "retention       the lost slot's hold is cleared: outbox retention deletes these rows again once delivered\n")
		}
	}
	fmt.Fprintf(w, "took            %.1fs\n", r.Seconds)
}
