package inbox

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// oneRowDB begins transactions whose INSERT affects rows rows.
type oneRowDB struct{ rows int64 }

func (d oneRowDB) Begin(context.Context) (pgx.Tx, error) { return &rowsTx{rows: d.rows}, nil }

type rowsTx struct {
	pgx.Tx // other methods panic
	rows   int64
}

func (t *rowsTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	if t.rows == 0 {
		return pgconn.NewCommandTag("INSERT 0 0"), nil
	}
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}
func (t *rowsTx) Commit(context.Context) error   { return nil }
func (t *rowsTx) Rollback(context.Context) error { return nil }

const (
	producerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpan  = "00f067aa0ba902b7"
)

func TestHandlerSpanContinuesTrace(t *testing.T) {
	rec := func() *kgo.Record {
		return &kgo.Record{Topic: "outbox.event.order", Partition: 3, Offset: 17, Key: []byte("42"), Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte("e-1")},
			{Key: "traceparent", Value: []byte("00-" + producerTrace + "-" + producerSpan + "-01")},
			{Key: "tracestate", Value: []byte("congo=t61")},
		}}
	}
	tests := []struct {
		name       string
		rows       int64
		handlerErr error
		record     *kgo.Record
		dup        bool
		status     codes.Code
	}{
		{name: "first delivery", rows: 1, record: rec()},
		{name: "duplicate", rows: 0, record: rec(), dup: true},
		{name: "handler fails", rows: 1, handlerErr: errors.New("no stock"), record: rec(), status: codes.Error},
		{name: "no trace headers: a root span", rows: 1, record: &kgo.Record{Topic: "outbox.event.order"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
			var inHandler trace.SpanContext
			c, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Group: "billing", Topics: []string{"t"}, DB: oneRowDB{tt.rows},
				TracerProvider: tp, Handler: func(ctx context.Context, _ pgx.Tx, _ *kgo.Record) error {
					inHandler = trace.SpanContextFromContext(ctx)
					return tt.handlerErr
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _, dup, err := c.attempt(context.Background(), tt.record)
			if dup != tt.dup || (err != nil) != (tt.handlerErr != nil) {
				t.Fatalf("attempt: dup %v err %v", dup, err)
			}
			spans := sr.Ended()
			if len(spans) != 1 {
				t.Fatalf("%d spans", len(spans))
			}
			s := spans[0]
			if s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process outbox.event.order" || s.Status().Code != tt.status {
				t.Fatalf("span %q kind %v status %v", s.Name(), s.SpanKind(), s.Status())
			}
			traced := len(tt.record.Headers) > 1
			switch {
			case traced && (s.Parent().SpanID().String() != producerSpan || s.SpanContext().TraceID().String() != producerTrace ||
				!s.Parent().IsRemote() || s.SpanContext().TraceState().Get("congo") != "t61"):
				t.Fatalf("parent %v trace %v state %v: not the producer's child", s.Parent().SpanID(), s.SpanContext().TraceID(), s.SpanContext().TraceState())
			case !traced && s.Parent().IsValid():
				t.Fatalf("root span has parent %v", s.Parent())
			}
			if !tt.dup && inHandler.SpanID() != s.SpanContext().SpanID() {
				t.Fatalf("handler ran in span %v, not in %v", inHandler.SpanID(), s.SpanContext().SpanID())
			}
			attrs := map[string]string{}
			for _, a := range s.Attributes() {
				attrs[string(a.Key)] = a.Value.Emit()
			}
			for k, v := range map[string]string{"messaging.system": "kafka", "messaging.operation.type": "process",
				"messaging.destination.name": "outbox.event.order", "messaging.consumer.group.name": "billing",
				"messaging.message.id": EventID(tt.record)} {
				if attrs[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, attrs[k], v)
				}
			}
			if got := attrs["outbox.inbox.duplicate"] == "true"; got != tt.dup {
				t.Errorf("duplicate attribute %v, want %v", got, tt.dup)
			}
		})
	}
}
