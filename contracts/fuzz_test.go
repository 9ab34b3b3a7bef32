package contracts

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzApply fuzzes the validate/encode entry point with arbitrary payloads
// and ids. Invariants, beyond "no panic": Validate and Encode agree; a
// failure is a *Violation naming the schema, with a pointer that is "" or
// starts with "/"; an encoded value starts with 0x00 and the big-endian id,
// ParseHeader gives back the id, and the body is the payload, byte for byte;
// on a violation dst comes back unchanged.
func FuzzApply(f *testing.F) {
	for _, p := range []string{`{"id":"o1","qty":1}`, `{"id":"o1","qty":"1"}`, `{}`, `[`, ``, `null`,
		`{"id":"o1","qty":1,"lines":[{"sku":"a","a/b~c":true}]}`, "{\"id\":\"\xff\",\"qty\":1}"} {
		f.Add([]byte(p), uint32(42))
	}
	f.Add([]byte(`{"id":"x","qty":3}`), uint32(0x7fffffff))
	s := testSchema(f, orderSchema)
	f.Fuzz(func(t *testing.T, payload []byte, id uint32) {
		s := &Schema{Ref: SchemaRef{Subject: s.Ref.Subject, Version: s.Ref.Version, ID: int(id & 0x7fffffff)}, c: s.c}
		verr := s.Validate(payload)
		dst := []byte{0xAA}
		out, eerr := s.Encode(dst, payload)
		if (verr == nil) != (eerr == nil) {
			t.Fatalf("Validate = %v but Encode = %v", verr, eerr)
		}
		if verr != nil {
			var v *Violation
			if !errors.As(verr, &v) || v.Schema != s.Ref || v.Reason == "" {
				t.Fatalf("failure %#v is not a *Violation with the schema and a reason", verr)
			}
			if v.Pointer != "" && v.Pointer[0] != '/' {
				t.Fatalf("pointer %q is not a JSON pointer", v.Pointer)
			}
			if !bytes.Equal(out, dst) {
				t.Fatalf("Encode changed dst on a violation: %x", out)
			}
			return
		}
		if !bytes.HasPrefix(out, dst) {
			t.Fatalf("Encode lost dst: %x", out)
		}
		framed := out[len(dst):]
		if want := AppendHeader(nil, s.Ref.ID); !bytes.HasPrefix(framed, want) {
			t.Fatalf("value %x does not start with %x", framed, want)
		}
		gotID, body, err := ParseHeader(framed)
		if err != nil || gotID != s.Ref.ID || !bytes.Equal(body, payload) {
			t.Fatalf("ParseHeader = %d, %q, %v; want %d, %q", gotID, body, err, s.Ref.ID, payload)
		}
	})
}

// FuzzParseHeader: any bytes either parse into an id and the rest, or fail
// with ErrNotFramed; what parses re-frames to the same bytes.
func FuzzParseHeader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 42, '{', '}'})
	f.Add([]byte{1, 0, 0, 0, 42})
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, body, err := ParseHeader(b)
		if err != nil {
			if !errors.Is(err, ErrNotFramed) {
				t.Fatalf("ParseHeader(%x) = %v, not ErrNotFramed", b, err)
			}
			return
		}
		if re := append(AppendHeader(nil, id), body...); !bytes.Equal(re, b) {
			t.Fatalf("ParseHeader(%x) = %d, %x; re-framed %x", b, id, body, re)
		}
	})
}
