package metrics

import "github.com/prometheus/client_golang/prometheus"

// addTrace creates and registers the tracing metrics (outbox.trace_column,
// otel.endpoint).
func (m *Metrics) addTrace(ns string) {
	m.TraceContextInvalid = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "trace_context_invalid_total",
		Help: "Events whose outbox.trace_column held no valid W3C traceparent; they were published without trace headers."})
	m.TraceSpansDropped = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "trace_spans_dropped_total",
		Help: "Connector spans not exported: the export queue was full, or the OTLP collector refused or did not answer."})
	m.Registry.MustRegister(m.TraceContextInvalid, m.TraceSpansDropped)
}
