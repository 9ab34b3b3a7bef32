package pipeline

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestRepairHold: the rows retention keeps after a lost slot start where
// the printed repair command starts, and at every row when the checkpoint
// records no commit time.
func TestRepairHold(t *testing.T) {
	at := time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		ckpt offsets.Checkpoint
		want time.Time
	}{
		{"commit time known", offsets.Checkpoint{LSN: 0x100, CommitTime: at, UpdatedAt: at.Add(time.Minute)}, at.Add(-repairMargin)},
		{"no commit time: every row", offsets.Checkpoint{LSN: 0x100, UpdatedAt: at}, time.Unix(0, 0).UTC()},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := repairHold(c.ckpt)
			if !got.Equal(c.want) {
				t.Fatalf("repairHold = %v, want %v", got, c.want)
			}
			p := &Pipeline{cfg: Config{ConfigPath: "c.yaml"}}
			if cmd := p.repairCommand(c.ckpt); !c.ckpt.CommitTime.IsZero() && !strings.Contains(cmd, "--since "+got.Format(time.RFC3339)) {
				t.Errorf("the repair command does not start at the hold %v: %s", got, cmd)
			}
		})
	}
}
