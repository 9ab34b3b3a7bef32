package pipeline

import (
	"context"

	"github.com/outbox-cdc/outbox-cdc/offsets"
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
