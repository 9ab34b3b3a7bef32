package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/cli"
)

// verifyJSON is what the run's verify found: outbox-cdc verify over the
// whole run (the command the lost-slot runbook prints), after the last
// connector stopped.
type verifyJSON struct {
	Exit    int   `json:"exit"`
	Rows    int64 `json:"rows"`
	Found   int64 `json:"found"`
	Missing int64 `json:"missing"`
	// LostToRetention of Missing are rows ops-parking-retention's refused
	// redrive named as deleted from the parking topic: they are missing
	// from Kafka, accounted, and verify must say so (exit 1).
	LostToRetention int64   `json:"missing_lost_to_retention,omitempty"`
	Unnamed         string  `json:"missing_not_named_by_a_redrive,omitempty"`
	Seconds         float64 `json:"seconds"`
	Error           string  `json:"error,omitempty"`
}

// verifyObs is what the run's verify printed (runVerify).
type verifyObs struct {
	Exit         int      `json:"exit"`
	Error        string   `json:"error,omitempty"`
	Seconds      float64  `json:"seconds"`
	Rows         int64    `json:"rows"`
	Found        int64    `json:"found"`
	Missing      int64    `json:"missing"`
	MissingFirst []string `json:"missing_first,omitempty"`
	Stderr       string   `json:"stderr,omitempty"` // its last 4000 bytes
}

// runVerify runs `outbox-cdc verify --json` over the rows written since
// since, with the connector's configuration.
func (r *run) runVerify(ctx context.Context, since time.Time) *verifyObs {
	vctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	began := time.Now()
	cmd := exec.CommandContext(vctx, r.conn.bin, "verify", "--json", "--config", r.conn.cfgPath,
		"--since", since.Add(-time.Second).UTC().Format(time.RFC3339Nano))
	cmd.Env = cleanEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	v := &verifyObs{Seconds: round2(time.Since(began).Seconds())}
	var ee *exec.ExitError
	switch {
	case vctx.Err() != nil:
		v.Exit, v.Error = -1, "verify did not finish within 4m"
	case errors.As(err, &ee):
		v.Exit = ee.ExitCode()
	case err != nil:
		v.Exit, v.Error = -1, err.Error()
	}
	var rep cli.VerifyReport
	if v.Error == "" {
		if jerr := json.Unmarshal(out, &rep); jerr != nil {
			v.Error = "verify --json printed no report: " + jerr.Error()
		}
	}
	v.Rows, v.Found, v.Missing, v.MissingFirst = rep.Rows, rep.Found, rep.Missing.Count, rep.Missing.First
	v.Stderr = stderr.String()
	if len(v.Stderr) > 4000 {
		v.Stderr = v.Stderr[len(v.Stderr)-4000:]
	}
	return v
}

// repairedLost are the events lost to parking retention that the final
// read found republished (a verify --repair's copy: checkOrder).
func repairedLost(recs []copyRec, lost map[string]string) map[string]bool {
	out := map[string]bool{}
	for _, c := range recs {
		if lost[c.ID] != "" {
			out[c.ID] = true
		}
	}
	return out
}

// parkedAfter reports whether id was parked again after the copy a
// redrive's refusal named deleted (a higher offset: the parking topic has
// one partition). A copy parked before it (the same event parked twice by
// an at-least-once restart) was deleted with it (seed 4103247116706122709:
// copies at offsets 0 and 4, the log start moved to 7).
func (o *observation) parkedAfter(id string) bool {
	var named int64 = -1
	if _, err := fmt.Sscanf(o.Redrive.Lost[id], "partition 0 offset %d", &named); err != nil {
		return len(o.keptOf(o.ParkingTopic, id)) >= 2 // not the refusal's words: as before
	}
	for _, c := range o.keptOf(o.ParkingTopic, id) {
		if c.Offset > named {
			return true
		}
	}
	return false
}

// deadLettered reports whether the dead-letter topic holds a record of id.
func (o *observation) deadLettered(id string) bool {
	return slices.ContainsFunc(o.DeadLetters, func(c copyRec) bool { return c.ID == id })
}

// checkVerify: the run's verify must finish and find every row in Kafka
// but those a redrive named lost to parking retention.
func (o *observation) checkVerify(repairedLost map[string]bool, fail func(string, ...any)) *verifyJSON {
	ob := o.Verify
	if ob == nil {
		return nil
	}
	v := &verifyJSON{Exit: ob.Exit, Rows: ob.Rows, Found: ob.Found, Missing: ob.Missing, Seconds: ob.Seconds, Error: ob.Error}
	// An event lost to retention that a restore or a promotion undid
	// later has no row left to miss; one a later verify --repair (a
	// runbook's) republished is on its topic again; nor has one whose row
	// outbox retention deleted, once it was parked (checkRetention: after
	// the broker appended it).
	retDeleted := o.retentionDeleted()
	for id := range o.Redrive.Lost {
		// A gap repair (the table read back) may park it again: a second
		// parked copy, after the one retention deleted.
		// Or a verify --repair dead-lettered it again, by the quarantine
		// rules of its time (a lost event was parked, never dead-lettered,
		// before it was lost): verify finds it in the dead-letter topic.
		if !o.Undone[id] && !retDeleted[id] && len(o.keptOf(o.BigTopic, id)) == 0 && !repairedLost[id] &&
			!o.parkedAfter(id) && !o.deadLettered(id) {
			v.LostToRetention++
		}
	}
	for _, id := range ob.MissingFirst {
		if o.Redrive.Lost[id] == "" {
			v.Unnamed += id + " "
		}
	}
	wantExit := 0
	if v.LostToRetention > 0 {
		wantExit = 1 // something missing
	}
	if v.Error != "" || v.Exit != wantExit || v.Missing != v.LostToRetention || v.Unnamed != "" || v.Rows == 0 {
		fail("verify over the run: exit %d (want %d), %d rows, %d found, %d missing (%d lost to parking retention, named; not named: %s), %s\n%s",
			v.Exit, wantExit, v.Rows, v.Found, v.Missing, v.LostToRetention, v.Unnamed, v.Error, ob.Stderr)
	}
	return v
}
