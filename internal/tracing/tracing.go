// Package tracing exports the connector's spans (otel.endpoint): one per
// event, kind producer, from the transaction's commit to the broker's
// acknowledgement, child of the trace context the outbox row carried.
//
// OTLP over HTTP/protobuf rather than gRPC: every collector and vendor
// endpoint accepts it, it goes through ordinary HTTP proxies and load
// balancers, and it uses net/http rather than a gRPC client connection (the
// OTLP protobuf package still links gRPC's status types). Export never slows the pipeline: spans wait in
// a bounded queue for a batch exporter goroutine; when the queue is full or
// an export fails, spans are dropped and counted. Shutdown flushes with a
// bound.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// QueueSize bounds the spans waiting for export (the SDK's default);
// OTEL_BSP_MAX_QUEUE_SIZE does not apply, since the drop count relies on it.
const QueueSize = 2048

// Config configures a Provider.
type Config struct {
	Endpoint string // OTLP/HTTP base URL; spans go to its /v1/traces
	Version  string // service.version
	// Dropped counts spans not exported.
	Dropped prometheus.Counter
}

// Provider starts the connector's spans. Create it with New and Shutdown it
// after the pipeline has stopped.
type Provider struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagation.TraceContext
}

// New builds the exporter and the batch processor. The OTEL_* variables the
// SDK reads apply (headers, timeout, certificates, service name, resource
// attributes, sampler); cfg.Endpoint wins over OTEL_EXPORTER_OTLP_*ENDPOINT.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Provider, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil { // validated by config
		return nil, fmt.Errorf("otel.endpoint: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("outbox-cdc"), semconv.ServiceVersion(cfg.Version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	// The SDK reports export failures through the global handler; this one
	// logs them with the connector's logger instead of the standard logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("otel span export", "err", err) }))
	return newProvider(exp, res, QueueSize, cfg.Dropped), nil
}

// newProvider exports through exp, queueing at most queueSize spans.
func newProvider(exp sdktrace.SpanExporter, res *resource.Resource, queueSize int, dropped prometheus.Counter) *Provider {
	q := &queue{max: int64(queueSize), dropped: dropped}
	q.SpanProcessor = sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, q: q}, sdktrace.WithMaxQueueSize(queueSize))
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(q))
	return &Provider{tp: tp, tracer: tp.Tracer("github.com/outbox-cdc/outbox-cdc")}
}

// Shutdown exports the spans still queued, for at most timeout.
func (p *Provider) Shutdown(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.tp.Shutdown(ctx)
}

// Start implements pipeline.Tracer.
func (p *Provider) Start(commit time.Time, rec *router.Record) func(sink.Outcome) {
	c := headers{&rec.Headers}
	parent := p.prop.Extract(context.Background(), c)
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(rec.Topic),
		semconv.MessagingKafkaMessageKey(string(rec.Key)),
	}
	if id := c.Get(wire.HeaderID); id != "" {
		attrs = append(attrs, semconv.MessagingMessageID(id))
	}
	ctx, span := p.tracer.Start(parent, "send "+rec.Topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(commit), trace.WithAttributes(attrs...))
	p.prop.Inject(ctx, c)
	return func(o sink.Outcome) {
		switch {
		case o.Err != nil:
			span.RecordError(o.Err)
			span.SetStatus(codes.Error, "not delivered")
		case o.DeadLettered:
			span.SetAttributes(attribute.Bool("outbox_cdc.dead_lettered", true), attribute.String("outbox_cdc.dead_letter_reason", o.Reason))
			span.SetStatus(codes.Error, "dead-lettered")
		}
		span.End()
	}
}

// headers is a propagation carrier over a record's headers. Set replaces
// a header's value: the record then names the connector's span.
type headers struct{ h *[]router.Header }

func (c headers) Get(key string) string {
	for _, h := range *c.h {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c headers) Set(key, value string) {
	for i, h := range *c.h {
		if h.Key == key {
			(*c.h)[i].Value = []byte(value)
			return
		}
	}
	*c.h = append(*c.h, router.Header{Key: key, Value: []byte(value)})
}

func (c headers) Keys() []string {
	keys := make([]string, len(*c.h))
	for i, h := range *c.h {
		keys[i] = h.Key
	}
	return keys
}

// queue counts the spans handed to the batch processor and not yet through
// the exporter, and drops (and counts) a span that would overflow the
// processor's queue, which the SDK would drop without telling.
type queue struct {
	sdktrace.SpanProcessor
	n       atomic.Int64
	max     int64
	dropped prometheus.Counter
}

func (q *queue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor exports sampled spans only
	}
	if q.n.Add(1) > q.max {
		q.n.Add(-1)
		q.dropped.Inc()
		return
	}
	q.SpanProcessor.OnEnd(s)
}

// countingExporter releases the queue's count when a batch is through and
// counts a failed batch as dropped (the exporter already retried it).
type countingExporter struct {
	sdktrace.SpanExporter
	q *queue
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	e.q.n.Add(-int64(len(spans)))
	if err != nil {
		e.q.dropped.Add(float64(len(spans)))
	}
	return err
}
