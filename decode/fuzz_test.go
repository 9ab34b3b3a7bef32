package decode

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
)

// FuzzDecode feeds two messages to a decoder that has already cached the
// outbox table and another table. Two inputs let the fuzzer pair a mutated
// Relation message with a mutated Insert that must be read through it.
func FuzzDecode(f *testing.F) {
	msgs := validMessages()
	for i, m := range msgs {
		f.Add([]byte(m), []byte(msgs[(i+1)%len(msgs)]))
		f.Add([]byte(outboxRelation()), []byte(m))
	}
	f.Add([]byte{}, []byte{'I'})

	f.Fuzz(func(t *testing.T, a, b []byte) {
		d := NewDecoder(testMapping())
		for _, m := range validMessages()[:3] { // the three Relation messages
			if _, err := d.Decode(m); err != nil {
				t.Fatal(err)
			}
		}
		for _, in := range [][]byte{a, b} {
			orig := bytes.Clone(in)
			res, err := d.Decode(in)
			if !bytes.Equal(in, orig) {
				t.Fatalf("Decode modified its input")
			}
			checkOutcome(t, d, in, res, err)
		}
		// Whatever came before, a well-formed message still decodes.
		if _, err := d.Decode(pgwire.Begin(1, time.Unix(0, 0), 1)); err != nil {
			t.Fatalf("decoder wedged: %v", err)
		}
	})
}

// checkOutcome asserts the invariants every Decode call must keep.
func checkOutcome(t *testing.T, d *Decoder, in []byte, res *Result, err error) {
	t.Helper()
	if (err == nil) == (res == nil) {
		t.Fatalf("result %v with error %v", res, err)
	}
	if err != nil {
		var fe *FormatError
		switch {
		case errors.As(err, &fe):
			if fe.Offset < 0 || fe.Offset > len(in) {
				t.Fatalf("offset %d outside the %d-byte message", fe.Offset, len(in))
			}
			if len(in) > 0 && fe.Msg != in[0] || len(in) == 0 && fe.Msg != 0 {
				t.Fatalf("error names message %q", fe.Msg)
			}
			_ = fe.Error()
		case errors.Is(err, ErrUnknownRelation), errors.Is(err, ErrTableRenamed):
		default:
			t.Fatalf("unexpected error type %T: %v", err, err)
		}
		return
	}
	if res.Kind < KindSkip || res.Kind > KindTruncate {
		t.Fatalf("kind %v", res.Kind)
	}
	if res.Kind == KindEvent {
		ev := res.Event
		if len(ev.Headers) != len(d.tables[ev.Table].m.HeaderColumns) {
			t.Fatalf("%d headers", len(ev.Headers))
		}
		vals := []Value{ev.ID, ev.AggregateType, ev.AggregateID, ev.EventType, ev.Payload}
		for _, h := range ev.Headers {
			vals = append(vals, h.Value)
		}
		for _, v := range vals {
			if v.Null && v.Bytes != nil {
				t.Fatalf("NULL value with bytes")
			}
			if len(v.Bytes) > len(in) {
				t.Fatalf("value longer than the message")
			}
		}
	}
}
