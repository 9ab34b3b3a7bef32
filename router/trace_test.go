package router

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/decode"
)

const (
	tp  = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tsv = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
)

func TestParseTraceContext(t *testing.T) {
	tests := []struct {
		name, in       string
		parent, state  string
		problem        bool // no traceparent
		stateDiscarded bool
	}{
		{name: "bare", in: tp, parent: tp},
		{name: "bare with spaces", in: "  " + tp + "\n", parent: tp},
		{name: "later version with suffix", in: "01" + tp[2:] + "-extra", parent: "01" + tp[2:] + "-extra"},
		{name: "debezium properties", in: "#Mon Jun 03 10:00:00 UTC 2024\ntraceparent=" + tp + "\n", parent: tp},
		{name: "debezium properties with escaped tracestate",
			in:     "#Mon Jun 03 10:00:00 UTC 2024\r\ntraceparent=" + tp + "\r\ntracestate=congo\\=t61rcWkgMzE,rojo\\=00f067aa0ba902b7\r\n",
			parent: tp, state: tsv},
		{name: "colon separator, comment, blank lines", in: "! c\n\n  traceparent : " + tp + "\ntracestate:" + tsv, parent: tp, state: tsv},
		{name: "unknown keys ignored", in: "baggage=a=b\ntraceparent=" + tp, parent: tp},
		{name: "last traceparent wins", in: "traceparent=garbage\ntraceparent=" + tp, parent: tp},
		{name: "malformed tracestate dropped", in: "traceparent=" + tp + "\ntracestate=a=\x01", parent: tp, stateDiscarded: true},
		{name: "empty", in: "  ", problem: true},
		{name: "garbage", in: "hello", problem: true},
		{name: "uppercase hex", in: strings.ToUpper(tp), problem: true},
		{name: "version ff", in: "ff" + tp[2:], problem: true},
		{name: "version 00 too long", in: tp + "-x", problem: true},
		{name: "later version without dash", in: "01" + tp[2:] + "x", problem: true},
		{name: "zero trace id", in: "00-00000000000000000000000000000000-00f067aa0ba902b7-01", problem: true},
		{name: "zero span id", in: "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", problem: true},
		{name: "short", in: tp[:54], problem: true},
		{name: "properties without traceparent", in: "tracestate=" + tsv, problem: true},
		{name: "properties with bad traceparent", in: "traceparent=00-xyz", problem: true},
		{name: "line without separator", in: "traceparent=" + tp + "\nnonsense", problem: true},
		{name: "line continuation", in: "traceparent=\\\n" + tp, problem: true},
		{name: "unicode escape", in: "traceparent=\\u0030" + tp[1:], problem: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc, problem := ParseTraceContext([]byte(tt.in))
			if tt.problem {
				if problem == "" || tc.Parent != nil || tc.State != nil {
					t.Fatalf("= %q %q, problem %q; want no context and a problem", tc.Parent, tc.State, problem)
				}
				return
			}
			if string(tc.Parent) != tt.parent || string(tc.State) != tt.state {
				t.Fatalf("= parent %q state %q, want %q %q", tc.Parent, tc.State, tt.parent, tt.state)
			}
			if (problem != "") != tt.stateDiscarded {
				t.Fatalf("problem %q, want one: %v", problem, tt.stateDiscarded)
			}
		})
	}
}

func TestRouteTraceColumn(t *testing.T) {
	type bad struct{ id, problem string }
	var bads []bad
	r := mustNew(t, Config{TraceColumn: "tracingspancontext", OnBadTrace: func(ev *decode.Event, problem string) {
		bads = append(bads, bad{string(ev.ID.Bytes), problem})
	}})
	tests := []struct {
		name string
		cols []decode.Header
		want []hdr
		bad  bool
	}{
		{name: "null column", cols: []decode.Header{{Name: "tracingspancontext", Value: null}}, want: nil},
		{name: "bare", cols: []decode.Header{{Name: "tracingspancontext", Value: val(tp)}},
			want: []hdr{{"traceparent", tp}}},
		{name: "properties, other header kept", cols: []decode.Header{
			{Name: "tenant", Value: val("acme")},
			{Name: "tracingspancontext", Value: val("#x\ntraceparent=" + tp + "\ntracestate=" + tsv + "\n")}},
			want: []hdr{{"tenant", "acme"}, {"traceparent", tp}, {"tracestate", tsv}}},
		{name: "malformed: no trace headers", cols: []decode.Header{{Name: "tracingspancontext", Value: val("nope")}, {Name: "tenant", Value: val("acme")}},
			want: []hdr{{"tenant", "acme"}}, bad: true},
	}
	var rec Record
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bads = nil
			ev := event()
			ev.Headers = tt.cols
			if reason := r.Route(&ev, commitTime, &rec); reason != "" {
				t.Fatalf("Route: %s", reason)
			}
			if got := headersOf(rec.Headers)[3:]; !slices.Equal(got, tt.want) { // after id, event_type, aggregate_type
				t.Fatalf("headers %q, want %q", got, tt.want)
			}
			if tt.bad != (len(bads) == 1) || tt.bad && bads[0].id != string(ev.ID.Bytes) {
				t.Fatalf("OnBadTrace calls %v, want one: %v", bads, tt.bad)
			}
		})
	}
}

// A row the router dead-letters keeps its trace, before aggregate_id.
func TestDeadLetterTraceColumn(t *testing.T) {
	r := mustNew(t, Config{TraceColumn: "trace"})
	ev := event()
	ev.EventType = null
	ev.Headers = []decode.Header{{Name: "trace", Value: val(tp)}}
	var rec Record
	r.DeadLetter(&ev, commitTime, "bad", &rec)
	want := []hdr{{"error", "bad"}, {"id", string(ev.ID.Bytes)}, {"aggregate_type", "order"}, {"traceparent", tp}, {"aggregate_id", "42"}}
	if got := headersOf(rec.Headers); !slices.Equal(got, want) {
		t.Fatalf("headers %q, want %q", got, want)
	}
}

// The trace column costs no allocation on the event path (with or without
// a connector span, the router's part is the same).
func TestRouteTraceColumnAllocs(t *testing.T) {
	r := mustNew(t, Config{TraceColumn: "trace"})
	ev := event()
	ev.Headers = []decode.Header{{Name: "trace", Value: val("#c\ntraceparent=" + tp + "\n")}}
	var rec Record
	r.Route(&ev, commitTime, &rec) // warm the topic cache and the headers slice
	if n := testing.AllocsPerRun(100, func() { r.Route(&ev, commitTime, &rec) }); n != 0 {
		t.Fatalf("Route with a trace column: %v allocations", n)
	}
}

// FuzzParseTraceContext checks the parser's invariants on any column bytes:
// no panic; a context found has a valid traceparent that occurs in the input
// (unless escaped),
// and a tracestate of printable ASCII; no context comes with a problem.
func FuzzParseTraceContext(f *testing.F) {
	for _, s := range []string{tp, "traceparent=" + tp + "\ntracestate=a\\=b", "#c\r\ntraceparent:" + tp, "", "=", "\\", "traceparent=\\"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		tc, problem := ParseTraceContext(b)
		if !bytes.Equal(in, b) {
			t.Fatal("input modified")
		}
		if tc.Parent == nil {
			if problem == "" || tc.State != nil {
				t.Fatalf("no traceparent, problem %q, state %q", problem, tc.State)
			}
			return
		}
		escaped := bytes.IndexByte(b, '\\') >= 0 // unescaping copies
		if !validTraceParent(tc.Parent) || !escaped && !bytes.Contains(b, tc.Parent) {
			t.Fatalf("traceparent %q invalid or not from the input", tc.Parent)
		}
		if tc.State != nil && !validTraceState(tc.State) {
			t.Fatalf("tracestate %q", tc.State)
		}
	})
}
