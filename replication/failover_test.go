package replication

import (
	"slices"
	"strings"
	"testing"
)

func TestParseSlotList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"sb1", []string{"sb1"}},
		{"sb1, sb2", []string{"sb1", "sb2"}},
		{" SB1 ,,sb2 ", []string{"sb1", "sb2"}},
		{`"Mixed", "a""b"`, []string{"Mixed", `a"b`}},
		{"*", []string{"*"}},
	} {
		if got := parseSlotList(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("parseSlotList(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestFailoverState: ready needs 17, a failover slot and an active standby
// slot the primary waits for; each missing piece names its fix.
func TestFailoverState(t *testing.T) {
	ready := FailoverState{Major: 17, Version: "17.6", SlotFailover: true, StandbySlots: []string{"sb"}, Active: []string{"sb"}}
	for _, tc := range []struct {
		name    string
		f       func(*FailoverState)
		ready   bool
		problem string // substring of the problem; "" when ready
		fix     string
	}{
		{"ready", func(*FailoverState) {}, true, "", ""},
		{"server 16", func(f *FailoverState) { f.Major, f.Version = 16, "16.10" }, false, "need PostgreSQL 17", "upgrade"},
		{"not a failover slot", func(f *FailoverState) { f.SlotFailover = false }, false, "not a failover slot", "ALTER_REPLICATION_SLOT \"s\" (FAILOVER true)"},
		{"no standby slots", func(f *FailoverState) { f.StandbySlots, f.Active = nil, nil }, false, "synchronized_standby_slots is empty", "ALTER SYSTEM SET synchronized_standby_slots"},
		{"standby down", func(f *FailoverState) { f.Active = nil }, false, "no standby streams", "start the standby"},
	} {
		f := ready
		tc.f(&f)
		if f.Ready() != tc.ready {
			t.Errorf("%s: Ready() = %v, want %v", tc.name, f.Ready(), tc.ready)
		}
		problem, fix := f.Problem("s")
		if (problem == "") != tc.ready || !strings.Contains(problem, tc.problem) || !strings.Contains(fix, tc.fix) {
			t.Errorf("%s: Problem() = %q, %q; want %q, %q", tc.name, problem, fix, tc.problem, tc.fix)
		}
	}
}
