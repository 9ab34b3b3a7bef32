package replication

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestCheckpointTrust: which loaded checkpoints may decide what is skipped.
func TestCheckpointTrust(t *testing.T) {
	const forget = "DELETE FROM outbox_cdc.checkpoints WHERE slot = 'outbox_cdc'"
	srv := Server{SystemID: "7300000000000000001", Timeline: 3, WALEnd: 0x9000000, Database: "app",
		History: []TimelineSwitch{{Timeline: 1, End: 0x3000000}, {Timeline: 2, End: 0x5000000}}}
	own := offsets.Identity{SystemID: srv.SystemID, Timeline: 3, Database: "app", Slot: "outbox_cdc"}
	with := func(l lsn.LSN, f func(*offsets.Identity)) offsets.Checkpoint {
		id := own
		if f != nil {
			f(&id)
		}
		return offsets.Checkpoint{LSN: l, Identity: id}
	}
	tests := []struct {
		name string
		c    offsets.Checkpoint
		want []string // substrings of the refusal; none: trusted
	}{
		{"own", with(0x8000000, nil), nil},
		{"own, at the WAL end", with(0x9000000, nil), nil},
		{"another cluster", with(0x100, func(i *offsets.Identity) { i.SystemID = "6900000000000000009" }),
			[]string{"6900000000000000009", srv.SystemID}},
		{"another database", with(0x100, func(i *offsets.Identity) { i.Database = "billing" }), []string{"billing", "app"}},
		{"another slot", with(0x100, func(i *offsets.Identity) { i.Slot = "other" }), []string{"slot other", "postgres.slot is outbox_cdc"}},
		{"beyond the WAL end", with(0x9000001, nil), []string{"0/9000001", "WAL end 0/9000000"}},
		{"ancestor timeline, before its fork", with(0x2000000, func(i *offsets.Identity) { i.Timeline = 1 }), nil},
		{"ancestor timeline, at its fork", with(0x5000000, func(i *offsets.Identity) { i.Timeline = 2 }), nil},
		{"ancestor timeline, after its fork (PITR)", with(0x4000000, func(i *offsets.Identity) { i.Timeline = 1 }),
			[]string{"timeline 1", "0/3000000"}},
		{"timeline not in the history", with(0x100, func(i *offsets.Identity) { i.Timeline = 4 }), []string{"timeline 4", "timeline 3"}},
		{"older version, within the WAL", offsets.Checkpoint{LSN: 0x8000000}, nil},
		{"older version, beyond the WAL end", offsets.Checkpoint{LSN: 0xA000000}, []string{"WAL end"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ForeignCheckpoint(tt.c, srv, "outbox_cdc", forget)
			if err == nil {
				err = CheckPosition(tt.c, srv, forget)
			}
			if tt.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var pe *fault.PrerequisiteError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *fault.PrerequisiteError (exit 1)", err)
			}
			for _, w := range append(tt.want, forget, "outbox-cdc replay") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q lacks %q", err, w)
				}
			}
		})
	}
}
