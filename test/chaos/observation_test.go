package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
)

// EnvRecheck names a saved observation to check again, without servers:
//
//	OUTBOX_CDC_CHAOS_RECHECK=results/last-run-observation.json go test -short -run TestRecheck ./test/chaos/
//
// Every run saves its observation beside its results (observationFile).
const EnvRecheck = "OUTBOX_CDC_CHAOS_RECHECK"

// observationFile is where a run saves its observation, in results/.
const observationFile = "last-run-observation.json"

// observation is what a run recorded: everything the checks read. The run
// fills it once everything stopped (observe); check is a function of it
// alone, so a saved run can be checked again.
type observation struct {
	Mode        string `json:"mode"` // the mode's name: long runs must see retention and the second slot act
	ExactlyOnce bool   `json:"exactly_once"`
	Seed        uint64 `json:"seed"`
	// Failed: the test had failed before the checks (a worker's error, a
	// clean stop that failed, ...): the run does not pass.
	Failed    bool      `json:"failed"`
	FlowStart time.Time `json:"flow_start"` // verify checks the rows written since (verifySince)
	End       time.Time `json:"end"`        // the last fault's recovery is measured up to it

	Prefix       string `json:"prefix"`
	DLQ          string `json:"dlq"`
	BigTopic     string `json:"big_topic"`
	ParkingTopic string `json:"parking_topic"`
	Compacted    bool   `json:"compacted"`
	CompactTopic string `json:"compact_topic"`

	Events  []event         `json:"events"` // the writers' ledger
	Undone  map[string]bool `json:"undone"` // events a restore or a promotion undid
	Writers writerCounts    `json:"writers"`
	Faults  []faultRecord   `json:"faults"`
	Skipped []string        `json:"skipped"`
	// What the fault phase saw go wrong, or had to set right.
	ExpectedExits []string `json:"expected_exits"`
	OpsFailures   []string `json:"ops_failures"`
	Exits         []string `json:"exits"`
	Runbooks      []string `json:"runbooks"` // the suite's and the connector's start-up ones
	Hangs         []string `json:"hangs"`

	Incarnations []*incarnation `json:"incarnations"`
	// BackfillLines: per process, its log lines saying it published rows of
	// a publication gap from the table (backfillLine).
	BackfillLines map[int][]string     `json:"backfill_lines"`
	Samples       []sample             `json:"samples"`
	Seen          map[string]time.Time `json:"seen"` // the live consumer's first sight of each event
	Kept          map[string][]copyRec `json:"kept"` // the live consumer's records of the kept topics

	// The final read: the tables, the topics and the dead-letter topic,
	// the parking topic (not in exactly_once); the errors as text.
	Table       map[string]tableRow `json:"table"`
	TableErr    string              `json:"table_error,omitempty"`
	Records     []copyRec           `json:"records"`
	DeadLetters []copyRec           `json:"dead_letters"`
	ReadErr     string              `json:"read_error,omitempty"`
	Parked      []copyRec           `json:"parked"`
	ParkedErr   string              `json:"parked_error,omitempty"`

	// Expectations the faults registered.
	Redrive     redriveObs        `json:"redrive"`
	SlotLost    map[string]string `json:"slot_lost"`
	RepairRuns  []repairRun       `json:"repair_runs"`
	LastDeleted float64           `json:"last_deleted"`
	Held        *heldObs          `json:"held,omitempty"`
	SecondSlot  *secondSlotObs    `json:"second_slot,omitempty"`
	Verify      *verifyObs        `json:"verify,omitempty"`
}

// writerCounts are the writers' counters (writerStats) at the end.
type writerCounts struct {
	Txns, Retries, Unknown, UnknownWon, UndefinedColumn int64
}

// redriveObs is what the redrives left (redriveState).
type redriveObs struct {
	Lifted      map[string]map[int]bool `json:"lifted"`
	Lost        map[string]string       `json:"lost"`
	Republished map[string]bool         `json:"republished"`
}

// heldObs are the slow writers' holds (heldLog).
type heldObs struct {
	Writers map[int]bool   `json:"writers"`
	Spans   [][2]time.Time `json:"spans"`
}

// secondSlotObs is the second slot after its final check.
type secondSlotObs struct {
	Name     string           `json:"name"`
	Report   secondSlotReport `json:"report"`
	FinalErr string           `json:"final_error,omitempty"`
}

// observe records the run, once the connector, the writers and the
// observers stopped: it reads the table and the topics back and runs the
// run's verify.
func (r *run) observe(ctx context.Context) *observation {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	o := &observation{Mode: r.m.Name, ExactlyOnce: exactlyOnce(), Seed: r.seed, FlowStart: r.flowStart,
		Prefix: r.prefix, DLQ: r.dlq, BigTopic: r.bigTopic, ParkingTopic: r.parkingTopic(), Compacted: r.compacted,
		Events: r.ledger.all(), Undone: r.ledger.undoneIDs(), Faults: slices.Clone(r.faults),
		ExpectedExits: r.expectedExits, OpsFailures: r.opsFailures, Exits: r.exits, Hangs: r.hangs,
		Runbooks:      append(append([]string(nil), r.runbooks...), r.conn.startRunbooks()...),
		BackfillLines: map[int][]string{}, Samples: r.samp.all(), Seen: r.live.snapshot(), Kept: map[string][]copyRec{},
		Redrive:  redriveObs{Lifted: r.rd.lifted, Lost: r.rd.lost, Republished: r.rd.republished},
		SlotLost: r.slotLost, RepairRuns: r.repairRuns, LastDeleted: r.lastDeleted}
	if r.compacted {
		o.CompactTopic = r.compactTopic()
	}
	o.Writers = writerCounts{Txns: r.wstats.txns.Load(), Retries: r.wstats.retries.Load(), Unknown: r.wstats.unknown.Load(),
		UnknownWon: r.wstats.unknownWon.Load(), UndefinedColumn: r.wstats.undefinedColumn.Load()}
	for _, k := range allFaults {
		if r.skip[k] {
			o.Skipped = append(o.Skipped, k)
		}
	}
	for _, in := range r.conn.incarnations() {
		c := *in
		o.Incarnations = append(o.Incarnations, &c)
		for l := range strings.SplitSeq(r.conn.logOf(in.N), "\n") {
			if backfillLine.MatchString(l) {
				o.BackfillLines[in.N] = append(o.BackfillLines[in.N], l)
			}
		}
	}
	for _, topic := range []string{r.parkingTopic(), r.bigTopic, r.compactTopic()} {
		if cs := r.live.kept(topic); len(cs) > 0 {
			o.Kept[topic] = cs
		}
	}
	if r.held != nil {
		r.held.mu.Lock()
		o.Held = &heldObs{Writers: r.held.writers, Spans: slices.Clone(r.held.spans)}
		r.held.mu.Unlock()
	}

	var err error
	if o.Table, err = readTable(rctx, direct(r.dsn)); err != nil {
		o.TableErr = err.Error()
	}
	if o.Records, o.DeadLetters, err = readAll(rctx, append(slices.Clone(r.topics), r.bigTopic), r.dlq); err != nil {
		o.ReadErr = err.Error()
	}
	_, o.Parked, err = readAll(rctx, nil, r.parkingTopic())
	if err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
		o.ParkedErr = err.Error()
	}
	o.SecondSlot = r.finalSecondSlot(rctx)
	o.Verify = r.runVerify(ctx, verifySince(r.flowStart))
	o.End = time.Now()
	o.Failed = r.t.Failed()
	return o
}

// finalSecondSlot checks the second slot once more after the last stop.
func (r *run) finalSecondSlot(ctx context.Context) *secondSlotObs {
	s := r.second
	if s == nil {
		return nil
	}
	conn, err := pgx.Connect(ctx, direct(r.dsn))
	if err == nil {
		_, _, err = s.check(ctx, conn)
		conn.Close(context.Background())
	}
	so := &secondSlotObs{Name: s.name}
	if err != nil {
		so.FinalErr = err.Error()
	}
	s.mu.Lock()
	so.Report = s.rep
	s.mu.Unlock()
	return so
}

// save writes o as JSON to path.
func (o *observation) save(path string) error {
	b, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("observation: %w", err)
	}
	return os.WriteFile(path, b, 0o644)
}

// loadObservation reads an observation save wrote.
func loadObservation(path string) (*observation, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var o observation
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("observation %s: %w", path, err)
	}
	return &o, nil
}

// keptOf are the live consumer's records of id on topic.
func (o *observation) keptOf(topic, id string) []copyRec {
	var out []copyRec
	for _, c := range o.Kept[topic] {
		if c.ID == id {
			out = append(out, c)
		}
	}
	return out
}

// retentionDeleted are the ids of the rows retention deleted.
func (o *observation) retentionDeleted() map[string]bool {
	out := map[string]bool{}
	for id, row := range o.Table {
		if !row.Deleted.IsZero() {
			out[id] = true
		}
	}
	return out
}

// TestRecheck checks a saved observation again (EnvRecheck), without
// servers, and reports as the run did.
func TestRecheck(t *testing.T) {
	path := os.Getenv(EnvRecheck)
	if path == "" {
		t.Skip("set " + EnvRecheck + " to a saved observation (results/" + observationFile + ")")
	}
	o, err := loadObservation(path)
	if err != nil {
		t.Fatal(err)
	}
	v := o.check()
	for _, n := range v.Notes {
		t.Logf("chaos: %s", n)
	}
	for _, e := range v.Errors {
		t.Errorf("%s", e)
	}
	rep := v.Report
	t.Logf("chaos recheck: %s, mode %s, seed %d: pass %v; events %d, records %d, faults %d; lost %d, unexpected %d, order violations %d, duplicates %d (%d below the start position), watermark violations %d; %d failures",
		path, o.Mode, o.Seed, rep.Pass, rep.EventsWritten, rep.RecordsInKafka, rep.FaultsTotal, rep.EventsLost, rep.UnexpectedRecords,
		rep.OrderViolations, rep.Duplicates, rep.DupsBelowConfirmed, rep.WatermarkViolations, len(rep.Failures))
	if !rep.Pass && len(v.Errors) == 0 {
		t.Errorf("the run did not pass: %s", strings.Join(rep.Failures, "; "))
	}
}

// analyze records the run, saves the observation beside the results and
// checks it; the failures the checks find fail the test.
func (r *run) analyze(ctx context.Context) *Report {
	o := r.observe(ctx)
	path := filepath.Join("results", observationFile)
	if err := os.MkdirAll("results", 0o755); err != nil {
		r.t.Logf("chaos: observation not saved: %v", err)
	} else if err := o.save(path); err != nil {
		r.t.Logf("chaos: observation not saved: %v", err)
	} else {
		r.t.Logf("chaos: observation saved in %s (check it again: %s=%s go test -short -run TestRecheck ./test/chaos/)", path, EnvRecheck, path)
	}
	v := o.check()
	for _, n := range v.Notes {
		r.t.Logf("chaos: %s", n)
	}
	for _, e := range v.Errors {
		r.t.Errorf("%s", e)
	}
	return v.Report
}
