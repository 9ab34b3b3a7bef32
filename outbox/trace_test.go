package outbox

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// spanCtx returns ctx carrying a sampled remote span context, as an
// application's SDK would after starting a span; the API alone builds it.
func spanCtx(t *testing.T, state string) context.Context {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, err := trace.ParseTraceState(state)
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	return trace.ContextWithSpanContext(context.Background(), sc)
}

const wantTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestWriteTraceColumn(t *testing.T) {
	w, err := New(Config{TraceColumn: "trace_context"})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(h map[string]any) Event {
		return Event{AggregateType: "order", AggregateID: "o-1", EventType: "Placed", Headers: h}
	}
	tests := []struct {
		name    string
		ctx     context.Context
		headers map[string]any
		want    any // the trace column's value; nil: not written
	}{
		{"no span", context.Background(), nil, nil},
		{"span", spanCtx(t, ""), nil, wantTP},
		{"span with tracestate", spanCtx(t, "congo=t61rcWkgMzE"), map[string]any{"tenant": "acme"},
			"traceparent=" + wantTP + "\ntracestate=congo=t61rcWkgMzE\n"},
		{"caller's own value wins", spanCtx(t, ""), map[string]any{"trace_context": "mine"}, "mine"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx := &fakeTx{}
			before := len(tt.headers)
			if err := w.Write(tt.ctx, tx, ev(tt.headers)); err != nil {
				t.Fatal(err)
			}
			if len(tt.headers) != before {
				t.Fatalf("caller's headers modified: %v", tt.headers)
			}
			has := strings.Contains(tx.sql[0], `"trace_context"`)
			if has != (tt.want != nil) {
				t.Fatalf("sql %s", tx.sql[0])
			}
			if tt.want != nil && !containsArg(tx.args[0], tt.want) {
				t.Fatalf("args %q lack %q", tx.args[0], tt.want)
			}
		})
	}

	// Emit carries it as the header of that name.
	tx := &fakeTx{}
	if err := w.Emit(spanCtx(t, ""), tx, ev(nil)); err != nil {
		t.Fatal(err)
	}
	var m Message
	if err := json.Unmarshal(tx.args[0][1].([]byte), &m); err != nil {
		t.Fatal(err)
	}
	if m.Headers["trace_context"] != wantTP {
		t.Fatalf("message headers %v", m.Headers)
	}

	if _, err := New(Config{TraceColumn: "payload"}); err == nil {
		t.Fatal("a trace column that is a mapped column was accepted")
	}
}

func containsArg(args []any, want any) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}
