package cli

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/internal/tracing"
)

// traceFlushTimeout bounds the export of the spans still queued at stop.
const traceFlushTimeout = 5 * time.Second

// headerColumns are the columns the decoder delivers as headers: the
// configured ones, then the trace column, which the router turns into
// traceparent and tracestate.
func headerColumns(o config.Outbox) []string {
	if o.TraceColumn == "" {
		return o.HeaderColumns
	}
	return append(slices.Clip(o.HeaderColumns), o.TraceColumn)
}

// startTracing starts the span exporter when otel.endpoint is set; stop
// flushes it (bounded). Both are nil when it is not.
func startTracing(ctx context.Context, o config.OTel, m *metrics.Metrics, log *slog.Logger) (p *tracing.Provider, stop func(), err error) {
	if o.Endpoint == "" {
		return nil, nil, nil
	}
	p, err = tracing.New(ctx, tracing.Config{Endpoint: o.Endpoint, Version: Version, Dropped: m.TraceSpansDropped}, log)
	if err != nil {
		return nil, nil, err
	}
	log.Info("exporting a span per event", "otel.endpoint", o.Endpoint)
	return p, func() {
		if err := p.Shutdown(traceFlushTimeout); err != nil {
			log.Warn("otel: spans not flushed at stop", "err", err)
		}
	}, nil
}
