package pipeline

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestRunbook: a lost slot's error gains the repair command, starting
// repairMargin before the last delivered commit; other errors are kept.
func TestRunbook(t *testing.T) {
	commit := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p := &Pipeline{cfg: Config{ConfigPath: "/etc/outbox-cdc.yaml"}}
	lost := &fault.FatalError{Reason: "slot_invalidated", Err: errors.New("slot x was invalidated")}
	if got := p.runbook(lost); got != error(lost) {
		t.Fatalf("without a checkpoint: %v, want the error unchanged", got)
	}
	p.held = offsets.NewStamped(nil, offsets.Identity{}, nil)
	p.held.Holds(offsets.Checkpoint{LSN: 0x500, CommitTime: commit})
	got := p.runbook(fmt.Errorf("stream: %w", lost))
	want := "outbox-cdc verify --config /etc/outbox-cdc.yaml --repair --since 2026-11-30T11:55:00Z"
	var f *fault.FatalError
	if !strings.Contains(got.Error(), want) || !errors.As(got, &f) || f.Reason != "slot_invalidated" {
		t.Fatalf("runbook: %v\nwant it to contain %q and keep the reason", got, want)
	}
	other := &fault.FatalError{Reason: "schema_mismatch", Err: errors.New("column gone")}
	if got := p.runbook(other); got != error(other) {
		t.Fatalf("schema error changed: %v", got)
	}
	if got := p.runbook(nil); got != nil {
		t.Fatalf("nil became %v", got)
	}
}
