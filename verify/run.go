package verify

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Rows is the outbox rows of the range. Run reads them twice (passes 1 and
// 3) and needs the same rows in the same order both times: the caller keeps
// retention from deleting any meanwhile.
type Rows[R any] interface {
	// Read calls f for every row, table after table, each in its order,
	// with what a Republisher needs of it. Row.Topic is set only when
	// route is true (pass 1): pass 3 routes only the rows it republishes.
	Read(ctx context.Context, route bool, f func(Row, R)) error
}

// Records is the records in Kafka.
type Records interface {
	// Read calls f for every record of topics from the first one at or
	// after from, each partition in offset order, and returns the topics
	// that do not exist.
	Read(ctx context.Context, topics []string, from time.Time, f func(Record)) (missing []string, err error)
}

// Republisher sends missing rows again (--repair).
type Republisher[R any] interface {
	// Republish sends r; its outcome reaches the done the republisher was
	// opened with. An error is ctx's, and done is called all the same.
	Republish(ctx context.Context, r R)
	// Flush waits for every outcome.
	Flush(ctx context.Context) error
	Close()
}

// OpenRepublisher opens pass 3's Republisher. stop ends the pass with a
// cause (a quarantine topic found not compacted stops the repair); done
// receives each outcome, on any goroutine, and does not block.
type OpenRepublisher[R any] func(ctx context.Context, stop context.CancelCauseFunc, done func(Outcome)) (Republisher[R], error)

// Outcome is a republished row's fate.
type Outcome struct {
	DeadLettered, Parked bool
	Err                  error // delivered nowhere
}

// Hold is a hold on outbox retention that a complete repair lifts.
type Hold interface {
	// Clear lifts the hold if no loss widened it since it was read, and
	// reports whether it did.
	Clear(ctx context.Context) (bool, error)
}

// HoldFunc is a Hold.
type HoldFunc func(ctx context.Context) (bool, error)

// Clear calls f.
func (f HoldFunc) Clear(ctx context.Context) (bool, error) { return f(ctx) }

// Config is one run's range and what it may touch.
type Config struct {
	Since, Until time.Time // Until zero: no end
	// Margin: Kafka is read from this long before Since (record timestamps
	// are commit times, which can trail the row's time).
	Margin time.Duration
	// SideTopics are read besides the rows' topics, and a row found there
	// was handled: the dead-letter topic, and the parking topic in
	// dlq.mode quarantine (republishing a parked row would overtake its
	// dead letter).
	SideTopics []string
	// Held is the lost slot's repair hold the rows include (nil: none);
	// its events may begin in Kafka at HeldSince (zero: unknown).
	Held      Hold
	HeldSince time.Time
	// TimeHold is a hold by time an earlier version wrote
	// (offsets.Checkpoint.RepairSince), lifted from at most Since; nil:
	// none.
	TimeHold Hold
	Log      *slog.Logger // nil: discard
	Progress *Progress    // nil: not reported
}

// Progress is what a run has done so far, for a printer on another
// goroutine.
type Progress struct {
	Phase                atomic.Value // string
	Rows, Records        atomic.Int64
	Checked, Republished atomic.Int64
}

// Report is what a run found, and what its repair did.
type Report struct {
	Topics []string `json:"topics"`
	// MissingTopics are topics rows were routed to that do not exist.
	MissingTopics []string `json:"missing_topics,omitempty"`
	Result
	Repair *Repair `json:"repair,omitempty"`
}

// Repair is what --repair did.
type Repair struct {
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

// Repaired reports whether a repair republished every missing row.
func (r *Report) Repaired() bool {
	p := r.Repair
	return p != nil && p.Failed == 0 && p.Error == "" && p.Published+p.DeadLettered+p.Parked == r.Missing.Count
}

// Run compares the rows with the records in three passes: it reads the
// rows (1), the records of their topics (2), and the rows again, checking
// each and, with republish (nil: no repair), sending the missing ones (3).
// A complete repair then lifts the holds of cfg.
func Run[R any](ctx context.Context, cfg Config, rows Rows[R], records Records, republish OpenRepublisher[R]) (*Report, error) {
	r := &runner[R]{cfg: cfg, rows: rows, c: New(), pr: cfg.Progress}
	if r.pr == nil {
		r.pr = new(Progress)
	}
	if r.cfg.Log == nil {
		r.cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := r.readRows(ctx); err != nil {
		return nil, err
	}
	rep := &Report{Topics: r.c.Topics()}
	var err error
	if rep.MissingTopics, err = r.readRecords(ctx, records, rep.Topics); err != nil {
		return nil, err
	}
	if rep.Repair, err = r.checkRows(ctx, republish); err != nil {
		return nil, err
	}
	rep.Result = r.c.Result()
	r.liftHolds(ctx, rep)
	return rep, nil
}

type runner[R any] struct {
	cfg  Config
	rows Rows[R]
	c    *Checker
	pr   *Progress
}

// readRows is pass 1.
func (r *runner[R]) readRows(ctx context.Context) error {
	r.pr.Phase.Store("reading rows")
	err := r.rows.Read(ctx, true, func(row Row, _ R) {
		r.c.AddRow(row)
		r.pr.Rows.Add(1)
	})
	if err != nil {
		return err
	}
	r.c.Seal()
	return nil
}

// recordsFrom is where Kafka is read from: Margin before Since, or before
// the held rows when they may be older (from the start without a known
// time).
func (cfg *Config) recordsFrom() time.Time {
	from := cfg.Since.Add(-cfg.Margin)
	if h := cfg.HeldSince.Add(-cfg.Margin); cfg.Held != nil && h.Before(from) {
		from = h
	}
	return from
}

// readRecords is pass 2: the records of the rows' topics and the side
// topics. It returns the rows' topics that do not exist.
func (r *runner[R]) readRecords(ctx context.Context, records Records, rowTopics []string) (missing []string, err error) {
	side := r.cfg.SideTopics
	topics := slices.Clone(rowTopics)
	for _, t := range side {
		if !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	r.pr.Phase.Store("reading records")
	absent, err := records.Read(ctx, topics, r.cfg.recordsFrom(), func(rec Record) {
		rec.DeadLetter = slices.Contains(side, rec.Topic)
		r.c.AddRecord(rec)
		r.pr.Records.Add(1)
	})
	if err != nil {
		return nil, fmt.Errorf("read kafka: %w", err)
	}
	for _, t := range absent {
		if !slices.Contains(side, t) {
			missing = append(missing, t)
		}
	}
	return missing, nil
}

// checkRows is pass 3: it reads the rows again, checks each against the
// records and, with republish, sends the missing ones (nil Repair without).
func (r *runner[R]) checkRows(ctx context.Context, republish OpenRepublisher[R]) (*Repair, error) {
	r.pr.Phase.Store("checking rows")
	var rp Republisher[R]
	var t *tally
	if republish != nil {
		r.pr.Phase.Store("checking rows and republishing the missing ones")
		var stop context.CancelCauseFunc
		ctx, stop = context.WithCancelCause(ctx)
		defer stop(nil)
		t = &tally{pr: r.pr}
		var err error
		if rp, err = republish(ctx, stop, t.delivered); err != nil {
			return nil, err
		}
		defer rp.Close()
	}
	var differs error
	err := r.rows.Read(ctx, false, func(row Row, ref R) {
		if differs != nil {
			return
		}
		missing, ok := r.c.Check(row)
		if !ok {
			differs = fmt.Errorf("the second read of the rows differs from the first at row %d", r.c.Checked()+1)
			return
		}
		r.pr.Checked.Add(1)
		if missing && rp != nil {
			rp.Republish(ctx, ref)
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
	if r.c.Checked() != r.c.Result().Rows {
		return nil, fmt.Errorf("the second read of the rows returned %d rows, the first %d", r.c.Checked(), r.c.Result().Rows)
	}
	if rp == nil {
		return nil, nil
	}
	return t.report(rp.Flush(ctx)), nil
}

// liftHolds lifts the holds on retention once a whole repair (no --until)
// republished every missing row, the held ones among them: nothing they
// kept is undelivered now. Each hold is lifted only if no loss since
// widened it (Hold.Clear).
func (r *runner[R]) liftHolds(ctx context.Context, rep *Report) {
	if !rep.Repaired() || !r.cfg.Until.IsZero() {
		return
	}
	if h := r.cfg.Held; h != nil {
		cleared, err := h.Clear(ctx)
		switch {
		case err != nil:
			r.cfg.Log.Warn("the repair is done, but the lost slot's hold on retention could not be cleared; run verify --repair again", "err", err)
		case cleared:
			rep.Repair.HoldCleared = true
		}
	}
	// An earlier version's hold: a failure to lift it is not reported.
	if h := r.cfg.TimeHold; h != nil {
		if cleared, err := h.Clear(ctx); err == nil && cleared {
			rep.Repair.HoldCleared = true
		}
	}
}

// tally counts the republished rows' outcomes.
type tally struct {
	pr              *Progress
	published, dead atomic.Int64
	parked, bad     atomic.Int64
	mu              sync.Mutex
	err             error // the first failure
}

// delivered runs on the republisher's goroutines.
func (t *tally) delivered(o Outcome) {
	switch {
	case o.Err != nil:
		t.bad.Add(1)
		t.mu.Lock()
		if t.err == nil {
			t.err = o.Err
		}
		t.mu.Unlock()
	case o.DeadLettered:
		t.dead.Add(1)
	case o.Parked:
		t.parked.Add(1)
	default:
		t.published.Add(1)
	}
	t.pr.Republished.Add(1)
}

// report is the Repair once every outcome is in; flushErr is the flush's.
func (t *tally) report(flushErr error) *Repair {
	t.mu.Lock()
	defer t.mu.Unlock()
	err := flushErr
	if t.err != nil {
		err = t.err
	}
	rep := &Repair{Published: t.published.Load(), DeadLettered: t.dead.Load(), Parked: t.parked.Load(), Failed: t.bad.Load()}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}
