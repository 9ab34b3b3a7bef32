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
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
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
	Topics []string   `json:"topics"`
	// MissingTopics are topics rows were routed to that do not exist.
	MissingTopics []string `json:"missing_topics,omitempty"`
	verify.Result
	Repair  *RepairReport `json:"repair,omitempty"`
	Seconds float64       `json:"seconds"`
}

// RepairReport is what --repair did.
type RepairReport struct {
	Published    int64 `json:"published"`
	DeadLettered int64 `json:"dead_lettered"`
	// Parked: rows of a quarantined aggregate, republished to the parking
	// topic behind its dead letter (outbox-cdc redrive delivers them).
	Parked int64  `json:"parked"`
	Failed int64  `json:"failed"`
	Error  string `json:"error,omitempty"`
	// HoldCleared: the repair lifted a lost slot's hold on outbox
	// retention (offsets.Checkpoint.RepairSince).
	HoldCleared bool `json:"hold_cleared,omitempty"`
}

// verifyProgress is read by the progress printer.
type verifyProgress struct {
	phase            atomic.Value // string
	rows, records    atomic.Int64
	checked, resends atomic.Int64
}

func (p *verifyProgress) print(w io.Writer) {
	fmt.Fprintf(w, "verify: %s: rows read %d, records read %d, rows checked %d, republished %d\n",
		p.phase.Load(), p.rows.Load(), p.records.Load(), p.checked.Load(), p.resends.Load())
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
	var pr verifyProgress
	pr.phase.Store("reading rows")
	stop := printProgress(&pr, e.stderr)
	rep, err := (&verifyRun{pc: e.pc, o: *o, vts: vts, pr: &pr, log: e.log}).run(ctx)
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
	if rep.Repair != nil {
		if !rep.repaired() {
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
		var pre *replication.PrerequisiteError
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
func printProgress(pr *verifyProgress, w io.Writer) (stop func()) {
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
				pr.print(w)
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

// verifyRun reads the rows (pass 1), the records, and the rows again (pass
// 3), republishing the missing ones with --repair. With several outbox
// tables the rows are each table's in turn, each routed by its own table.
type verifyRun struct {
	pc  pipeline.Config
	o   verifyOpts
	vts []verifyTable
	pr  *verifyProgress
	log *slog.Logger

	c   *verify.Checker
	rec router.Record
}

func (v *verifyRun) run(ctx context.Context) (*VerifyReport, error) {
	var cols []string
	for _, vt := range v.vts {
		if !slices.Contains(cols, vt.rr.Column) {
			cols = append(cols, vt.rr.Column)
		}
	}
	rep := &VerifyReport{Since: v.o.since.Time, Column: strings.Join(cols, ",")}
	if !v.o.until.IsZero() {
		rep.Until = &v.o.until.Time
	}
	// The connector's retention (outbox.retention) deletes no row while
	// verify reads the rows twice and republishes the missing ones.
	release, err := replication.VerifyLock(ctx, v.pc.Source.Tables())
	if err != nil {
		return nil, err
	}
	defer release()
	v.c = verify.New()
	err = eachRow(ctx, v.vts, func(vt verifyTable, ev *decode.Event, at time.Time) {
		v.route(vt.rt, ev, at)
		v.c.AddRow(verify.Row{ID: ev.ID.Bytes, Topic: v.rec.Topic})
		v.pr.rows.Add(1)
	})
	if err != nil {
		return nil, err
	}
	v.c.Seal()
	rep.Topics = v.c.Topics()
	if rep.MissingTopics, err = v.readRecords(ctx, rep.Topics); err != nil {
		return nil, err
	}
	if rep.Repair, err = v.checkRows(ctx); err != nil {
		return nil, err
	}
	rep.Result = v.c.Result()
	v.clearRepairHold(ctx, rep)
	return rep, nil
}

// repaired reports whether --repair republished every missing row.
func (r *VerifyReport) repaired() bool {
	p := r.Repair
	return p != nil && p.Failed == 0 && p.Error == "" && p.Published+p.DeadLettered+p.Parked == r.Missing.Count
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

// recordsFrom is where Kafka is read from: --margin before --since, or
// before the hold's rows when they may be older (from the start without a
// known time).
func (o *verifyOpts) recordsFrom() time.Time {
	from := o.since.Add(-o.margin)
	if h := o.holdSince.Add(-o.margin); o.hold.Set() && h.Before(from) {
		from = h
	}
	return from
}

// clearRepairHold lifts a lost slot's repair hold on retention once a whole
// repair republished every missing row, the held ones among them: nothing
// it kept is undelivered now. The hold is cleared only if no loss since
// widened it. (A hold by time, offsets.Checkpoint.RepairSince, written by
// an earlier version, is cleared from at most its time.)
func (v *verifyRun) clearRepairHold(ctx context.Context, rep *VerifyReport) {
	if !rep.repaired() || !v.o.until.IsZero() {
		return
	}
	if h := v.o.hold; h.Set() {
		cleared, err := replication.NewHolds(v.pc.Source.Writer(), v.pc.HoldsTable, v.pc.Source.Slot).Clear(ctx, h)
		switch {
		case err != nil:
			v.log.Warn("the repair is done, but the lost slot's hold on retention could not be cleared; run verify --repair again", "err", err)
		case cleared:
			rep.Repair.HoldCleared = true
		}
	}
	if cs := v.pc.Checkpoints; cs != nil {
		if cleared, err := cs.ClearRepair(ctx, v.o.since.Time); err == nil && cleared {
			rep.Repair.HoldCleared = true
		}
	}
}

// route gives ev's record (in v.rec): its topic, or the dead-letter one.
func (v *verifyRun) route(rt *router.Router, ev *decode.Event, at time.Time) {
	if reason := rt.Route(ev, at, &v.rec); reason != "" {
		rt.DeadLetter(ev, at, reason, &v.rec)
	}
}

// readRecords reads the records of the rows' topics, and returns the
// topics that do not exist. The dead-letter topic always, and the parking
// topic in dlq.mode quarantine, are read too: rows the sink dead-lettered
// (a topic that refused them) or parked (their aggregate is quarantined)
// were handled, not lost; republishing a parked row would overtake its
// dead letter.
func (v *verifyRun) readRecords(ctx context.Context, rowTopics []string) (missing []string, err error) {
	side := []string{v.pc.Routes.DLQTopic}
	if p := v.pc.Sink.ParkingTopic; p != "" {
		side = append(side, p)
	}
	topics := slices.Clone(rowTopics)
	for _, t := range side {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	v.pr.phase.Store("reading records")
	st, err := sink.ReadRange(ctx, v.pc.Sink, topics, v.o.recordsFrom(), func(r sink.ReadRecord) error {
		v.c.AddRecord(verify.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key,
			ID: r.ID, HasID: r.HasID, DeadLetter: slices.Contains(side, r.Topic)})
		v.pr.records.Add(1)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read kafka: %w", err)
	}
	for _, t := range st.MissingTopics {
		if !slices.Contains(side, t) {
			missing = append(missing, t)
		}
	}
	return missing, nil
}

// checkRows reads the rows again, checks each against the records and,
// with --repair, republishes the missing ones (nil report without it).
func (v *verifyRun) checkRows(ctx context.Context) (*RepairReport, error) {
	v.pr.phase.Store("checking rows")
	var rp *repairer
	if v.o.repair {
		v.pr.phase.Store("checking rows and republishing the missing ones")
		// A quarantine topic found not compacted later stops the repair.
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		defer stop(nil)
		s, err := pipeline.OpenRepairSink(ctx, v.pc, stop, v.log)
		if err != nil {
			return nil, err
		}
		rp = &repairer{s: s, pr: v.pr}
		defer s.Close()
	}
	var differs error
	err := eachRow(ctx, v.vts, func(vt verifyTable, ev *decode.Event, at time.Time) {
		if differs != nil {
			return
		}
		missing, ok := v.c.Check(verify.Row{ID: ev.ID.Bytes})
		if !ok {
			differs = fmt.Errorf("the second read of the rows differs from the first at row %d", v.c.Checked()+1)
			return
		}
		v.pr.checked.Add(1)
		if missing && rp != nil {
			// The row's time column stands in for the commit time, which
			// is gone.
			v.route(vt.rt, ev, at)
			rp.produce(ctx, &v.rec)
		}
	})
	if err == nil {
		err = differs
	}
	if err != nil && ctx.Err() != nil {
		err = context.Cause(ctx) // the repair's stop says why
	}
	if err != nil {
		return nil, err
	}
	if v.c.Checked() != v.c.Result().Rows {
		return nil, fmt.Errorf("the second read of the rows returned %d rows, the first %d", v.c.Checked(), v.c.Result().Rows)
	}
	if rp == nil {
		return nil, nil
	}
	return rp.finish(ctx), nil
}

// repairer republishes missing rows through the sink and counts outcomes.
type repairer struct {
	s               *sink.Sink
	pr              *verifyProgress
	published, dead atomic.Int64
	parked, bad     atomic.Int64
	mu              sync.Mutex
	err             error // the first failure
}

func (r *repairer) produce(ctx context.Context, rec *router.Record) {
	// An error here is ctx's; Delivered has counted the record.
	_ = r.s.Produce(ctx, rec, r)
}

// Delivered runs on a client goroutine.
func (r *repairer) Delivered(o sink.Outcome) {
	switch {
	case o.Err != nil:
		r.bad.Add(1)
		r.mu.Lock()
		if r.err == nil {
			r.err = o.Err
		}
		r.mu.Unlock()
	case o.DeadLettered:
		r.dead.Add(1)
	case o.Parked:
		r.parked.Add(1)
	default:
		r.published.Add(1)
	}
	r.pr.resends.Add(1)
}

// finish waits for every acknowledgement.
func (r *repairer) finish(ctx context.Context) *RepairReport {
	err := r.s.Flush(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		err = r.err
	}
	rep := &RepairReport{Published: r.published.Load(), DeadLettered: r.dead.Load(), Parked: r.parked.Load(), Failed: r.bad.Load()}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}

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
