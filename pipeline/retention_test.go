package pipeline

import (
	"log/slog"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/retention"
)

// TestRetentionState: the readings the rule gets from the pipeline: the
// owner while streaming, the gated watermark, a gap recorded or a repair
// pending, a snapshot not done.
func TestRetentionState(t *testing.T) {
	newP := func() *Pipeline {
		p := &Pipeline{plan: &plan{}, tracker: offsets.NewTracker(500), rep: newRepair(slog.New(slog.DiscardHandler))}
		p.ret = &retentionLoop{p: p}
		p.conn.up.Store(true)
		p.prog.snapDone.Store(true)
		return p
	}
	cases := []struct {
		name string
		set  func(*Pipeline)
		want retention.State
	}{
		{"streaming", func(*Pipeline) {}, retention.State{Owner: true, Acked: 500, HoldRead: true}},
		{"not streaming", func(p *Pipeline) { p.conn.up.Store(false) }, retention.State{Acked: 500, HoldRead: true}},
		{"gap recorded", func(p *Pipeline) { p.rep.found(gapInfo{Since: 100, Xmin: 7}) }, retention.State{Owner: true, Acked: 500, Gap: true, HoldRead: true}},
		{"repair pending", func(p *Pipeline) { p.rep.pending.Store(true) }, retention.State{Owner: true, Acked: 500, Gap: true, HoldRead: true}},
		{"snapshot pending", func(p *Pipeline) { p.prog.snapDone.Store(false) }, retention.State{Owner: true, Acked: 500, Snapshot: true, HoldRead: true}},
	}
	for _, c := range cases {
		p := newP()
		c.set(p)
		if got := p.ret.state(); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestUnackedAge(t *testing.T) {
	now := time.Unix(1_700_000_100, 0)
	var c offsets.CommitTimes
	if got := unackedAge(now, &c, 0); got != 0 {
		t.Errorf("nothing decoded: %v", got)
	}
	c.Add(100, now.Add(-30*time.Second))
	c.Add(200, now.Add(-10*time.Second))
	for _, tt := range []struct {
		acked lsn.LSN
		want  float64
	}{{50, 30}, {100, 10}, {200, 0}, {300, 0}} {
		if got := unackedAge(now, &c, tt.acked); got != tt.want {
			t.Errorf("acked %v: %v, want %v", tt.acked, got, tt.want)
		}
	}
}
