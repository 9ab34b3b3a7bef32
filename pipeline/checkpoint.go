package pipeline

import (
	"context"
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// identified stamps this server's identity on every checkpoint it saves, so
// a later start can tell whether the position is one of its own.
type identified struct {
	CheckpointStore
	id offsets.Identity
}

func (s identified) Save(ctx context.Context, c offsets.Checkpoint) error {
	c.Identity = s.id
	return s.CheckpointStore.Save(ctx, c)
}

func (s identified) Replace(ctx context.Context, c offsets.Checkpoint) error {
	c.Identity = s.id
	return s.CheckpointStore.Replace(ctx, c)
}

// foreignCheckpoint refuses a checkpoint written for another cluster,
// database or slot: its LSN is no position of this stream, and trusting it
// would skip (and confirm) transactions below it. A checkpoint without
// identity (an older version) passes; checkPosition still applies.
func foreignCheckpoint(c offsets.Checkpoint, srv replication.Server, slot, forget string) error {
	switch {
	case c.IsZero():
		return nil
	case c.SystemID != srv.SystemID:
		return refuseCheckpoint(c, fmt.Sprintf("was written for database system %s, but this server is database system %s "+
			"(another cluster, or a checkpoint copied from another deployment)", c.SystemID, srv.SystemID), forget)
	case c.Database != srv.Database:
		return refuseCheckpoint(c, fmt.Sprintf("was written for database %s, but the connector streams database %s",
			c.Database, srv.Database), forget)
	case c.Slot != slot:
		return refuseCheckpoint(c, fmt.Sprintf("was written for slot %s, but postgres.slot is %s", c.Slot, slot), forget)
	}
	return nil
}

// checkPosition refuses a checkpoint whose LSN is not a position of this
// server's WAL history: beyond its WAL end, or on a timeline that left the
// current timeline's history before the checkpoint (a restore to an earlier
// point in time forks a new timeline there; PG docs 26.3.5, "Timelines").
func checkPosition(c offsets.Checkpoint, srv replication.Server, forget string) error {
	if c.LSN > srv.WALEnd {
		return refuseCheckpoint(c, fmt.Sprintf("lies beyond this server's WAL end %v (it was written by another server, "+
			"or before this one was restored from an older backup)", srv.WALEnd), forget)
	}
	if c.IsZero() || c.Timeline == srv.Timeline {
		return nil
	}
	fork, ok := srv.ForkPoint(c.Timeline)
	if !ok {
		return refuseCheckpoint(c, fmt.Sprintf("was written on timeline %d, which is not in the history of this server's timeline %d",
			c.Timeline, srv.Timeline), forget)
	}
	if c.LSN > fork {
		return refuseCheckpoint(c, fmt.Sprintf("was written on timeline %d after this server's history left it at %v "+
			"(a restore to an earlier point in time): this server never had that WAL", c.Timeline, fork), forget)
	}
	return nil
}

func refuseCheckpoint(c offsets.Checkpoint, why, forget string) error {
	return &replication.PrerequisiteError{
		Problem: fmt.Sprintf("checkpoint %v %s", c.LSN, why),
		Fix: "if it does not belong to this slot, drop it and start again, which streams from the slot's confirmed position: " +
			forget + "; to publish a range of events again, use outbox-cdc replay (docs/operations.md)",
	}
}
