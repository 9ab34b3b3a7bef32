package contracts

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/jhump/protoreflect/desc"
	"github.com/jhump/protoreflect/desc/protoparse"
	"github.com/jhump/protoreflect/dynamic"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// orderProto is the Protobuf contract of the unit tests: every protojson
// rule the conversion relies on has a field here.
const orderProto = `syntax = "proto3";
package shop.v1;

import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

message Order {
  string id = 1;
  int64 qty = 2;
  State state = 3;
  google.protobuf.Timestamp placed_at = 4;
  bytes blob = 5;
  repeated Line lines = 6;
  map<string, int32> counts = 7;
  uint64 big = 8;
  google.protobuf.Int64Value maybe = 9;
  double price = 10;
  repeated string tags = 11;

  message Line {
    string sku = 1;
    int32 n = 2;
    message Note { string text = 1; }
    Note note = 3;
  }
}

enum State {
  STATE_UNSPECIFIED = 0;
  NEW = 1;
  PAID = 2;
}

message Refund { string order_id = 1; }
`

func testProtoSchema(t testing.TB, text string) *Schema {
	t.Helper()
	c, err := protobufCodec{}.compile(text)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return &Schema{Ref: SchemaRef{Subject: "orders-OrderCreated", Version: 2, ID: 77}, Text: text, c: c}
}

// otherDecoder compiles text with jhump/protoreflect and decodes with its
// dynamic message: a binary decoder other than the encoder's
// (google.golang.org/protobuf), so a body both agree on is the wire format,
// not one library's reading of itself.
func otherDecoder(t testing.TB, text string) *desc.MessageDescriptor {
	t.Helper()
	fds, err := protoparse.Parser{Accessor: protoparse.FileContentsFromMap(map[string]string{"o.proto": text})}.ParseFiles("o.proto")
	if err != nil {
		t.Fatalf("protoparse: %v", err)
	}
	return fds[0].GetMessageTypes()[0]
}

// decodeOther splits a framed value and decodes it with the other library;
// it returns the message as that library's JSON.
func decodeOther(t testing.TB, md *desc.MessageDescriptor, framed []byte, wantID int) []byte {
	t.Helper()
	id, body, err := ParseHeader(framed)
	if err != nil || id != wantID {
		t.Fatalf("header of %x: id %d, %v; want id %d", framed, id, err, wantID)
	}
	idx, msg, err := parseMessageIndexes(body)
	if err != nil || !reflect.DeepEqual(idx, []int{0}) || body[0] != 0 {
		t.Fatalf("message indexes of %x: %v, %v; want the single byte 0", body, idx, err)
	}
	dm := dynamic.NewMessage(md)
	if err := dm.Unmarshal(msg); err != nil {
		t.Fatalf("the other library cannot decode %x: %v", msg, err)
	}
	js, err := dm.MarshalJSON()
	if err != nil {
		t.Fatalf("the other library's JSON: %v", err)
	}
	return js
}

func jsonEqual(t testing.TB, got []byte, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want %s: %v", want, err)
	}
	return reflect.DeepEqual(g, w)
}

// TestProtobufConversion: each protojson rule, checked by decoding the
// encoded body with the other library; want is its JSON (camelCase names,
// 64-bit integers as strings, enums by name, defaults left out).
func TestProtobufConversion(t *testing.T) {
	t.Parallel()
	s := testProtoSchema(t, orderProto)
	md := otherDecoder(t, orderProto)
	for _, tc := range []struct{ name, payload, want string }{
		{"empty object", `{}`, `{}`},
		{"int64 as number", `{"qty":12}`, `{"qty":"12"}`},
		{"int64 as string", `{"qty":"-9007199254740993"}`, `{"qty":"-9007199254740993"}`},
		{"int64 as exponent", `{"qty":1e3}`, `{"qty":"1000"}`},
		{"uint64 max", `{"big":"18446744073709551615"}`, `{"big":"18446744073709551615"}`},
		{"enum by name", `{"state":"PAID"}`, `{"state":"PAID"}`},
		{"enum by number", `{"state":2}`, `{"state":"PAID"}`},
		{"timestamp", `{"placedAt":"2024-05-01T12:00:00.5+02:00"}`, `{"placedAt":"2024-05-01T10:00:00.500Z"}`},
		{"proto name", `{"placed_at":"2024-05-01T12:00:00Z"}`, `{"placedAt":"2024-05-01T12:00:00Z"}`},
		{"bytes base64", `{"blob":"AQL/"}`, `{"blob":"AQL/"}`},
		{"bytes url-safe", `{"blob":"AQL_"}`, `{"blob":"AQL/"}`},
		{"nested and repeated", `{"lines":[{"sku":"a","n":2,"note":{"text":"x"}},{}]}`,
			`{"lines":[{"sku":"a","n":2,"note":{"text":"x"}},{}]}`},
		{"map", `{"counts":{"b":2,"a":"1"}}`, `{"counts":{"a":1,"b":2}}`},
		{"wrapper", `{"maybe":"5"}`, `{"maybe":"5"}`},
		{"wrapper zero is set", `{"maybe":0}`, `{"maybe":"0"}`},
		{"null is unset", `{"id":null,"lines":null,"maybe":null}`, `{}`},
		{"double special", `{"price":"Infinity"}`, `{"price":"Infinity"}`},
		{"defaults left out", `{"id":"","qty":0,"state":"STATE_UNSPECIFIED"}`, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := s.Validate([]byte(tc.payload)); err != nil {
				t.Fatalf("Validate(%s) = %v", tc.payload, err)
			}
			out, err := s.Encode(nil, []byte(tc.payload))
			if err != nil {
				t.Fatalf("Encode(%s) = %v", tc.payload, err)
			}
			if got := decodeOther(t, md, out, 77); !jsonEqual(t, got, tc.want) {
				t.Fatalf("Encode(%s) decodes to %s, want %s", tc.payload, got, tc.want)
			}
		})
	}
}

// TestProtobufDeterministic: the same meaning gives the same bytes whatever
// the key order (map entries are sorted), call after call.
func TestProtobufDeterministic(t *testing.T) {
	t.Parallel()
	s := testProtoSchema(t, orderProto)
	a, err := s.Encode(nil, []byte(`{"id":"o1","counts":{"z":1,"a":2,"m":3},"qty":"4"}`))
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		b, err := s.Encode(nil, []byte(`{"qty":4,"counts":{"m":3,"a":2,"z":1},"id":"o1"}`))
		if err != nil || !bytes.Equal(a, b) {
			t.Fatalf("encodings differ: %x and %x (%v)", a, b, err)
		}
	}
}

// TestProtobufViolations: protojson's errors become a JSON pointer, the
// field's full name and what the field wants.
func TestProtobufViolations(t *testing.T) {
	t.Parallel()
	s := testProtoSchema(t, orderProto)
	for _, tc := range []struct {
		name, payload, pointer, keyword string
		inReason                        []string
	}{
		{"int64 from a word", `{"id":"o1","qty":"x"}`, "/qty", "shop.v1.Order.qty",
			[]string{`invalid value for int64 field qty: "x"`, "want an integer in int64 range"}},
		{"int64 fraction", `{"qty":1.5}`, "/qty", "shop.v1.Order.qty", []string{"want an integer"}},
		{"bool for string", `{"id":true}`, "/id", "shop.v1.Order.id", []string{"want a string"}},
		{"unknown field", `{"id":"o1","extra":{"a":1}}`, "/extra", "shop.v1.Order",
			[]string{`unknown field "extra"`, "want a field of message shop.v1.Order"}},
		{"unknown escaped", `{"a/b~c":1}`, "/a~1b~0c", "shop.v1.Order", []string{"unknown field"}},
		{"unknown nested", `{"lines":[{"sku":"a","qty":1}]}`, "/lines/0/qty", "shop.v1.Order.Line",
			[]string{"want a field of message shop.v1.Order.Line"}},
		{"enum name", `{"state":"LOST"}`, "/state", "shop.v1.Order.state",
			[]string{"want a name of enum shop.v1.State (STATE_UNSPECIFIED, NEW, PAID) or its number"}},
		{"timestamp", `{"placedAt":"yesterday"}`, "/placedAt", "shop.v1.Order.placed_at", []string{"RFC 3339"}},
		{"bytes", `{"blob":"!!"}`, "/blob", "shop.v1.Order.blob", []string{"want a base64 string"}},
		{"repeated element", `{"lines":[{"sku":"a"},{"sku":7}]}`, "/lines/1/sku", "shop.v1.Order.Line.sku",
			[]string{"want a string"}},
		{"deep nested", `{"lines":[{"note":{"text":[]}}]}`, "/lines/0/note/text", "shop.v1.Order.Line.Note.text",
			[]string{"want a string"}},
		{"scalar list element", `{"tags":["a",1]}`, "/tags/1", "shop.v1.Order.tags", []string{"want a string"}},
		{"object for array", `{"lines":{}}`, "/lines", "shop.v1.Order.lines",
			[]string{"want a JSON array of a JSON object (message shop.v1.Order.Line)"}},
		{"map value", `{"counts":{"a":"x"}}`, "/counts/a", "shop.v1.Order.counts", []string{"want an integer in int32 range"}},
		{"int32 overflow", `{"lines":[{"n":2147483648}]}`, "/lines/0/n", "shop.v1.Order.Line.n", []string{"int32"}},
		{"uint64 negative", `{"big":-1}`, "/big", "shop.v1.Order.big", []string{"uint64"}},
		{"wrapper", `{"maybe":"x"}`, "/maybe", "shop.v1.Order.maybe", []string{"want an integer in int64 range"}},
		{"duplicate", `{"id":"a","id":"b"}`, "/id", "shop.v1.Order.id", []string{"duplicate field"}},
		{"multi-line", "{\n  \"id\": \"o1\",\n  \"qty\": true\n}", "/qty", "shop.v1.Order.qty", []string{"int64"}},
		{"runes before", `{"id":"ééé日本","qty":"x"}`, "/qty", "shop.v1.Order.qty", []string{"int64"}},
		{"invalid UTF-8", "{\"id\":\"\xff\"}", "/id", "shop.v1.Order.id", []string{"UTF-8"}},
		{"not an object", `[1]`, "", "shop.v1.Order", []string{"want a JSON object (message shop.v1.Order)"}},
		{"not JSON", `{"id":`, "", "shop.v1.Order", []string{"not JSON"}},
		{"trailing garbage", `{"id":"o1"} x`, "", "shop.v1.Order", []string{"not JSON"}},
		{"empty", ` `, "", "shop.v1.Order", []string{"empty payload, want a JSON object (message shop.v1.Order)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := s.Validate([]byte(tc.payload))
			var v *Violation
			if !errors.As(err, &v) {
				t.Fatalf("Validate(%s) = %v, want a *Violation", tc.payload, err)
			}
			ok := v.Pointer == tc.pointer && v.Keyword == tc.keyword && v.Schema == s.Ref
			for _, r := range tc.inReason {
				ok = ok && strings.Contains(v.Reason, r)
			}
			if !ok {
				t.Fatalf("Validate(%q):\n got pointer %q keyword %q reason %q\nwant pointer %q keyword %q reason containing %q",
					tc.payload, v.Pointer, v.Keyword, v.Reason, tc.pointer, tc.keyword, tc.inReason)
			}
			if out, err := s.Encode([]byte{1}, []byte(tc.payload)); !errors.As(err, new(*Violation)) || !bytes.Equal(out, []byte{1}) {
				t.Fatalf("Encode(%s) = %x, %v; want dst unchanged and a violation", tc.payload, out, err)
			}
		})
	}
}

// TestMessageIndexes: the path of a message from the file's root, encoded
// as Confluent's serializers do (zig-zag varints: the count, then each
// index; the first message is the single byte 0), and read back.
func TestMessageIndexes(t *testing.T) {
	t.Parallel()
	c, err := protobufCodec{}.compile(orderProto)
	if err != nil {
		t.Fatal(err)
	}
	file := c.(*protoCompiled).typ.Descriptor().ParentFile()
	order := file.Messages().ByName("Order")
	line := order.Messages().ByName("Line")
	for _, tc := range []struct {
		name string
		idx  []int
		want []byte
	}{
		{"first message", messageIndexes(order), []byte{0}},
		// Order's nested messages are CountsEntry (the map field's entry,
		// declared where the field is) then Line: Line is [0, 1].
		{"nested message", messageIndexes(line), []byte{4, 0, 2}},
		{"nested twice", messageIndexes(line.Messages().ByName("Note")), []byte{6, 0, 2, 0}},
		{"second top-level", messageIndexes(file.Messages().ByName("Refund")), []byte{2, 2}},
		{"index 64 (two-byte varint)", []int{64}, []byte{2, 0x80, 0x01}},
	} {
		got := appendMessageIndexes([]byte{0xAA}, tc.idx)
		if !bytes.Equal(got[1:], tc.want) || got[0] != 0xAA {
			t.Errorf("%s: indexes %v encode to %x, want %x", tc.name, tc.idx, got[1:], tc.want)
			continue
		}
		back, rest, err := parseMessageIndexes(append(got[1:], 'm'))
		if err != nil || !reflect.DeepEqual(back, tc.idx) || string(rest) != "m" {
			t.Errorf("%s: %x reads back as %v, %q, %v; want %v", tc.name, tc.want, back, rest, err, tc.idx)
		}
	}
	// [0] written long, as some serializers do, reads as the first message.
	if idx, _, err := parseMessageIndexes([]byte{2, 0}); err != nil || !reflect.DeepEqual(idx, []int{0}) {
		t.Errorf("0x02 0x00: %v, %v", idx, err)
	}
	for _, bad := range [][]byte{{}, {0x80}, {1}, {2}, {0xCA, 0x01}, {4, 0, 3}, {2, 0x80}} {
		if idx, _, err := parseMessageIndexes(bad); !errors.Is(err, ErrNotFramed) {
			t.Errorf("%x: %v, %v; want ErrNotFramed", bad, idx, err)
		}
	}
}

// TestProtobufCompile: well-known imports compile; any other import is a
// schema reference, refused with a reason; so are a file without messages
// and one that does not parse.
func TestProtobufCompile(t *testing.T) {
	t.Parallel()
	wkt := `syntax = "proto3";
import "google/protobuf/any.proto"; import "google/protobuf/duration.proto"; import "google/protobuf/struct.proto";
import "google/protobuf/empty.proto"; import "google/protobuf/field_mask.proto";
message E { google.protobuf.Duration d = 1; google.protobuf.Struct s = 2; google.protobuf.Any a = 3;
  google.protobuf.Empty e = 4; google.protobuf.FieldMask m = 5; google.protobuf.Value v = 6; }`
	s := testProtoSchema(t, wkt)
	if err := s.Validate([]byte(`{"d":"1.5s","s":{"a":[1,"x",null]},"e":{},"m":"a.b,c","v":3,
		"a":{"@type":"type.googleapis.com/google.protobuf.Duration","value":"2s"}}`)); err != nil {
		t.Fatalf("well-known types: %v", err)
	}
	for _, tc := range []struct{ text, inErr string }{
		{`syntax = "proto3"; import "common/money.proto"; message M { string a = 1; }`,
			`import "common/money.proto": schema references are not supported`},
		{`syntax = "proto3"; enum E { A = 0; }`, "declares no message"},
		{`syntax = "proto3"; message M { strin a = 1; }`, "not a valid .proto file"},
		{`{"type":"object"}`, "not a valid .proto file"},
	} {
		if _, err := (protobufCodec{}).compile(tc.text); err == nil || !strings.Contains(err.Error(), tc.inErr) {
			t.Errorf("compile(%s) = %v, want an error saying %q", tc.text, err, tc.inErr)
		}
	}
	// proto2 required: no position from protojson, the field's place.
	p2 := testProtoSchema(t, `syntax = "proto2"; package p; message R { required string order_id = 1; optional R next = 2; }`)
	var v *Violation
	if err := p2.Validate([]byte(`{"next":{"orderId":"a"}}`)); !errors.As(err, &v) || v.Pointer != "/orderId" ||
		v.Keyword != "p.R.order_id" || !strings.Contains(v.Reason, "required field p.R.order_id not set") {
		t.Fatalf("proto2 required: %#v", err)
	}
	if err := p2.Validate([]byte(`{"order_id":"a","next":{}}`)); !errors.As(err, &v) || v.Pointer != "" || v.Keyword != "p.R.order_id" {
		t.Fatalf("proto2 required, nested: %#v", err)
	}
	// An Any naming a type this binary links in, but the schema does not
	// import, is refused: the schema alone decides what fits.
	if err := s.Validate([]byte(`{"a":{"@type":"type.googleapis.com/opentelemetry.proto.common.v1.AnyValue"}}`)); err == nil {
		t.Fatal("an Any of a type outside the schema was accepted")
	}
}

// TestProtobufThroughApply: format protobuf resolves PROTOBUF schemas and
// frames header + indexes + message; a subject holding another format's
// schema is ErrBadSchema naming both, not a violation of every event.
func TestProtobufThroughApply(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	fake.SeedSchema(subject, 1, 9, sr.Schema{Schema: orderProto, Type: sr.TypeProtobuf})
	fake.SeedSchema("outbox.event.order-OrderPaid", 1, 10, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, _ := newTestContracts(t, fake.URL(), Config{Format: FormatProtobuf, Mode: ModeEncode})
	res, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", []byte(`{"id":"o1"}`))
	want := append(AppendHeader(nil, 9), 0, 0x0a, 2, 'o', '1') // indexes [0], field 1 "o1"
	if err != nil || !bytes.Equal(res.Value, want) {
		t.Fatalf("Apply = %x, %v; want %x", res.Value, err, want)
	}
	_, err = c.Apply(ctx, "outbox.event.order", "OrderPaid", []byte(`{"id":"o1"}`))
	if !errors.Is(err, ErrBadSchema) || !strings.Contains(err.Error(), "is a JSON schema, not PROTOBUF") {
		t.Fatalf("JSON Schema under format protobuf: %v; want ErrBadSchema naming both", err)
	}
}
