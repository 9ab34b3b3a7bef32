package pipeline

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

const traceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// ackAtOnce delivers every record as soon as it is produced, on the caller's
// goroutine.
type ackAtOnce struct{}

func (ackAtOnce) Produce(_ context.Context, _ *router.Record, done sink.Done) error {
	done.Delivered(sink.Outcome{})
	return nil
}
func (ackAtOnce) Flush(context.Context) error { return nil }

type fakeTracer struct {
	commit   time.Time
	parent   string
	outcomes []sink.Outcome
}

func (f *fakeTracer) Start(commit time.Time, rec *router.Record) func(sink.Outcome) {
	f.commit = commit
	for _, h := range rec.Headers {
		if h.Key == "traceparent" {
			f.parent = string(h.Value)
		}
	}
	return func(o sink.Outcome) { f.outcomes = append(f.outcomes, o) }
}

func traceEvent() decode.Event {
	v := func(s string) decode.Value { return decode.Value{Bytes: []byte(s)} }
	return decode.Event{ID: v("e-1"), AggregateType: v("order"), AggregateID: v("42"), EventType: v("Placed"), Payload: v("{}"),
		Headers: []decode.Header{{Name: "trace", Value: v("#c\ntraceparent=" + traceParent + "\n")}}}
}

// The tracer sees the routed record (the column's context as traceparent)
// and the commit time, and its span ends with the record's outcome.
func TestPublishStartsAndEndsSpan(t *testing.T) {
	tr := &fakeTracer{}
	p := newPipeline(t, newCluster(t), &plan{}, func(c *Config) {
		c.Routes.TraceColumn = "trace"
		c.Tracer = tr
	})
	p.out = ackAtOnce{}
	ev := traceEvent()
	var rec router.Record
	if err := p.proc.publish(context.Background(), p.tracker.Begin(), router.Source{Commit: at}, &ev, nil, &rec); err != nil {
		t.Fatal(err)
	}
	if !tr.commit.Equal(at) || tr.parent != traceParent || len(tr.outcomes) != 1 || tr.outcomes[0] != (sink.Outcome{}) {
		t.Fatalf("tracer saw commit %v parent %q outcomes %v", tr.commit, tr.parent, tr.outcomes)
	}
}

// Without otel.endpoint, tracing costs the event path no allocation: the
// delivery record is the only one.
func TestPublishAllocsWithoutTracer(t *testing.T) {
	p := newPipeline(t, newCluster(t), &plan{}, func(c *Config) { c.Routes.TraceColumn = "trace" })
	p.out = ackAtOnce{}
	ev := traceEvent()
	var rec router.Record
	txn := p.tracker.Begin()
	publish := func() {
		if err := p.proc.publish(context.Background(), txn, router.Source{Commit: at}, &ev, nil, &rec); err != nil {
			t.Fatal(err)
		}
	}
	publish()
	if n := testing.AllocsPerRun(100, publish); n > 1 {
		t.Fatalf("publish: %v allocations, want 1 (the delivery)", n)
	}
}

// A malformed trace context is counted every time and logged once a minute.
func TestBadTraceCountedAndLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	m := metrics.New()
	report := badTraceReporter(m, slog.New(slog.NewTextHandler(&buf, nil)))
	ev := traceEvent()
	for range 3 {
		report(&ev, "malformed traceparent")
	}
	if n := testutil.ToFloat64(m.TraceContextInvalid); n != 3 {
		t.Fatalf("counted %v, want 3", n)
	}
	if lines := strings.Count(buf.String(), "\n"); lines != 1 || !strings.Contains(buf.String(), "id=e-1") {
		t.Fatalf("logged %d lines: %s", lines, buf.String())
	}
}
