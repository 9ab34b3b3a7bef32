package router

import (
	"bytes"
	"slices"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// TraceContext is a W3C trace context read from the outbox's trace column
// (outbox.trace_column). Its slices alias the column's bytes unless the
// column escaped a character (Java properties).
type TraceContext struct {
	Parent []byte // traceparent, validated
	State  []byte // tracestate; nil when absent or malformed
}

// maxTraceState is W3C's 32 list members of at most 256 characters and their
// commas; a longer value cannot be a tracestate.
const maxTraceState = 32*257 - 1

// ParseTraceContext reads a trace column: a bare W3C traceparent, or the
// java.util.Properties text Debezium's ActivateTracingSpan writes to its
// tracingspancontext column ("#comment\ntraceparent=…\ntracestate=…").
// problem is non-empty when no valid traceparent was found (tc is then
// zero), or when only the tracestate was malformed (it is left out, as W3C
// prescribes, and the traceparent kept).
func ParseTraceContext(b []byte) (tc TraceContext, problem string) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return TraceContext{}, "empty trace context"
	}
	if validTraceParent(b) {
		return TraceContext{Parent: b}, ""
	}
	if !bytes.ContainsAny(b, "=:") {
		return TraceContext{}, "malformed traceparent"
	}
	var parent, state []byte
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		line = bytes.TrimLeft(bytes.TrimSuffix(line, []byte{'\r'}), " \t\f")
		if len(line) == 0 || line[0] == '#' || line[0] == '!' {
			continue
		}
		key, value, ok := property(line)
		if !ok {
			return TraceContext{}, "malformed properties line"
		}
		switch string(key) {
		case wire.HeaderTraceParent:
			parent = value
		case wire.HeaderTraceState:
			state = value
		}
	}
	if parent == nil {
		return TraceContext{}, "no traceparent property"
	}
	if !validTraceParent(parent) {
		return TraceContext{}, "malformed traceparent"
	}
	tc.Parent = parent
	if len(state) > 0 {
		if !validTraceState(state) {
			return tc, "malformed tracestate (left out)"
		}
		tc.State = state
	}
	return tc, ""
}

// property splits one java.util.Properties line at its first unescaped '='
// or ':' and unescapes both sides (copying only when they hold a backslash).
// A line continuation (a trailing backslash) and \u escapes are refused: a
// trace context never needs them.
func property(line []byte) (key, value []byte, ok bool) {
	sep := -1
	for i := 0; i < len(line); i++ {
		if line[i] == '\\' {
			i++
			continue
		}
		if line[i] == '=' || line[i] == ':' {
			sep = i
			break
		}
	}
	if sep < 0 {
		return nil, nil, false
	}
	key, ok = unescape(bytes.TrimRight(line[:sep], " \t\f"))
	if !ok {
		return nil, nil, false
	}
	value, ok = unescape(bytes.TrimSpace(line[sep+1:]))
	return key, value, ok
}

func unescape(b []byte) ([]byte, bool) {
	if bytes.IndexByte(b, '\\') < 0 {
		return b, true
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		if i++; i == len(b) {
			return nil, false
		}
		switch c = b[i]; c {
		case 't':
			out = append(out, '\t')
		case 'f':
			out = append(out, '\f')
		case 'u', 'n', 'r':
			return nil, false
		default:
			out = append(out, c)
		}
	}
	return out, true
}

// validTraceParent checks W3C's traceparent: version-traceid-parentid-flags,
// lowercase hex, neither id all zeros, version ff invalid; version 00 is
// exactly 55 characters, a later version may append "-…".
func validTraceParent(b []byte) bool {
	if len(b) < 55 || b[2] != '-' || b[35] != '-' || b[52] != '-' {
		return false
	}
	if !lowerHex(b[:2]) || !lowerHex(b[3:35]) || !lowerHex(b[36:52]) || !lowerHex(b[53:55]) {
		return false
	}
	switch {
	case b[0] == 'f' && b[1] == 'f':
		return false
	case b[0] == '0' && b[1] == '0' && len(b) != 55:
		return false
	case len(b) > 55 && b[55] != '-':
		return false
	}
	return !allZero(b[3:35]) && !allZero(b[36:52])
}

// validTraceState checks what a receiver must: printable ASCII, bounded
// length. The list members' syntax is the tracing system's business.
func validTraceState(b []byte) bool {
	if len(b) > maxTraceState {
		return false
	}
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != '0' {
			return false
		}
	}
	return true
}

// traceHeaders replaces the trace column's header, which the decoder
// delivered with the other header columns, by traceparent and tracestate. It
// travels as a header column, not as one of Config.Columns, because a
// table-less event (outbox.Emit) carries it as a message header of that name. A
// value without a valid traceparent is published without trace headers and
// reported to onBadTrace; it never blocks the event. A malformed tracestate
// alone is left out, as W3C prescribes, and not reported.
func (r *Router) traceHeaders(h []Header, ev *decode.Event) []Header {
	i := len(h) - 1
	for i >= 0 && h[i].Key != r.traceColumn {
		i--
	}
	if i < 0 {
		return h // NULL column: no trace
	}
	v := h[i].Value
	h = slices.Delete(h, i, i+1)
	tc, problem := ParseTraceContext(v)
	if tc.Parent == nil {
		if r.onBadTrace != nil {
			r.onBadTrace(ev, problem)
		}
		return h
	}
	h = append(h, Header{wire.HeaderTraceParent, tc.Parent})
	if tc.State != nil {
		h = append(h, Header{wire.HeaderTraceState, tc.State})
	}
	return h
}
