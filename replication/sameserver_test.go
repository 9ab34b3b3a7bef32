package replication

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestSameServer: a reconnect on the same timeline resumes only on the same
// cluster, and on a primary only when its WAL reaches what it sent.
func TestSameServer(t *testing.T) {
	srv := Server{SystemID: "7", Timeline: 1, WALEnd: 0x5000000}
	for _, tt := range []struct {
		name     string
		systemID string
		start    lsn.LSN
		standby  bool
		want     string // in the problem; "" resumes
	}{
		{"the WAL went on", "7", 0x4000000, false, ""},
		{"exactly where it was sent to", "7", 0x5000000, false, ""},
		{"restored from an older copy", "7", 0x5000001, false, "restored from an older copy"},
		{"a standby catching up after a restart", "7", 0x6000000, true, ""},
		{"another cluster", "8", 0x4000000, false, "database system 7, but the connector streamed database system 8"},
		{"another cluster, a standby", "8", 0x4000000, true, "database system 7"},
		{"the first session", "", 0x4000000, false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := sameServer(tt.systemID, tt.start, srv, tt.standby)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var pe *fault.PrerequisiteError
			if !fault.IsFatal(err) || !errors.As(err, &pe) || !strings.Contains(pe.Problem, tt.want) {
				t.Fatalf("err = %v, want a fatal prerequisite error saying %q", err, tt.want)
			}
		})
	}
}
