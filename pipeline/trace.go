package pipeline

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// Tracer gives an event the connector's span. Start runs on the processor
// when the record is ready (after routing, before Produce): the span begins
// at the commit time, its parent is the record's traceparent header, and it
// rewrites the traceparent and tracestate headers to name itself, so the
// consumer's span is its child. The returned func ends the span with the
// record's outcome, on a client goroutine; it must not block.
type Tracer interface {
	Start(commit time.Time, rec *router.Record) (end func(sink.Outcome))
}

// badTraceEvery bounds the log of malformed trace contexts: one bad writer
// would otherwise log every event.
const badTraceEvery = time.Minute

// badTraceReporter counts an event whose trace column held no valid
// traceparent and logs one such event per badTraceEvery.
func badTraceReporter(m *metrics.Metrics, log *slog.Logger) func(*decode.Event, string) {
	var last atomic.Int64 // unix nanoseconds of the last log line
	return func(ev *decode.Event, problem string) {
		m.TraceContextInvalid.Inc()
		now := time.Now().UnixNano()
		if prev := last.Load(); now-prev >= int64(badTraceEvery) && last.CompareAndSwap(prev, now) {
			log.Warn("trace column without a valid W3C traceparent; event published without trace headers (logged once a minute, counted in outbox_cdc_trace_context_invalid_total)",
				"id", string(ev.ID.Bytes), "problem", problem)
		}
	}
}
