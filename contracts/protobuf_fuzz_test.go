package contracts

import (
	"bytes"
	"errors"
	"testing"

	"github.com/jhump/protoreflect/dynamic"
)

// FuzzProtobuf fuzzes the Protobuf conversion with arbitrary payloads.
// Invariants, beyond "no panic": Validate and Encode agree; a failure is a
// *Violation with a reason and a pointer that is "" or starts with "/",
// and dst comes back unchanged; an accepted payload is framed with the id
// and the single index byte 0, and its message decodes with the other
// library (jhump/protoreflect's dynamic message, its own binary decoder);
// that library's JSON of it encodes back to the same bytes, so both read
// the body with the payload's meaning, and encoding is deterministic.
func FuzzProtobuf(f *testing.F) {
	for _, p := range []string{`{}`, `{"id":"o1","qty":"12","state":"PAID"}`, `{"qty":1.5}`, `{"extra":1}`,
		`{"placedAt":"2024-05-01T12:00:00Z","blob":"AQI=","big":"18446744073709551615"}`,
		`{"lines":[{"sku":"a","n":2,"note":{"text":"x"}},{}],"counts":{"b":2,"a":"1"}}`,
		`{"maybe":null,"price":"NaN","tags":["a","b"]}`, `{"price":-0.0,"maybe":"0"}`, `[`, ``, `null`,
		"{\"id\":\"\xff\"}", `{"lines":{"0":{}}}`, `{"a/b~c":1}`} {
		f.Add([]byte(p))
	}
	s := testProtoSchema(f, orderProto)
	md := otherDecoder(f, orderProto)
	f.Fuzz(func(t *testing.T, payload []byte) {
		verr := s.Validate(payload)
		dst := []byte{0xAA}
		out, eerr := s.Encode(dst, payload)
		if (verr == nil) != (eerr == nil) {
			t.Fatalf("Validate = %v but Encode = %v", verr, eerr)
		}
		if verr != nil {
			var v *Violation
			if !errors.As(verr, &v) || v.Schema != s.Ref || v.Reason == "" || v.Keyword == "" {
				t.Fatalf("failure %#v is not a *Violation with the schema, a reason and a keyword", verr)
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
		_, body, _ := ParseHeader(framed)
		js := decodeOther(t, md, framed, s.Ref.ID)
		again, err := s.Encode(nil, js)
		if err != nil {
			t.Fatalf("payload %q: the other library's JSON %s is refused: %v", payload, js, err)
		}
		_, body2, _ := ParseHeader(again)
		if bytes.Equal(body, body2) {
			return
		}
		// The other library's JSON leaves out a -0.0 double (it compares
		// with 0), which Protobuf runtimes write: then the two bodies must
		// still be equal messages to it.
		dm, dm2 := dynamic.NewMessage(md), dynamic.NewMessage(md)
		if dm.Unmarshal(body[1:]) != nil || dm2.Unmarshal(body2[1:]) != nil || !dynamic.MessagesEqual(dm, dm2) {
			t.Fatalf("payload %q encodes to %x; the other library reads it as %s, which encodes to %x", payload, body, js, body2)
		}
	})
}
