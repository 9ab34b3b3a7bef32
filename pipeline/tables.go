package pipeline

import (
	"context"
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// Table is one outbox table after the first (outbox.tables): how its rows
// are mapped and routed. Its name and mapped columns are in
// Source.Others, in the same order.
type Table struct {
	Mapping decode.Mapping
	Routes  router.Config
}

// mappings are the decoder's mappings, the first table's first, with the
// OIDs resolved at start (none in replay: matched by name).
func mappings(cfg Config, relIDs []uint32) []decode.Mapping {
	ms := []decode.Mapping{cfg.Mapping}
	for _, t := range cfg.More {
		ms = append(ms, t.Mapping)
	}
	for i := range ms {
		if i < len(relIDs) {
			ms[i].RelationID = relIDs[i]
		}
	}
	return ms
}

// rowSpecs are what table reads (snapshot, backfill) return, one per table.
func rowSpecs(cfg Config) []replication.RowSpec {
	var specs []replication.RowSpec
	for i, m := range mappings(cfg, nil) {
		specs = append(specs, replication.RowSpec{Mapping: m, Filter: cfg.SnapshotFilter, OrderBy: cfg.SnapshotOrderBy, Table: i})
	}
	return specs
}

// tableMetrics resolves each table's per-event metrics, labelled
// schema.table.
func tableMetrics(cfg Config, m *metrics.Metrics) []metrics.TableEvents {
	var out []metrics.TableEvents
	for _, t := range append([]Table{{Mapping: cfg.Mapping}}, cfg.More...) {
		out = append(out, m.Table(t.Mapping.Schema+"."+t.Mapping.Table))
	}
	return out
}

// newRouters builds one router per table; every table's events share the
// dead-letter topic and the trace reporter.
func newRouters(cfg Config, onBadTrace func(*decode.Event, string)) ([]*router.Router, error) {
	routes := []router.Config{cfg.Routes}
	for _, t := range cfg.More {
		routes = append(routes, t.Routes)
	}
	var rs []*router.Router
	for i, rc := range routes {
		rc.OnBadTrace = onBadTrace
		r, err := router.New(rc)
		if err != nil {
			if i > 0 {
				err = fmt.Errorf("outbox table %d: %w", i, err)
			}
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// guards keeps every outbox table in the stream, one replication.Guard per
// table: a position is vouched for once every table's guard vouches for it.
type guards struct {
	gs   []*replication.Guard
	srcs []replication.Source
}

func newGuards(ctx context.Context, src replication.Source, from lsn.LSN) (*guards, error) {
	g := &guards{srcs: src.Tables()}
	for _, s := range g.srcs {
		one, err := replication.NewGuard(ctx, s, from)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.gs = append(g.gs, one)
	}
	return g, nil
}

// Verified is the highest position every table's readings vouch for.
func (g *guards) Verified() lsn.LSN {
	v := g.gs[0].Verified()
	for _, one := range g.gs[1:] {
		v = min(v, one.Verified())
	}
	return v
}

// Xmin bounds the rows the stream may have missed since Verified, in any table.
func (g *guards) Xmin() uint64 {
	x := g.gs[0].Xmin()
	for _, one := range g.gs[1:] {
		x = min(x, one.Xmin())
	}
	return x
}

// Check reads every table's membership once (replication.Guard.Check) and
// returns the first problem with the table it concerns.
func (g *guards) Check(ctx context.Context) (why string, gap bool, src replication.Source) {
	for i, one := range g.gs {
		if why, gap := one.Check(ctx); why != "" {
			return why, gap, g.srcs[i]
		}
	}
	return "", false, g.srcs[0]
}

// schemaFrom is, per table, the position from which a Relation message
// lacking a mapped column is a schema problem (replication.Guard.First).
func (g *guards) schemaFrom() []lsn.LSN {
	var out []lsn.LSN
	for _, one := range g.gs {
		out = append(out, one.First())
	}
	return out
}

// relIDs are the tables' OIDs at start.
func (g *guards) relIDs() []uint32 {
	var out []uint32
	for _, one := range g.gs {
		out = append(out, one.RelID())
	}
	return out
}

// Close releases the guards' connections.
func (g *guards) Close() {
	for _, one := range g.gs {
		one.Close()
	}
}
