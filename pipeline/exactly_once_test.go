package pipeline

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
)

// TestTrustCommitted: the position committed to Kafka gets the checkpoint's
// trust rule. The server is on timeline 3, which left timeline 1 at 0/3000000
// and timeline 2 at 0/5000000, and its WAL ends at 0/9000000.
func TestTrustCommitted(t *testing.T) {
	srv := replication.Server{SystemID: "7", Database: "app", Timeline: 3, WALEnd: 0x9000000,
		History: []replication.TimelineSwitch{{Timeline: 1, End: 0x3000000}, {Timeline: 2, End: 0x5000000}}}
	for _, tt := range []struct {
		name string
		pos  exactlyonce.Position
		want string // in the refusal; "" trusts it
	}{
		{"none committed yet", exactlyonce.Position{}, ""},
		{"on this timeline, within the WAL", exactlyonce.Position{LSN: 0x8000000, Timeline: 3}, ""},
		{"at the WAL end", exactlyonce.Position{LSN: 0x9000000, Timeline: 3}, ""},
		{"beyond the WAL end: a restore from an older copy", exactlyonce.Position{LSN: 0x9000001, Timeline: 3}, "beyond this server's WAL end 0/9000000"},
		{"an older version's record, within the WAL", exactlyonce.Position{LSN: 0x8000000}, ""},
		{"an older version's record, beyond the WAL", exactlyonce.Position{LSN: 0xA000000}, "beyond this server's WAL end"},
		{"an ancestor timeline, before its fork", exactlyonce.Position{LSN: 0x2000000, Timeline: 1}, ""},
		{"an ancestor timeline, at its fork", exactlyonce.Position{LSN: 0x5000000, Timeline: 2}, ""},
		{"an ancestor timeline, after its fork: a standby promoted behind it", exactlyonce.Position{LSN: 0x4000000, Timeline: 1},
			"timeline 1 after this server's history left it at 0/3000000"},
		{"a timeline not in the history", exactlyonce.Position{LSN: 0x1000000, Timeline: 4}, "not in the history of this server's timeline 3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := trustCommitted(tt.pos, srv, "positions", "7/app/slot", "k1:9092")
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var pe *fault.PrerequisiteError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a prerequisite error", err)
			}
			for _, s := range []string{tt.want, tt.pos.LSN.String(), "positions", "7/app/slot"} {
				if !strings.Contains(pe.Problem, s) {
					t.Errorf("problem %q lacks %q", pe.Problem, s)
				}
			}
			if !strings.Contains(pe.Fix, "tombstone") || !strings.Contains(pe.Fix, "7/app/slot|NULL") || !strings.Contains(pe.Fix, "--bootstrap-server k1:9092") {
				t.Errorf("fix %q does not say how to forget the position", pe.Fix)
			}
		})
	}
}
