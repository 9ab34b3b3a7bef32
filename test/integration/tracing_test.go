package integration

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outbox-cdc/outbox-cdc/inbox"
	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// otlpReceiver is an in-process OTLP/HTTP collector: it decodes the
// ExportTraceServiceRequest protobuf the connector posts to /v1/traces.
type otlpReceiver struct {
	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string // service.name of each resource
	errs    []string // requests it could not decode
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fail := func(format string, args ...any) {
		o.mu.Lock()
		o.errs = append(o.errs, fmt.Sprintf(format, args...))
		o.mu.Unlock()
		http.Error(w, "bad request", http.StatusBadRequest)
	}
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		fail("%s %s (%s)", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
		return
	}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			fail("gzip: %v", err)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		fail("read: %v", err)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		fail("unmarshal: %v", err)
		return
	}
	o.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				o.service = append(o.service, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			o.spans = append(o.spans, ss.GetSpans()...)
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// spanWithParent returns the received span of event id whose parent is
// parent, or nil.
func (o *otlpReceiver) spanWithParent(parent, id string) *tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.spans {
		if hex.EncodeToString(s.GetParentSpanId()) != parent {
			continue
		}
		for _, a := range s.GetAttributes() {
			if a.GetKey() == "messaging.message.id" && a.GetValue().GetStringValue() == id {
				return s
			}
		}
	}
	return nil
}

// TestTracingEndToEnd: an application writes with outbox.Write (and Emit) under a span,
// the connector binary exports its span to an in-process OTLP receiver, and
// the inbox handles the record. The connector's span is a child of the
// application's, the consumer's a child of the connector's, one trace id
// throughout. A Debezium-style tracingspancontext row continues its trace
// the same way; a malformed one is published without trace headers and
// counted.
func TestTracingEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	if _, err := conn.Exec(ctx, outbox.TableDDL+` ALTER TABLE outbox ADD COLUMN tracingspancontext text;`); err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()

	addr := freeAddr(t)
	slot := "trace_" + runID
	dropSlotAtEnd(t, dsn, slot)
	aggType := "traced" + runID
	topic := topicFor(aggType)
	p := startProc(t, writeConfig(t, fmt.Sprintf(`
postgres:
  dsn: %s
  slot: %s
  publication: %s
  status_interval: 100ms
outbox:
  table: public.outbox
  trace_column: tracingspancontext
  message_prefix: outbox
kafka:
  brokers: [%s]
  topic: %s
  dlq_topic: %s
http:
  listen: %s
otel:
  endpoint: %s
`, dsn, slot, slot, kafkaServer.Brokers()[0], topicTemplate, dlqFor(slot), addr, collector.URL)), addr, true,
		"OTEL_SERVICE_NAME=outbox-cdc-it", "OTEL_BSP_SCHEDULE_DELAY=100")

	// The application: its own SDK, spans recorded in memory.
	appSpans := tracetest.NewSpanRecorder()
	appTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(appSpans))
	w, err := outbox.New(outbox.Config{TraceColumn: "tracingspancontext"})
	if err != nil {
		t.Fatal(err)
	}
	appCtx, appSpan := appTP.Tracer("app").Start(ctx, "place order")
	olTx(appCtx, t, conn, true, func(tx pgx.Tx) error {
		if err := w.Write(appCtx, tx, outbox.Event{ID: "00000000-0000-4000-8000-000000000001", AggregateType: aggType, AggregateID: "o-1", EventType: "Placed", Payload: 1}); err != nil {
			return err
		}
		// A table-less event carries the context as the header of that name.
		return w.Emit(appCtx, tx, outbox.Event{ID: "emitted-4", AggregateType: aggType, AggregateID: "o-4", EventType: "Placed", Payload: 4})
	})
	appSpan.End()
	app := appSpan.SpanContext()

	// Debezium's ActivateTracingSpan writes java.util.Properties text.
	const dbzTrace, dbzParent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	dbzText := "#Mon Jun 03 10:00:00 UTC 2024\ntraceparent=00-" + dbzTrace + "-" + dbzParent + "-01\ntracestate=vendor\\=x\n"
	olTx(ctx, t, conn, true, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, tracingspancontext)
			VALUES ('00000000-0000-4000-8000-000000000002', $1, 'o-2', 'Placed', '2', $2),
			       ('00000000-0000-4000-8000-000000000003', $1, 'o-3', 'Placed', '3', 'not a trace context')`, aggType, dbzText)
		return err
	})

	consumerSpans := tracetest.NewSpanRecorder()
	consumerTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(consumerSpans))
	calls := newIBCalls()
	ibStart(t, dsn, topic, "trace-"+runID, calls.handler(nil), func(c *inbox.Config) { c.TracerProvider = consumerTP })
	ibWait(t, ctx, "4 events handled", func() bool { ok, _ := calls.snapshot(); return len(ok) == 4 })
	ibWait(t, ctx, "4 consumer spans ended", func() bool { return len(consumerSpans.Ended()) >= 4 })

	p.waitMetric(t, 30*time.Second, "outbox_cdc_trace_context_invalid_total", 1)
	var connApp, connEmit, connDbz *tracepb.Span
	ibWait(t, ctx, "the connector's spans at the receiver", func() bool {
		connApp, connEmit = recv.spanWithParent(app.SpanID().String(), "00000000-0000-4000-8000-000000000001"),
			recv.spanWithParent(app.SpanID().String(), "emitted-4")
		connDbz = recv.spanWithParent(dbzParent, "00000000-0000-4000-8000-000000000002")
		return connApp != nil && connEmit != nil && connDbz != nil
	})
	stopClean(t, p)
	recv.mu.Lock()
	if len(recv.errs) > 0 {
		t.Errorf("receiver refused requests: %v", recv.errs)
	}
	if len(recv.service) == 0 || recv.service[0] != "outbox-cdc-it" {
		t.Errorf("service.name %v, want OTEL_SERVICE_NAME's outbox-cdc-it", recv.service)
	}
	recv.mu.Unlock()

	consumed := map[string]sdktrace.ReadOnlySpan{} // by event id
	for _, s := range consumerSpans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "messaging.message.id" {
				consumed[a.Value.AsString()] = s
			}
		}
	}
	check := func(name string, conn *tracepb.Span, traceID, eventID string) {
		t.Helper()
		if got := hex.EncodeToString(conn.GetTraceId()); got != traceID {
			t.Errorf("%s: connector span in trace %s, want %s", name, got, traceID)
		}
		if conn.GetKind() != tracepb.Span_SPAN_KIND_PRODUCER || conn.GetStartTimeUnixNano() > conn.GetEndTimeUnixNano() {
			t.Errorf("%s: connector span kind %v, start %d end %d", name, conn.GetKind(), conn.GetStartTimeUnixNano(), conn.GetEndTimeUnixNano())
		}
		c := consumed[eventID]
		if c == nil {
			t.Fatalf("%s: no consumer span for event %s", name, eventID)
		}
		if c.SpanKind() != trace.SpanKindConsumer || c.Parent().SpanID().String() != hex.EncodeToString(conn.GetSpanId()) ||
			c.SpanContext().TraceID().String() != traceID {
			t.Errorf("%s: consumer span parent %s trace %s, want the connector's span %x in trace %s",
				name, c.Parent().SpanID(), c.SpanContext().TraceID(), conn.GetSpanId(), traceID)
		}
	}
	check("outbox.Write", connApp, app.TraceID().String(), "00000000-0000-4000-8000-000000000001")
	check("outbox.Emit", connEmit, app.TraceID().String(), "emitted-4")
	check("Debezium row", connDbz, dbzTrace, "00000000-0000-4000-8000-000000000002")
	// The commit happened before the application span ended; the span
	// starts at the commit time.
	if start := time.Unix(0, int64(connApp.GetStartTimeUnixNano())); start.After(appSpans.Ended()[0].EndTime()) {
		t.Errorf("connector span starts at %v, after the application's transaction (span end %v)", start, appSpans.Ended()[0].EndTime())
	}

	calls.mu.Lock()
	defer calls.mu.Unlock()
	for id, rec := range calls.recs {
		if _, ok := header(rec, "tracingspancontext"); ok {
			t.Errorf("%s: the trace column went out as a header", id)
		}
		if _, ok := header(rec, "traceparent"); !ok {
			t.Errorf("%s: no traceparent", id)
		}
	}
	// The malformed context is dropped: the connector's span for that row
	// starts a trace of its own, which the record carries.
	tp, _ := header(calls.recs["00000000-0000-4000-8000-000000000003"], "traceparent")
	recv.mu.Lock()
	var root *tracepb.Span
	for _, s := range recv.spans {
		if len(tp) == 55 && hex.EncodeToString(s.GetSpanId()) == tp[36:52] {
			root = s
		}
	}
	recv.mu.Unlock()
	if root == nil || len(root.GetParentSpanId()) != 0 {
		t.Errorf("malformed row: traceparent %q does not name a root span of the connector (%v)", tp, root)
	}
	if ts, _ := header(calls.recs["00000000-0000-4000-8000-000000000002"], "tracestate"); ts != "vendor=x" {
		t.Errorf("Debezium row's tracestate %q, want vendor=x", ts)
	}
}
