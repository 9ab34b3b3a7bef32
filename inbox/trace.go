package inbox

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

const tracerName = "github.com/outbox-cdc/outbox-cdc/inbox"

// tracing continues the trace a record's headers carry (traceparent and
// tracestate, which outbox-cdc sends) with one consumer span per delivery
// attempt, the handler's context being inside it.
type tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	group  string
}

func newTracing(cfg Config) tracing {
	tp, prop := cfg.TracerProvider, cfg.Propagator
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	return tracing{tracer: tp.Tracer(tracerName), prop: prop, group: cfg.Group}
}

// start begins rec's span as a child of the context in its headers.
func (t tracing) start(ctx context.Context, rec *kgo.Record, id string) (context.Context, trace.Span) {
	ctx = t.prop.Extract(ctx, recordHeaders{rec})
	return t.tracer.Start(ctx, "process "+rec.Topic, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(
		semconv.MessagingSystemKafka,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(rec.Topic),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(int(rec.Partition))),
		semconv.MessagingKafkaOffset(int(rec.Offset)),
		semconv.MessagingKafkaMessageKey(string(rec.Key)),
		semconv.MessagingConsumerGroupName(t.group),
		semconv.MessagingMessageID(id),
	))
}

// traceID is the trace id in rec's headers, "" when it has none: logged
// beside the event id so one id finds the whole path.
func (t tracing) traceID(rec *kgo.Record) string {
	sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), recordHeaders{rec}))
	if !sc.TraceID().IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// end closes an attempt's span: a duplicate is marked, a failure recorded.
func end(span trace.Span, dup bool, err error) {
	if dup {
		span.SetAttributes(attribute.Bool("outbox.inbox.duplicate", true))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "attempt failed")
	}
	span.End()
}

// recordHeaders is a propagation carrier over a record's headers.
type recordHeaders struct{ r *kgo.Record }

func (c recordHeaders) Get(key string) string {
	v, _ := Header(c.r, key)
	return v
}

func (c recordHeaders) Set(key, value string) {
	c.r.Headers = append(c.r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c recordHeaders) Keys() []string {
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}
