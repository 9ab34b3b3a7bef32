package tracing

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

const parentTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func header(rec *router.Record, key string) string { return headers{&rec.Headers}.Get(key) }

func TestSpanPerEvent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})
	p := newProvider(exp, nil, 16, dropped)
	commit := time.Now().Add(-time.Second).Truncate(time.Microsecond)

	tests := []struct {
		name    string
		headers []router.Header
		outcome sink.Outcome
		status  codes.Code
	}{
		{"child of the column's context", []router.Header{{Key: "id", Value: []byte("e-1")}, {Key: "traceparent", Value: []byte(parentTP)},
			{Key: "tracestate", Value: []byte("congo=t61")}}, sink.Outcome{}, codes.Unset},
		{"root without a context", []router.Header{{Key: "id", Value: []byte("e-2")}}, sink.Outcome{}, codes.Unset},
		{"dead-lettered", []router.Header{{Key: "id", Value: []byte("e-3")}}, sink.Outcome{DeadLettered: true, Reason: "too large"}, codes.Error},
		{"not delivered", []router.Header{{Key: "id", Value: []byte("e-4")}}, sink.Outcome{Err: errors.New("boom")}, codes.Error},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp.Reset()
			hasParent := len(tt.headers) > 1
			rec := &router.Record{Topic: "outbox.event.order", Key: []byte("42"), Headers: tt.headers}
			end := p.Start(commit, rec)
			end(tt.outcome)
			if err := p.tp.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := exp.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans", len(spans))
			}
			s := spans[0]
			if s.SpanKind != trace.SpanKindProducer || s.Name != "send outbox.event.order" || !s.StartTime.Equal(commit) || s.EndTime.Before(commit) {
				t.Fatalf("span %q kind %v start %v end %v", s.Name, s.SpanKind, s.StartTime, s.EndTime)
			}
			if s.Status.Code != tt.status {
				t.Fatalf("status %v, want %v", s.Status, tt.status)
			}
			// The record now names the connector's span.
			want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
			if got := header(rec, "traceparent"); got != want {
				t.Fatalf("traceparent %q, want %q", got, want)
			}
			if hasParent {
				if s.Parent.SpanID().String() != "00f067aa0ba902b7" || s.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
					t.Fatalf("parent %v, trace %v", s.Parent.SpanID(), s.SpanContext.TraceID())
				}
				if got := header(rec, "tracestate"); got != "congo=t61" {
					t.Fatalf("tracestate %q", got)
				}
			} else if s.Parent.IsValid() {
				t.Fatalf("root span has parent %v", s.Parent)
			}
			attrs := map[string]string{}
			for _, a := range s.Attributes {
				attrs[string(a.Key)] = a.Value.Emit()
			}
			for k, v := range map[string]string{"messaging.system": "kafka", "messaging.destination.name": "outbox.event.order",
				"messaging.message.id": header(rec, "id"), "messaging.kafka.message.key": "42"} {
				if attrs[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, attrs[k], v)
				}
			}
		})
	}
	if n := testutil.ToFloat64(dropped); n != 0 {
		t.Fatalf("dropped %v", n)
	}
}

// blockingExporter holds every export until released, like a collector that
// does not answer.
type blockingExporter struct {
	release chan struct{}
	mu      sync.Mutex
	n       int
	fail    bool
}

func (e *blockingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fail {
		return errors.New("collector refused")
	}
	e.n += len(spans)
	return nil
}

func (e *blockingExporter) Shutdown(context.Context) error { return nil }

// A stuck collector never blocks Start or the end of a span: spans past the
// queue are dropped and counted.
func TestStuckCollectorDropsAndCounts(t *testing.T) {
	exp := &blockingExporter{release: make(chan struct{})}
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})
	const queue = 8
	p := newProvider(exp, nil, queue, dropped)
	const events = 100
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range events {
			rec := &router.Record{Topic: "t"}
			p.Start(time.Now(), rec)(sink.Outcome{})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("spans blocked while the exporter was stuck")
	}
	if n := testutil.ToFloat64(dropped); n < events-queue {
		t.Fatalf("dropped %v, want at least %d", n, events-queue)
	}
	close(exp.release)
	if err := p.Shutdown(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	exp.mu.Lock()
	defer exp.mu.Unlock()
	if got := float64(exp.n) + testutil.ToFloat64(dropped); got != events {
		t.Fatalf("exported %d + dropped %v != %d", exp.n, testutil.ToFloat64(dropped), events)
	}
}

// Shutdown gives up after its timeout when the collector does not answer.
func TestShutdownBounded(t *testing.T) {
	exp := &blockingExporter{release: make(chan struct{})}
	t.Cleanup(func() { close(exp.release) })
	p := newProvider(exp, nil, 8, prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"}))
	p.Start(time.Now(), &router.Record{Topic: "t"})(sink.Outcome{})
	start := time.Now()
	if err := p.Shutdown(200 * time.Millisecond); err == nil {
		t.Fatal("Shutdown succeeded with a stuck collector")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
}
