package pipeline

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// identified stamps this server's identity on every checkpoint it saves, so
// a later start can tell whether the position is one of its own. It is also
// the one writer of the checkpoint_lsn gauge: the position the store holds.
type identified struct {
	CheckpointStore
	id    offsets.Identity
	gauge prometheus.Gauge
}

func (s identified) Save(ctx context.Context, c offsets.Checkpoint) error {
	c.Identity = s.id
	err := s.CheckpointStore.Save(ctx, c)
	if err == nil {
		s.holds(c.LSN)
	}
	return err
}

func (s identified) Replace(ctx context.Context, c offsets.Checkpoint) error {
	c.Identity = s.id
	err := s.CheckpointStore.Replace(ctx, c)
	if err == nil {
		s.holds(c.LSN)
	}
	return err
}

// holds records the position the store holds: one loaded at start or saved.
func (s identified) holds(pos lsn.LSN) { s.gauge.Set(float64(pos)) }
