package chaos

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// cleanObservation is a small run with nothing wrong: aggregate "a", seq
// 1..4 committed every 10ms (post-commit LSNs 100..400), each in the table
// and appended once, 5ms after its commit, by process #1 (producer 7).
func cleanObservation() *observation {
	t0 := time.Now().Truncate(time.Second)
	o := &observation{Mode: shortMode.Name, Prefix: "p", DLQ: "p-dlq", BigTopic: "p.big", ParkingTopic: "p-parking",
		FlowStart: t0, End: t0.Add(time.Second), Table: map[string]tableRow{}, Seen: map[string]time.Time{},
		Incarnations: []*incarnation{{N: 1, Reason: "initial", Start: t0.Add(-time.Second)}}}
	for i := 1; i <= 4; i++ {
		e := event{ID: fmt.Sprintf("e%d", i), Agg: "a", Type: "order", Seq: i, Writer: 1, Txn: int64(i),
			PostLSN: lsn.LSN(100 * i), Committed: t0.Add(time.Duration(i) * 10 * time.Millisecond)}
		o.Events = append(o.Events, e)
		o.Table[e.ID] = tableRow{Agg: e.Agg, Seq: e.Seq}
		o.Records = append(o.Records, copyRec{Topic: "p.order", Key: e.Agg, ID: e.ID, Seq: e.Seq, Producer: 7,
			Offset: int64(i - 1), Append: e.Committed.Add(5 * time.Millisecond).Truncate(time.Millisecond), LogAppend: true})
		o.Seen[e.ID] = e.Committed.Add(20 * time.Millisecond)
	}
	return o
}

// TestCheckVerdicts: check, given only an observation, passes a clean run
// and finds a lost event, a duplicate of a confirmed event and an order
// break; a saved observation checks the same once loaded.
func TestCheckVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spoil func(o *observation)
		want  string // in a failure; "" passes
	}{
		{"clean", func(*observation) {}, ""},
		{"a lost event", func(o *observation) { o.Records = o.Records[:3] }, "1 committed events are not in Kafka; first: e4"},
		{"a duplicate of a confirmed event", func(o *observation) {
			// Process #2 started after the slot confirmed 400 and sent e2 again.
			start := o.Records[3].Append.Add(time.Second)
			o.Incarnations = append(o.Incarnations, &incarnation{N: 2, Reason: "after-kill", Start: start, SlotAtStart: 400})
			dup := o.Records[1]
			dup.Producer, dup.Offset, dup.Append = 8, 4, start.Add(10*time.Millisecond)
			o.Records = append(o.Records, dup)
		}, "duplicates of confirmed events: 1 at or below the slot's position"},
		{"an order break", func(o *observation) {
			o.Records[1].Offset, o.Records[2].Offset = 2, 1
			o.Records[1], o.Records[2] = o.Records[2], o.Records[1]
		}, "order violations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := cleanObservation()
			tc.spoil(o)
			v := o.check()
			if got := verdictOf(v); !verdictHas(got, tc.want) {
				t.Fatalf("pass %v, failures %q; want %q", v.Report.Pass, v.Report.Failures, tc.want)
			}
			path := filepath.Join(t.TempDir(), observationFile)
			if err := o.save(path); err != nil {
				t.Fatal(err)
			}
			loaded, err := loadObservation(path)
			if err != nil {
				t.Fatal(err)
			}
			if again := verdictOf(loaded.check()); !slices.Equal(again, verdictOf(o.check())) {
				t.Fatalf("loaded: %q, in memory: %q", again, verdictOf(o.check()))
			}
		})
	}
}

// verdictOf is a check's failures, or "pass".
func verdictOf(v checked) []string {
	if v.Report.Pass && len(v.Errors) == 0 {
		return []string{"pass"}
	}
	return v.Report.Failures
}

func verdictHas(got []string, want string) bool {
	if want == "" {
		return slices.Equal(got, []string{"pass"})
	}
	return slices.ContainsFunc(got, func(f string) bool { return strings.Contains(f, want) })
}
