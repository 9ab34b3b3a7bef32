package offsets

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Store saves checkpoints durably: FileStore here, the table store beside
// the other SQL in replication.
type Store interface {
	Load(ctx context.Context) (Checkpoint, error)
	// Save stores c unless a later position of the same identity is stored
	// (ErrStale): another connector on the slot saved it.
	Save(ctx context.Context, c Checkpoint) error
	// Replace stores c whatever is stored: a new slot or snapshot starts over.
	Replace(ctx context.Context, c Checkpoint) error
	// ClearRepair removes the repair hold (Checkpoint.RepairSince) if a
	// repair from since covered it, and reports whether it did.
	ClearRepair(ctx context.Context, since time.Time) (bool, error)
	// Forget tells an operator how to drop the checkpoint (SQL, or a file).
	Forget() string
	Close()
}

// Stamped stamps the server's identity on every checkpoint saved through
// it, so a later start can tell whether the position is one of its own, and
// remembers the checkpoint the store holds (loaded at start or saved since).
type Stamped struct {
	Store
	id Identity
	// Timeline is the stream's current timeline, 0 before it starts (the
	// identity's then): a connector that followed a promotion saves
	// positions of the new timeline, and a restart must not take them for
	// the old one's.
	Timeline atomic.Int32
	onHeld   func(Checkpoint)

	mu   sync.Mutex
	held Checkpoint
	ok   bool
}

// NewStamped wraps s; onHeld (may be nil) is told each checkpoint the store
// holds from then on.
func NewStamped(s Store, id Identity, onHeld func(Checkpoint)) *Stamped {
	return &Stamped{Store: s, id: id, onHeld: onHeld}
}

func (s *Stamped) Save(ctx context.Context, c Checkpoint) error {
	return s.write(ctx, c, s.Store.Save)
}

func (s *Stamped) Replace(ctx context.Context, c Checkpoint) error {
	return s.write(ctx, c, s.Store.Replace)
}

// write stamps c with the identity, on the timeline streamed now, and
// stores it with store.
func (s *Stamped) write(ctx context.Context, c Checkpoint, store func(context.Context, Checkpoint) error) error {
	c.Identity = s.id
	if tli := s.Timeline.Load(); tli != 0 {
		c.Timeline = tli
	}
	err := store(ctx, c)
	if err == nil {
		s.Holds(c)
	}
	return err
}

// Holds records c as the checkpoint the store holds: one loaded at start,
// or saved.
func (s *Stamped) Holds(c Checkpoint) {
	if s.onHeld != nil {
		s.onHeld(c)
	}
	s.mu.Lock()
	s.held, s.ok = c, true
	s.mu.Unlock()
}

// Held returns the checkpoint the store holds, as far as this process knows.
func (s *Stamped) Held() (Checkpoint, bool) {
	if s == nil {
		return Checkpoint{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held, s.ok
}

// CommitTimes remembers when recent transactions committed, by end LSN, so
// that a checkpoint can say when its position was committed: the events a
// lost slot could not deliver were committed after that. A transaction
// committed less than coalesce after the last entry adds none (a lookup finds
// the earlier entry: still a lower bound), so the ring spans at least
// len(ring) × coalesce of history at any rate.
type CommitTimes struct {
	mu   sync.Mutex
	ring [1024]commitTime
	n    int // entries written; the newest is ring[(n-1) % len]
}

type commitTime struct {
	end lsn.LSN
	at  time.Time
}

const coalesce = 10 * time.Millisecond

// Add records that the transaction ending at end committed at at.
func (c *CommitTimes) Add(end lsn.LSN, at time.Time) {
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

// Before returns the commit time of the newest transaction ending at or
// below pos, if one is still remembered.
func (c *CommitTimes) Before(pos lsn.LSN) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := c.n - 1; i >= 0 && i >= c.n-len(c.ring); i-- {
		if e := c.ring[i%len(c.ring)]; e.end <= pos {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// After returns the commit time of the oldest remembered transaction ending
// above pos: when the oldest transaction not acknowledged at pos committed,
// up to coalesce late (one folded into the entry at or below pos is not
// seen until a later entry). false when none is remembered.
func (c *CommitTimes) After(pos lsn.LSN) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var at time.Time
	found := false
	for i := c.n - 1; i >= 0 && i >= c.n-len(c.ring); i-- {
		e := c.ring[i%len(c.ring)]
		if e.end <= pos {
			break
		}
		at, found = e.at, true
	}
	return at, found
}
