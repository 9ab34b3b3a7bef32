package replication

import (
	"context"
	"sync/atomic"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Guard keeps the outbox in the stream. PostgreSQL decodes an insert only if
// the table was in the publication when the insert was written, so an outbox
// dropped, renamed or removed from the publication stops producing events
// without any error in the stream. The guard reads the membership every
// interval and vouches for a position only once a later reading, which sees
// everything committed before it, still finds the table in place; nothing
// beyond that position is confirmed (gate), so a restart after the fix
// starts before the first insert that was not decoded.
type Guard struct {
	src   Source
	watch *Watch
	start Membership
	prev  Snapshot // the last good reading, vouched for by the next
	// first is the WAL position read before the first reading, which found
	// every mapped column: a Relation message of a transaction committed
	// before it describes the table as it was, not as it is.
	first lsn.LSN

	verified atomic.Uint64 // position up to which membership held
	xmin     atomic.Uint64 // snapshot xmin of the reading behind verified
}

// NewGuard takes the first reading; from is the start position, vouched for
// by the setup that checked the table.
func NewGuard(ctx context.Context, src Source, from lsn.LSN) (*Guard, error) {
	g := &Guard{src: src, watch: NewWatch(src)}
	s, err := g.watch.Read(ctx, 0)
	if err != nil {
		g.watch.Close()
		return nil, err
	}
	if why := s.LeftStream(src, s.Membership) + s.SchemaProblem(src); why != "" {
		g.watch.Close()
		return nil, &PrerequisiteError{Problem: why, Fix: "see docs/operations.md, \"The outbox leaving the stream\""}
	}
	g.start, g.prev, g.first = s.Membership, s, s.Before
	g.verified.Store(uint64(from))
	g.xmin.Store(s.Xmin)
	return g, nil
}

// Verified is the highest position the membership readings vouch for.
func (g *Guard) Verified() lsn.LSN { return lsn.LSN(g.verified.Load()) }

// Check reads the membership once. It returns why the outbox left the stream
// (gap: inserts are no longer decoded) or why its rows can no longer be
// mapped, or "" (also on a failed reading, which only holds the gate).
func (g *Guard) Check(ctx context.Context) (why string, gap bool) {
	s, err := g.watch.Read(ctx, g.start.RelID)
	if err != nil {
		return "", false
	}
	if why := s.LeftStream(g.src, g.start); why != "" {
		return why, true
	}
	if why := s.SchemaProblem(g.src); why != "" {
		return why, false
	}
	// The previous reading's position is vouched for now: this reading's
	// snapshot was taken a whole interval later, so it sees every commit
	// before that position, including one that was caught between its WAL
	// record and its visibility back then.
	if g.prev.Before > g.Verified() {
		g.xmin.Store(g.prev.Xmin)
		g.verified.Store(uint64(g.prev.Before))
	}
	g.prev = s
	return "", false
}

// Xmin is the snapshot xmin of the reading behind Verified: every row the
// stream may have missed since was written by a transaction at or above it.
func (g *Guard) Xmin() uint64 { return g.xmin.Load() }

// First is the WAL position read before the first reading, which found every
// mapped column.
func (g *Guard) First() lsn.LSN { return g.first }

// RelID is the outbox's OID at start.
func (g *Guard) RelID() uint32 { return g.start.RelID }

// Close releases the connection.
func (g *Guard) Close() { g.watch.Close() }
