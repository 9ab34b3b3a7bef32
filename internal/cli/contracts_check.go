package cli

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// contractsCheckCmd is outbox-cdc contracts check.
type contractsCheckCmd struct {
	sample int
	json   bool
}

func (o *contractsCheckCmd) register(fs *flag.FlagSet) {
	fs.IntVar(&o.sample, "sample", 100, "rows validated per event type: the last ones in the snapshot order")
	fs.BoolVar(&o.json, "json", false, "print JSON")
}

func (o *contractsCheckCmd) problem() string {
	if o.sample < 1 {
		return fmt.Sprintf("--sample %d: want at least 1", o.sample)
	}
	return ""
}

// maxExamples is how many violations a type's report quotes.
const maxExamples = 3

// ContractsCheckReport is what `outbox-cdc contracts check --json` prints.
type ContractsCheckReport struct {
	Registry    string      `json:"registry"`
	Strategy    string      `json:"subject_strategy"`
	UnknownType string      `json:"unknown_type"` // contracts.unknown_type: pass makes a missing subject no failure
	Sample      int         `json:"sample"`
	Types       []TypeCheck `json:"types"`
	Failures    int         `json:"failures"`
}

// TypeCheck is one event type of one outbox table on one topic (a type
// routed to several topics has several, one subject each under the
// topic strategies).
type TypeCheck struct {
	Table      string `json:"table"`
	EventType  string `json:"event_type"` // "" for NULL
	Topic      string `json:"topic,omitempty"`
	Subject    string `json:"subject,omitempty"`
	Registered bool   `json:"registered"`
	Version    int    `json:"version,omitempty"`
	ID         int    `json:"id,omitempty"`
	// Rows counts the rows checked against the schema; Violations those
	// that do not fit, Examples the first few (event id and reason).
	Rows       int              `json:"rows"`
	Violations int              `json:"violations"`
	Examples   []ViolationQuote `json:"examples,omitempty"`
	// Tombstones (NULL payloads) are not checked, as the connector does not.
	Tombstones int `json:"tombstones,omitempty"`
	// Unroutable counts rows the router dead-letters before any contract
	// (Problem says why): the connector never checks them.
	Unroutable int    `json:"unroutable,omitempty"`
	Problem    string `json:"problem,omitempty"`
	Failed     bool   `json:"failed"`

	// noSubject: the registry has no subject for the type; unusable: the
	// subject's schema cannot be used (it does not compile here).
	noSubject, unusable bool
}

// ViolationQuote is one row that does not fit.
type ViolationQuote struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// typeKey names a TypeCheck.
type typeKey struct{ table, eventType, topic string }

// checkTally gathers the rows' answers into a report. Pure: the command
// feeds it rows, the tests feed it answers.
type checkTally struct {
	unknownPass bool
	types       map[typeKey]*TypeCheck
}

func newCheckTally(unknownType string) *checkTally {
	return &checkTally{unknownPass: unknownType == config.ContractsPass, types: map[typeKey]*TypeCheck{}}
}

func (t *checkTally) entry(k typeKey) *TypeCheck {
	tc := t.types[k]
	if tc == nil {
		tc = &TypeCheck{Table: k.table, EventType: k.eventType, Topic: k.topic}
		t.types[k] = tc
	}
	return tc
}

// settled reports whether k's subject is known to be missing or unusable:
// its other rows need not be asked about.
func (t *checkTally) settled(k typeKey) bool {
	tc := t.types[k]
	return tc != nil && (tc.noSubject || tc.unusable)
}

// add records one row's answer: err is Apply's (nil, a *Violation, a
// *RegistryError).
func (t *checkTally) add(k typeKey, subject, id string, res contracts.Result, err error) {
	tc := t.entry(k)
	tc.Subject = subject
	var v *contracts.Violation
	var re *contracts.RegistryError
	switch {
	case err == nil:
		tc.Registered, tc.Version, tc.ID = true, res.Schema.Version, res.Schema.ID
		tc.Rows++
	case errors.As(err, &v):
		tc.Registered, tc.Version, tc.ID = true, v.Schema.Version, v.Schema.ID
		tc.Rows++
		tc.Violations++
		if len(tc.Examples) < maxExamples {
			tc.Examples = append(tc.Examples, ViolationQuote{ID: id, Reason: violationReason(v)})
		}
	case errors.Is(err, contracts.ErrNoSubject):
		tc.noSubject = true
		tc.Problem = "no schema is registered under the subject"
		if tc.Subject == "" {
			tc.Problem = "the event has no event_type, so it has no subject under this subject_strategy"
		}
		if t.unknownPass {
			tc.Problem += " (contracts.unknown_type pass: published unchecked)"
		}
	case errors.As(err, &re):
		tc.unusable, tc.Problem = true, re.Error()
	default:
		tc.unusable, tc.Problem = true, err.Error()
	}
}

func violationReason(v *contracts.Violation) string {
	at := cmp.Or(v.Pointer, "(root)")
	s := "at " + at + ": " + v.Reason
	if v.More > 0 {
		s += fmt.Sprintf(" and %d more", v.More)
	}
	return s
}

// report is the tally's report, sorted, each type judged: a violation, a
// missing subject (unless unknown_type is pass) or a schema that cannot
// be used fails. Rows the router dead-letters, and tombstones, are
// reported, not judged: no contract applies to them.
func (t *checkTally) report(rep *ContractsCheckReport) {
	for _, tc := range t.types {
		tc.Failed = tc.Violations > 0 || (tc.noSubject && !t.unknownPass) || tc.unusable
		if tc.Failed {
			rep.Failures++
		}
		rep.Types = append(rep.Types, *tc)
	}
	slices.SortFunc(rep.Types, func(a, b TypeCheck) int {
		return cmp.Or(strings.Compare(a.Table, b.Table), strings.Compare(a.EventType, b.EventType), strings.Compare(a.Topic, b.Topic))
	})
}

func (o *contractsCheckCmd) run(ctx context.Context, e env) int {
	if contractsOff(e, "check") {
		return ExitUsage
	}
	// Validate whatever contracts.mode is: the question is whether the
	// rows fit, and encoding them would only cost.
	ct, err := newContracts(e.cfg.Contracts, contracts.ModeValidate)
	if err != nil {
		fmt.Fprintf(e.stderr, "outbox-cdc contracts check: %v\n", err)
		return ExitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, contractsTimeout)
	defer cancel()
	c := e.cfg.Contracts
	rep := &ContractsCheckReport{Registry: c.Registry.URL, Strategy: c.SubjectStrategy, UnknownType: c.UnknownType, Sample: o.sample}
	tally := newCheckTally(c.UnknownType)
	if err := o.sampleRows(ctx, e.pc, ct, contracts.Strategy(c.SubjectStrategy), tally); err != nil {
		fmt.Fprintf(e.stderr, "outbox-cdc contracts check: %v\n", err)
		return ExitFailure
	}
	tally.report(rep)
	if o.json {
		printJSON(e.stdout, rep)
	} else {
		printContractsCheck(e.stdout, rep)
	}
	if rep.Failures > 0 {
		return ExitFailure
	}
	return ExitOK
}

// sampleRows routes and checks the sampled rows of every outbox table. An
// unreachable registry ends the check: it cannot say anything then.
func (o *contractsCheckCmd) sampleRows(ctx context.Context, pc pipeline.Config, ct *contracts.Contracts,
	strategy contracts.Strategy, tally *checkTally) error {
	tables := append([]pipeline.Table{{Mapping: pc.Mapping, Routes: pc.Routes}}, pc.More...)
	srcs := pc.Source.Tables()
	var specs []replication.RowSpec
	routers := make([]*router.Router, len(tables))
	for i, t := range tables {
		rt, err := router.New(t.Routes)
		if err != nil {
			return err
		}
		routers[i] = rt
		specs = append(specs, replication.RowSpec{Mapping: t.Mapping, OrderBy: pc.SnapshotOrderBy, Table: i})
	}
	rows, err := pc.Source.SampleRows(ctx, specs, o.sample)
	if err != nil {
		return err
	}
	defer rows.Close()
	var rec router.Record
	for rows.Next() {
		ev, err := rows.Event()
		if err != nil {
			return err
		}
		table := srcs[ev.Table].Schema + "." + srcs[ev.Table].Table
		if err := checkRow(ctx, routers[ev.Table], table, &ev, ct, strategy, tally, &rec); err != nil {
			return err
		}
	}
	return rows.Err()
}

// checkRow routes one row and checks its payload as the connector would.
func checkRow(ctx context.Context, rt *router.Router, table string, ev *decode.Event, ct *contracts.Contracts,
	strategy contracts.Strategy, tally *checkTally, rec *router.Record) error {
	eventType := string(ev.EventType.Bytes)
	if reason := rt.Route(ev, time.Now(), rec); reason != "" {
		tc := tally.entry(typeKey{table, eventType, ""})
		tc.Unroutable++
		tc.Problem = cmp.Or(tc.Problem, "dead-lettered by the router before any contract: "+reason)
		return nil
	}
	k := typeKey{table, eventType, rec.Topic}
	if ev.Payload.Null {
		tally.entry(k).Tombstones++
		return nil
	}
	if tally.settled(k) {
		return nil
	}
	subject, _ := strategy.Subject(rec.Topic, eventType)
	payload := ev.Payload.Bytes
	if payload == nil {
		payload = []byte{}
	}
	res, err := ct.Apply(ctx, rec.Topic, eventType, payload)
	if contracts.Retryable(err) || ctx.Err() != nil {
		return cmp.Or(ctx.Err(), err)
	}
	tally.add(k, subject, string(ev.ID.Bytes), res, err)
	return nil
}

func printContractsCheck(w io.Writer, r *ContractsCheckReport) {
	for _, tc := range r.Types {
		status := "ok"
		if tc.Failed {
			status = "FAIL"
		}
		et := cmp.Or(tc.EventType, "(NULL)")
		fmt.Fprintf(w, "%-4s %s %s", status, tc.Table, et)
		if tc.Topic != "" {
			fmt.Fprintf(w, " -> %s", tc.Topic)
		}
		fmt.Fprintln(w)
		switch {
		case tc.Registered:
			fmt.Fprintf(w, "     subject %s version %d (id %d): %d rows checked, %d violations\n", tc.Subject, tc.Version, tc.ID, tc.Rows, tc.Violations)
		case tc.Subject != "":
			fmt.Fprintf(w, "     subject %s: not registered\n", tc.Subject)
		}
		for _, ex := range tc.Examples {
			fmt.Fprintf(w, "     event %s: %s\n", ex.ID, ex.Reason)
		}
		if tc.Problem != "" {
			fmt.Fprintf(w, "     %s\n", tc.Problem)
		}
		if tc.Tombstones > 0 || tc.Unroutable > 0 {
			fmt.Fprintf(w, "     %d tombstones and %d unroutable rows not checked\n", tc.Tombstones, tc.Unroutable)
		}
	}
	fmt.Fprintf(w, "%d event types, %d failing (last %d rows of each; subject_strategy %s; registry %s)\n",
		len(r.Types), r.Failures, r.Sample, r.Strategy, r.Registry)
}
