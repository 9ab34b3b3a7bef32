package outbox

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/propagation"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// traceText is the caller's W3C trace context in the form the connector's
// outbox.trace_column reads: the bare traceparent, or, with a tracestate,
// "traceparent=…\ntracestate=…" (the java.util.Properties text Debezium's
// tracingspancontext column holds). "" when ctx has no valid span context.
func traceText(ctx context.Context) string {
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	tp, ts := c[wire.HeaderTraceParent], c[wire.HeaderTraceState]
	switch {
	case tp == "":
		return ""
	case ts == "":
		return tp
	}
	return wire.HeaderTraceParent + "=" + tp + "\n" + wire.HeaderTraceState + "=" + ts + "\n"
}

// withTrace returns e's headers with the trace column set from ctx, unless
// the caller set it or the Writer has no trace column. The caller's map is
// not modified.
func (w *Writer) withTrace(ctx context.Context, h map[string]any) map[string]any {
	if w.traceColumn == "" || h[w.traceColumn] != nil {
		return h
	}
	tc := traceText(ctx)
	if tc == "" {
		return h
	}
	out := make(map[string]any, len(h)+1)
	maps.Copy(out, h)
	out[w.traceColumn] = tc
	return out
}
