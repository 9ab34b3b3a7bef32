package verify

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRows is a table of ids in order, all routed to topic "t" but for
// the ones in dead (routed to "dlq"). The second read returns second when
// set; errs[i] fails read i (0: pass 1, 1: pass 3).
type fakeRows struct {
	ids, second []string
	dead        []string
	errs        [2]error
	routed      []bool // route, per read
}

func (f *fakeRows) Read(ctx context.Context, route bool, fn func(Row, string)) error {
	n := len(f.routed)
	f.routed = append(f.routed, route)
	ids := f.ids
	if n == 1 && f.second != nil {
		ids = f.second
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r := Row{ID: []byte(id)}
		if route {
			r.Topic = "t"
			if slices.Contains(f.dead, id) {
				r.Topic = "dlq"
			}
		}
		fn(r, id)
	}
	return f.errs[min(n, 1)]
}

// fakeRecords holds the records in Kafka; absent are topics that do not
// exist.
type fakeRecords struct {
	recs   []Record
	absent []string
	err    error
	topics []string // asked for
	from   time.Time
}

func (f *fakeRecords) Read(_ context.Context, topics []string, from time.Time, fn func(Record)) ([]string, error) {
	f.topics, f.from = topics, from
	for _, r := range f.recs {
		if slices.Contains(topics, r.Topic) {
			fn(r)
		}
	}
	return f.absent, f.err
}

// has is one record per id, in topic "t" unless named "topic:id".
func has(ids ...string) *fakeRecords {
	f := &fakeRecords{}
	for i, id := range ids {
		topic := "t"
		if t, rest, ok := strings.Cut(id, ":"); ok {
			topic, id = t, rest
		}
		f.recs = append(f.recs, Record{Topic: topic, Offset: int64(i), Key: []byte("k"), ID: []byte(id), HasID: true})
	}
	return f
}

// fakeRepublisher delivers each row's outcome (outcomes[id], published by
// default) on a goroutine of its own, as the sink does.
type fakeRepublisher struct {
	outcomes map[string]Outcome
	openErr  error
	flushErr error
	stopAt   string // Republish of this id stops the pass with errStopped
	sent     []string
	closed   bool

	done func(Outcome)
	stop context.CancelCauseFunc
	wg   sync.WaitGroup
}

var errStopped = errors.New("quarantine topic not compacted")

func (f *fakeRepublisher) open(_ context.Context, stop context.CancelCauseFunc, done func(Outcome)) (Republisher[string], error) {
	if f.openErr != nil {
		return nil, f.openErr
	}
	f.stop, f.done = stop, done
	return f, nil
}

func (f *fakeRepublisher) Republish(_ context.Context, id string) {
	f.sent = append(f.sent, id)
	if id == f.stopAt {
		f.stop(errStopped)
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.done(f.outcomes[id])
	}()
}

func (f *fakeRepublisher) Flush(context.Context) error { f.wg.Wait(); return f.flushErr }
func (f *fakeRepublisher) Close()                      { f.closed = true }

// fakeHold is a hold whose Clear returns cleared and err.
type fakeHold struct {
	cleared bool
	err     error
	calls   int
}

func (f *fakeHold) Clear(context.Context) (bool, error) {
	f.calls++
	return f.cleared, f.err
}

var since = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func baseConfig() Config {
	return Config{Since: since, Margin: 5 * time.Minute, SideTopics: []string{"dlq", "park"}}
}

// TestRunPasses: what each pass finds and republishes.
func TestRunPasses(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		rows    *fakeRows
		recs    *fakeRecords
		repair  *fakeRepublisher // nil: no --repair
		want    Report
		sent    []string
		ok      bool // Repaired
		missing []string
	}{
		{name: "all there", rows: &fakeRows{ids: []string{"a", "b", "c"}}, recs: has("a", "b", "c"),
			want: Report{Topics: []string{"t"}, Result: Result{Rows: 3, RecordsRead: 3, Found: 3}}},
		{name: "one missing", rows: &fakeRows{ids: []string{"a", "b", "c"}}, recs: has("a", "c"),
			want:    Report{Topics: []string{"t"}, Result: Result{Rows: 3, RecordsRead: 2, Found: 2}},
			missing: []string{"b"}},
		{name: "dead-lettered and parked rows were handled",
			rows: &fakeRows{ids: []string{"a", "b", "c"}, dead: []string{"c"}}, recs: has("a", "dlq:b", "park:c"),
			want: Report{Topics: []string{"dlq", "t"}, Result: Result{Rows: 3, RecordsRead: 3, Found: 3, DeadLettered: 2}}},
		{name: "missing topics leave out the side topics",
			rows: &fakeRows{ids: []string{"a"}}, recs: &fakeRecords{absent: []string{"t", "dlq", "park"}},
			want:    Report{Topics: []string{"t"}, MissingTopics: []string{"t"}, Result: Result{Rows: 1}},
			missing: []string{"a"}},
		{name: "repair republishes the missing rows",
			rows: &fakeRows{ids: []string{"a", "b", "c", "d"}}, recs: has("b"), repair: &fakeRepublisher{},
			want:    Report{Topics: []string{"t"}, Result: Result{Rows: 4, RecordsRead: 1, Found: 1}, Repair: &Repair{Published: 3}},
			sent:    []string{"a", "c", "d"},
			missing: []string{"a", "c", "d"}, ok: true},
		{name: "repair counts each outcome",
			rows: &fakeRows{ids: []string{"a", "b", "c", "d"}}, recs: has(),
			repair: &fakeRepublisher{outcomes: map[string]Outcome{"b": {DeadLettered: true}, "c": {Parked: true}}},
			want: Report{Topics: []string{"t"}, Result: Result{Rows: 4},
				Repair: &Repair{Published: 2, DeadLettered: 1, Parked: 1}},
			sent: []string{"a", "b", "c", "d"}, missing: []string{"a", "b", "c", "d"}, ok: true},
		{name: "a failed row fails the repair",
			rows: &fakeRows{ids: []string{"a", "b"}}, recs: has(),
			repair: &fakeRepublisher{outcomes: map[string]Outcome{"b": {Err: boom}}},
			want:   Report{Topics: []string{"t"}, Result: Result{Rows: 2}, Repair: &Repair{Published: 1, Failed: 1, Error: "boom"}},
			sent:   []string{"a", "b"}, missing: []string{"a", "b"}},
		{name: "a failed flush fails the repair",
			rows: &fakeRows{ids: []string{"a", "b"}}, recs: has("a"), repair: &fakeRepublisher{flushErr: boom},
			want: Report{Topics: []string{"t"}, Result: Result{Rows: 2, RecordsRead: 1, Found: 1},
				Repair: &Repair{Published: 1, Error: "boom"}},
			sent: []string{"b"}, missing: []string{"b"}},
		{name: "nothing missing: the repair is complete",
			rows: &fakeRows{ids: []string{"a"}}, recs: has("a"), repair: &fakeRepublisher{},
			want: Report{Topics: []string{"t"}, Result: Result{Rows: 1, RecordsRead: 1, Found: 1}, Repair: &Repair{}},
			ok:   true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var open OpenRepublisher[string]
			if tc.repair != nil {
				open = tc.repair.open
			}
			var pr Progress
			cfg := baseConfig()
			cfg.Progress = &pr
			rep, err := Run(t.Context(), cfg, tc.rows, tc.recs, open)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []*Finding{&tc.want.Missing, &tc.want.Duplicated, &tc.want.OutOfOrder} {
				f.First = []string{}
			}
			tc.want.Missing = Finding{Count: int64(len(tc.missing)), First: append([]string{}, tc.missing...)}
			if !reflect.DeepEqual(*rep, tc.want) {
				t.Errorf("report\n%+v\nwant\n%+v", *rep, tc.want)
			}
			if rep.Repaired() != tc.ok {
				t.Errorf("Repaired() = %v, want %v", rep.Repaired(), tc.ok)
			}
			if tc.repair != nil {
				if !slices.Equal(tc.repair.sent, tc.sent) || !tc.repair.closed {
					t.Errorf("republished %q (closed %v), want %q", tc.repair.sent, tc.repair.closed, tc.sent)
				}
			}
			// Pass 1 routes the rows; pass 3 does not.
			if !slices.Equal(tc.rows.routed, []bool{true, false}) {
				t.Errorf("reads routed %v, want [true false]", tc.rows.routed)
			}
			// The rows' topics, then the side topics not among them.
			want := slices.Clone(rep.Topics)
			for _, side := range []string{"dlq", "park"} {
				if !slices.Contains(want, side) {
					want = append(want, side)
				}
			}
			if !slices.Equal(tc.recs.topics, want) {
				t.Errorf("read topics %q, want %q", tc.recs.topics, want)
			}
			n := int64(len(tc.rows.ids))
			if pr.Rows.Load() != n || pr.Checked.Load() != n || pr.Records.Load() != rep.RecordsRead ||
				pr.Republished.Load() != int64(len(tc.sent)) {
				t.Errorf("progress rows %d records %d checked %d republished %d", pr.Rows.Load(), pr.Records.Load(),
					pr.Checked.Load(), pr.Republished.Load())
			}
		})
	}
}

// TestRunFails: a failed read or a changed table ends the run with an
// error and no report.
func TestRunFails(t *testing.T) {
	boom := errors.New("boom")
	three := []string{"a", "b", "c"}
	tests := []struct {
		name   string
		rows   *fakeRows
		recs   *fakeRecords
		repair *fakeRepublisher
		want   string
		sent   []string // republished before the failure
	}{
		{name: "pass 1 read", rows: &fakeRows{ids: three, errs: [2]error{boom}}, recs: has(), want: "boom"},
		{name: "kafka read", rows: &fakeRows{ids: three}, recs: &fakeRecords{err: boom}, want: "read kafka: boom"},
		{name: "pass 3 read", rows: &fakeRows{ids: three, errs: [2]error{nil, boom}}, recs: has(), want: "boom"},
		{name: "second read differs", rows: &fakeRows{ids: three, second: []string{"a", "x", "c"}}, recs: has(),
			want: "the second read of the rows differs from the first at row 2"},
		{name: "after a difference nothing is republished",
			rows: &fakeRows{ids: three, second: []string{"a", "x", "b", "c"}}, recs: has(),
			repair: &fakeRepublisher{}, want: "the second read of the rows differs from the first at row 2", sent: []string{"a"}},
		{name: "second read shorter", rows: &fakeRows{ids: three, second: []string{"a", "b"}}, recs: has(),
			want: "the second read of the rows returned 2 rows, the first 3"},
		{name: "repair sink does not open", rows: &fakeRows{ids: three}, recs: has(),
			repair: &fakeRepublisher{openErr: boom}, want: "boom"},
		{name: "repair stopped", rows: &fakeRows{ids: three}, recs: has("a"),
			repair: &fakeRepublisher{stopAt: "b"}, want: errStopped.Error(), sent: []string{"b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var open OpenRepublisher[string]
			if tc.repair != nil {
				open = tc.repair.open
			}
			held := &fakeHold{cleared: true}
			cfg := baseConfig()
			cfg.Held, cfg.TimeHold = held, held
			rep, err := Run(t.Context(), cfg, tc.rows, tc.recs, open)
			if err == nil || err.Error() != tc.want || rep != nil {
				t.Fatalf("Run = %v, %v; want error %q", rep, err, tc.want)
			}
			if held.calls != 0 {
				t.Errorf("a failed run cleared a hold (%d calls)", held.calls)
			}
			if tc.repair != nil && tc.repair.openErr == nil && !tc.repair.closed {
				t.Error("the republisher was not closed")
			}
			if tc.repair != nil && !slices.Equal(tc.repair.sent, tc.sent) {
				t.Errorf("republished %q, want %q", tc.repair.sent, tc.sent)
			}
		})
	}
}

// TestRunLiftsHolds: a complete repair over the whole range lifts the
// holds; anything less keeps them.
func TestRunLiftsHolds(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name      string
		recs      *fakeRecords
		repair    *fakeRepublisher
		until     bool
		held      *fakeHold // nil: none
		timeHold  *fakeHold
		calls     int // Clear calls, each hold
		cleared   bool
		warned    bool
		noRepair  bool
		failedRun bool
	}{
		{name: "clean repair lifts the hold", recs: has("a"), repair: &fakeRepublisher{},
			held: &fakeHold{cleared: true}, calls: 1, cleared: true},
		{name: "repair of missing rows lifts the hold", recs: has(), repair: &fakeRepublisher{},
			held: &fakeHold{cleared: true}, calls: 1, cleared: true},
		{name: "a loss widened the hold since", recs: has(), repair: &fakeRepublisher{},
			held: &fakeHold{cleared: false}, calls: 1},
		{name: "clearing fails: warned, kept", recs: has(), repair: &fakeRepublisher{},
			held: &fakeHold{err: boom}, calls: 1, warned: true},
		{name: "a hold by time is lifted", recs: has(), repair: &fakeRepublisher{},
			timeHold: &fakeHold{cleared: true}, calls: 1, cleared: true},
		{name: "a hold by time that fails is not reported", recs: has(), repair: &fakeRepublisher{},
			timeHold: &fakeHold{err: boom}, calls: 1},
		{name: "both holds", recs: has(), repair: &fakeRepublisher{},
			held: &fakeHold{}, timeHold: &fakeHold{cleared: true}, calls: 1, cleared: true},
		{name: "a failed row keeps it", recs: has(), repair: &fakeRepublisher{outcomes: map[string]Outcome{"a": {Err: boom}}},
			held: &fakeHold{cleared: true}, timeHold: &fakeHold{cleared: true}},
		{name: "a failed flush keeps it", recs: has(), repair: &fakeRepublisher{flushErr: boom},
			held: &fakeHold{cleared: true}, timeHold: &fakeHold{cleared: true}},
		{name: "a range with an end keeps it", recs: has(), repair: &fakeRepublisher{}, until: true,
			held: &fakeHold{cleared: true}, timeHold: &fakeHold{cleared: true}},
		{name: "no repair keeps it", recs: has("a", "b"), noRepair: true,
			held: &fakeHold{cleared: true}, timeHold: &fakeHold{cleared: true}},
		{name: "a failed read keeps it", recs: &fakeRecords{err: boom}, repair: &fakeRepublisher{}, failedRun: true,
			held: &fakeHold{cleared: true}, timeHold: &fakeHold{cleared: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			cfg := baseConfig()
			cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
			if tc.until {
				cfg.Until = since.Add(time.Hour)
			}
			if tc.held != nil {
				cfg.Held = tc.held
			}
			if tc.timeHold != nil {
				cfg.TimeHold = tc.timeHold
			}
			var open OpenRepublisher[string]
			if !tc.noRepair {
				open = tc.repair.open
			}
			rep, err := Run(t.Context(), cfg, &fakeRows{ids: []string{"a", "b"}}, tc.recs, open)
			if (err != nil) != tc.failedRun {
				t.Fatalf("Run: %v", err)
			}
			for _, h := range []*fakeHold{tc.held, tc.timeHold} {
				if h != nil && h.calls != tc.calls {
					t.Errorf("Clear called %d times, want %d", h.calls, tc.calls)
				}
			}
			if err == nil && rep.Repair != nil && rep.Repair.HoldCleared != tc.cleared {
				t.Errorf("HoldCleared = %v, want %v", rep.Repair.HoldCleared, tc.cleared)
			}
			if err == nil && rep.Repair == nil && tc.cleared {
				t.Error("no repair report")
			}
			warned := strings.Contains(logs.String(), "could not be cleared; run verify --repair again")
			if warned != tc.warned {
				t.Errorf("warned %v, want %v; log: %s", warned, tc.warned, logs.String())
			}
		})
	}
}

// TestRecordsFrom: Kafka is read from the margin before the range, or
// before the held rows when they may be older.
func TestRecordsFrom(t *testing.T) {
	margin := 5 * time.Minute
	tests := []struct {
		name      string
		held      bool
		heldSince time.Time
		want      time.Time
	}{
		{name: "no hold", want: since.Add(-margin)},
		{name: "no hold, a stale since ignored", heldSince: since.Add(-time.Hour), want: since.Add(-margin)},
		{name: "held rows older", held: true, heldSince: since.Add(-time.Hour), want: since.Add(-time.Hour - margin)},
		{name: "held rows newer", held: true, heldSince: since.Add(time.Hour), want: since.Add(-margin)},
		{name: "held rows of unknown time: from the start", held: true, want: time.Time{}.Add(-margin)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.HeldSince = tc.heldSince
			if tc.held {
				cfg.Held = &fakeHold{}
			}
			recs := has()
			if _, err := Run(t.Context(), cfg, &fakeRows{ids: []string{"a"}}, recs, nil); err != nil {
				t.Fatal(err)
			}
			if !recs.from.Equal(tc.want) {
				t.Errorf("read Kafka from %v, want %v", recs.from, tc.want)
			}
		})
	}
}
