package replication

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
)

// TestStandbyProblems: what a server in recovery must have before the
// connector decodes on it, each missing piece reported, all at once.
func TestStandbyProblems(t *testing.T) {
	ready := standbyFacts{Recovery: true, Major: 16, Version: "16.4", HotStandbyFeedback: true, PrimarySlot: "standby1",
		Primary: true, TableStore: true, Failover: FailoverAuto}
	tests := []struct {
		name  string
		facts func(f *standbyFacts)
		want  []string // one substring per expected problem, in order
	}{
		{"ready", func(*standbyFacts) {}, nil},
		{"primary, anything goes", func(f *standbyFacts) {
			*f = standbyFacts{Major: 13, TableStore: true, Failover: FailoverOn}
		}, nil},
		{"below 16", func(f *standbyFacts) { f.Major, f.Version = 15, "15.8" },
			[]string{"PostgreSQL 15.8; logical decoding on a standby needs 16"}},
		{"below 16 says only that", func(f *standbyFacts) { f.Major, f.HotStandbyFeedback, f.PrimarySlot = 15, false, "" },
			[]string{"needs 16"}},
		{"no feedback", func(f *standbyFacts) { f.HotStandbyFeedback = false }, []string{"hot_standby_feedback is off"}},
		{"no primary slot", func(f *standbyFacts) { f.PrimarySlot = "" }, []string{"primary_slot_name is not set"}},
		{"both settings", func(f *standbyFacts) { f.HotStandbyFeedback, f.PrimarySlot = false, "" },
			[]string{"hot_standby_feedback", "primary_slot_name"}},
		{"table store without primary", func(f *standbyFacts) { f.Primary = false }, []string{"checkpoint.store is table"}},
		{"file store without primary", func(f *standbyFacts) { f.Primary, f.TableStore = false, false }, nil},
		{"failover on", func(f *standbyFacts) { f.Failover = FailoverOn }, []string{"failover slots are created on a primary"}},
		{"every problem", func(f *standbyFacts) {
			f.HotStandbyFeedback, f.PrimarySlot, f.Primary, f.Failover = false, "", false, FailoverOn
		}, []string{"hot_standby_feedback", "primary_slot_name", "checkpoint.store", "failover"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := ready
			tt.facts(&f)
			got := f.problems()
			if len(got) != len(tt.want) {
				t.Fatalf("%d problems %v, want %d (%q)", len(got), got, len(tt.want), tt.want)
			}
			for i, p := range got {
				if !strings.Contains(p.Problem, tt.want[i]) {
					t.Errorf("problem %d %q does not contain %q", i, p.Problem, tt.want[i])
				}
				if p.Fix == "" {
					t.Errorf("problem %q has no fix", p.Problem)
				}
			}
		})
	}
}

// TestStandbySlotError: the server's refusal to decode on a standby whose
// primary lacks wal_level logical is a prerequisite, other errors pass.
func TestStandbySlotError(t *testing.T) {
	refused := fmt.Errorf("create replication slot s: %w", &pgconn.PgError{Code: "55000",
		Message: "logical decoding on standby requires wal_level >= logical on the primary"})
	var pe *fault.PrerequisiteError
	if err := standbySlotError("s", refused); !errors.As(err, &pe) || !strings.Contains(pe.Fix, "wal_level = logical on the primary") {
		t.Errorf("refusal mapped to %v", err)
	}
	other := errors.New("connection reset")
	if err := standbySlotError("s", other); err != other {
		t.Errorf("other error mapped to %v", err)
	}
	if err := standbySlotError("s", nil); err != nil {
		t.Errorf("nil mapped to %v", err)
	}
}

// TestWALPositionOnStandby: every reading of the WAL position goes through
// walPosition, which a standby can evaluate.
func TestWALPositionOnStandby(t *testing.T) {
	for _, q := range []string{walPosition, serverTimeline} {
		if !strings.Contains(q, "pg_last_wal_replay_lsn()") {
			t.Errorf("%q does not read the replay position on a standby", q)
		}
	}
}
