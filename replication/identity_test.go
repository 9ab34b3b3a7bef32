package replication

import (
	"slices"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

func TestParseHistory(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    []TimelineSwitch
		bad     bool
	}{
		{name: "empty", content: ""},
		{name: "one promotion", content: "1\t0/3000158\tno recovery target specified\n",
			want: []TimelineSwitch{{1, 0x3000158}}},
		{name: "two, with comments and blank lines",
			content: "# comment\n1\t0/3000158\tno recovery target specified\n\n2\t1/A0\tbefore 2026-01-01 00:00:00+00 # PITR\n",
			want:    []TimelineSwitch{{1, 0x3000158}, {2, 0x1000000A0}}},
		{name: "missing switch point", content: "1\n", bad: true},
		{name: "bad timeline", content: "x\t0/1\n", bad: true},
		{name: "bad lsn", content: "1\t0-1\n", bad: true},
		{name: "timelines go back", content: "2\t0/10\n1\t0/20\n", bad: true},
		{name: "switch points go back", content: "1\t0/20\n2\t0/10\n", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseHistory([]byte(tt.content))
			if (err != nil) != tt.bad {
				t.Fatalf("err = %v, want bad=%v", err, tt.bad)
			}
			if !tt.bad && !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestForkPoint(t *testing.T) {
	s := Server{Timeline: 3, History: []TimelineSwitch{{1, 0x3000000}, {2, 0x5000000}}}
	tests := []struct {
		tli  int32
		want lsn.LSN
		ok   bool
	}{
		{1, 0x3000000, true},
		{2, 0x5000000, true},
		{3, 0, false}, // the current timeline is not an ancestor of itself
		{4, 0, false}, // a sibling or a later timeline
	}
	for _, tt := range tests {
		if at, ok := s.ForkPoint(tt.tli); at != tt.want || ok != tt.ok {
			t.Errorf("ForkPoint(%d) = %v, %v; want %v, %v", tt.tli, at, ok, tt.want, tt.ok)
		}
	}
}
