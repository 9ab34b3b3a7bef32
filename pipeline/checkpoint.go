package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// identified stamps this server's identity on every checkpoint it saves, so
// a later start can tell whether the position is one of its own. It is also
// the one writer of the checkpoint_lsn gauge: the position the store holds.
type identified struct {
	CheckpointStore
	id       offsets.Identity
	timeline *atomic.Int32 // the stream's current timeline, 0 before it starts (id's then)
	gauge    prometheus.Gauge
	last     *lastCheckpoint
}

// stamp sets c's identity: the server's, on the timeline streamed now.
func (s identified) stamp(c *offsets.Checkpoint) {
	c.Identity = s.id
	if tli := s.timeline.Load(); tli != 0 {
		c.Timeline = tli
	}
}

// lastCheckpoint is the checkpoint the store holds, as far as this process
// knows: loaded at start or saved since.
type lastCheckpoint struct {
	mu sync.Mutex
	c  offsets.Checkpoint
	ok bool
}

func (l *lastCheckpoint) get() (offsets.Checkpoint, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c, l.ok
}

func (s identified) Save(ctx context.Context, c offsets.Checkpoint) error {
	s.stamp(&c)
	err := s.CheckpointStore.Save(ctx, c)
	if err == nil {
		s.holds(c)
	}
	return err
}

func (s identified) Replace(ctx context.Context, c offsets.Checkpoint) error {
	s.stamp(&c)
	err := s.CheckpointStore.Replace(ctx, c)
	if err == nil {
		s.holds(c)
	}
	return err
}

// holds records the checkpoint the store holds: one loaded at start or saved.
func (s identified) holds(c offsets.Checkpoint) {
	s.gauge.Set(float64(c.LSN))
	s.last.mu.Lock()
	s.last.c, s.last.ok = c, true
	s.last.mu.Unlock()
}

// commitTimes remembers when recent transactions committed, by end LSN, so
// that a checkpoint can say when its position was committed: the events a
// lost slot could not deliver were committed after that. A transaction
// committed less than coalesce after the last entry adds none (a lookup finds
// the earlier entry: still a lower bound), so the ring spans at least
// len(ring) × coalesce of history at any rate.
type commitTimes struct {
	mu   sync.Mutex
	ring [1024]commitTime
	n    int // entries written; the newest is ring[(n-1) % len]
}

type commitTime struct {
	end lsn.LSN
	at  time.Time
}

const coalesce = 10 * time.Millisecond

func (c *commitTimes) add(end lsn.LSN, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n > 0 {
		if last := c.ring[(c.n-1)%len(c.ring)]; at.Sub(last.at) < coalesce && end >= last.end {
			return // the last entry answers for this one too, a little early
		}
	}
	c.ring[c.n%len(c.ring)] = commitTime{end, at}
	c.n++
}

// before returns the commit time of the newest transaction ending at or
// below pos, if one is still remembered.
func (c *commitTimes) before(pos lsn.LSN) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := c.n - 1; i >= 0 && i >= c.n-len(c.ring); i-- {
		if e := c.ring[i%len(c.ring)]; e.end <= pos {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// repairMargin is how much earlier than the last delivered commit the
// printed verify starts: verify selects rows by created_at, which is when
// their transaction began, so a transaction open that long before its commit
// is still covered. An earlier start only costs verify time.
const repairMargin = 5 * time.Minute

// runbook adds to the fatal error for a lost slot (dropped or invalidated)
// what to run once a new slot exists: the events committed after the last
// checkpoint were not delivered and are in the outbox table only.
func (p *Pipeline) runbook(err error) error {
	var f *replication.FatalError
	if !errors.As(err, &f) || !slices.Contains([]string{"slot_missing", "slot_invalidated", "slot_or_publication_missing"}, f.Reason) {
		return err
	}
	last, ok := p.lastCkpt.get()
	if !ok {
		return err
	}
	return &replication.FatalError{Reason: f.Reason, Err: fmt.Errorf("%w\n%s", err, p.repairCommand(last))}
}

// repairCommand says how to republish what was committed after c.
func (p *Pipeline) repairCommand(c offsets.Checkpoint) string {
	cfg := p.cfg.ConfigPath
	if cfg == "" {
		cfg = "<config file>"
	}
	if c.CommitTime.IsZero() {
		return fmt.Sprintf("the last checkpoint (%v, saved %s) records no commit time: after the connector created a new slot, run "+
			"outbox-cdc verify --config %s --repair --since <a time before the first event you may miss, earlier than %s>",
			c.LSN, c.UpdatedAt.UTC().Format(time.RFC3339), cfg, c.UpdatedAt.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("the last delivered transaction (checkpoint %v) committed at %s; events committed after it may be missing "+
		"from Kafka. Once the connector runs again (it creates a new slot), republish them with:\n  outbox-cdc verify --config %s --repair --since %s",
		c.LSN, c.CommitTime.UTC().Format(time.RFC3339Nano), cfg, c.CommitTime.Add(-repairMargin).UTC().Format(time.RFC3339))
}
