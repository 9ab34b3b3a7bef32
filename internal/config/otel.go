package config

import (
	"fmt"
	"net/url"
	"slices"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// OTel configures the connector's spans, one per event from its commit to
// the broker's acknowledgement, exported with OTLP over HTTP/protobuf. The
// exporter's other settings come from the standard OTEL_* variables
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER, ...), read by the OpenTelemetry SDK.
type OTel struct {
	// Endpoint is the OTLP/HTTP base URL (http://collector:4318); spans go to
	// its /v1/traces. "" (the default) emits no span, whatever the OTEL_*
	// variables say.
	Endpoint string `koanf:"endpoint"`
}

// tracing checks outbox.trace_column and otel.endpoint.
func (v *validator) tracing(ob Outbox, o OTel) {
	if tc := ob.TraceColumn; tc != "" {
		const key = "outbox.trace_column"
		v.identifier(key, tc, tc)
		if slices.Contains(ob.HeaderColumns, tc) {
			v.add(key, tc, "also listed in outbox.header_columns; the trace column is sent as traceparent and tracestate headers, not as itself",
				"remove it from outbox.header_columns")
		}
		c := ob.Columns
		if slices.Contains([]string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}, tc) {
			v.add(key, tc, "is one of the outbox.columns", "name the column that holds the trace context")
		}
	}
	if ob.TraceColumn != "" || o.Endpoint != "" {
		for i, h := range ob.HeaderColumns {
			if h == wire.HeaderTraceParent || h == wire.HeaderTraceState {
				v.add(fmt.Sprintf("outbox.header_columns[%d]", i), h, "the trace context sends this header; a column with this name would give a second one",
					"rename the column or remove it from outbox.header_columns")
			}
		}
	}
	if e := o.Endpoint; e != "" {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			v.add("otel.endpoint", e, "not an http(s) URL", `use the collector's OTLP/HTTP base URL, such as http://otel-collector:4318, or "" to emit no span`)
		}
	}
}
