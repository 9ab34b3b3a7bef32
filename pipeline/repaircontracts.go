package pipeline

import (
	"context"
	"log/slog"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// RepairContracts is the contract check verify --repair applies to each row
// it republishes: the processor's own (contractGate), so a row gets the
// same verdict, value and headers as the event had from the stream (the
// same (subject, version) yields the same id and bytes). Nil when
// contracts are off; a nil one checks nothing.
type RepairContracts struct{ g *contractGate }

// NewRepairContracts returns cfg's contract check for verify --repair, nil
// when contracts are off.
func NewRepairContracts(cfg Config, log *slog.Logger) *RepairContracts {
	g := newContractGate(cfg.Contracts, metrics.New(), log)
	if g == nil {
		return nil
	}
	return &RepairContracts{g: g}
}

// Check applies the contracts to rec, which r routed from ev (at stands in
// for the commit time): rec is left to publish (framed in encode mode) or
// dead-lettered with the contract's headers, as the stream does. An error
// is a row not to republish: contracts.on_violation or unknown_type fail
// (its text has the subject, the version and the reason), or ctx's end
// while the row waits for the schema registry.
func (c *RepairContracts) Check(ctx context.Context, r *router.Router, ev *decode.Event, at time.Time, rec *router.Record) error {
	if c == nil {
		return nil
	}
	_, err := c.g.check(ctx, r, ev, at, rec)
	return err
}
