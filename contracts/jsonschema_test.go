package contracts

import (
	"errors"
	"strings"
	"testing"
)

// orderSchema is the contract the unit tests check payloads against.
const orderSchema = `{
  "type": "object",
  "properties": {
    "id":    {"type": "string", "minLength": 1},
    "qty":   {"type": "integer", "minimum": 1},
    "state": {"enum": ["new", "paid"]},
    "lines": {"type": "array", "items": {
      "type": "object",
      "properties": {"sku": {"type": "string"}, "a/b~c": {"type": "boolean"}},
      "required": ["sku"]
    }}
  },
  "required": ["id", "qty"],
  "additionalProperties": false
}`

func testSchema(t testing.TB, text string) *Schema {
	t.Helper()
	c, err := jsonSchemaCodec{}.compile(text)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return &Schema{Ref: SchemaRef{Subject: "orders-OrderCreated", Version: 3, ID: 42}, Text: text, c: c}
}

// TestViolations: each rule's failure names the JSON pointer of the value,
// the schema keyword and what was expected; the subject and version ride on
// every violation.
func TestViolations(t *testing.T) {
	t.Parallel()
	s := testSchema(t, orderSchema)
	for _, tc := range []struct {
		name, payload              string
		pointer, keyword, inReason string
		more                       int
	}{
		{name: "wrong type", payload: `{"id":"o1","qty":"2"}`,
			pointer: "/qty", keyword: "/properties/qty/type", inReason: "got string, want integer"},
		{name: "missing required", payload: `{"id":"o1"}`,
			pointer: "/qty", keyword: "/required", inReason: "required property missing"},
		{name: "two missing", payload: `{}`,
			pointer: "/id", keyword: "/required", inReason: "missing properties 'id', 'qty'"},
		{name: "below minimum", payload: `{"id":"o1","qty":0}`,
			pointer: "/qty", keyword: "/properties/qty/minimum", inReason: "minimum"},
		{name: "enum", payload: `{"id":"o1","qty":1,"state":"lost"}`,
			pointer: "/state", keyword: "/properties/state/enum", inReason: "'new'"},
		{name: "nested item", payload: `{"id":"o1","qty":1,"lines":[{"sku":"a"},{"sku":7}]}`,
			pointer: "/lines/1/sku", keyword: "/properties/lines/items/properties/sku/type", inReason: "got number, want string"},
		{name: "escaped token", payload: `{"id":"o1","qty":1,"lines":[{"sku":"a","a/b~c":1}]}`,
			pointer: "/lines/0/a~1b~0c", keyword: "/properties/lines/items/properties/a~1b~0c/type", inReason: "want boolean"},
		{name: "additional property", payload: `{"id":"o1","qty":1,"extra":true}`,
			pointer: "", keyword: "/additionalProperties", inReason: "'extra'"},
		{name: "several, first by pointer", payload: `{"id":"","qty":"x"}`,
			pointer: "/id", keyword: "/properties/id/minLength", inReason: "minLength", more: 1},
		{name: "not an object", payload: `[1]`, pointer: "", keyword: "/type", inReason: "got array, want object"},
		{name: "not JSON", payload: `{"id":`, pointer: "", keyword: "", inReason: "not JSON"},
		{name: "trailing garbage", payload: `{"id":"o1","qty":1} x`, inReason: "not JSON"},
		{name: "empty", payload: ``, inReason: "empty payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := s.Validate([]byte(tc.payload))
			var v *Violation
			if !errors.As(err, &v) {
				t.Fatalf("Validate(%s) = %v, want a *Violation", tc.payload, err)
			}
			if v.Pointer != tc.pointer || v.Keyword != tc.keyword || !strings.Contains(v.Reason, tc.inReason) || v.More != tc.more {
				t.Fatalf("Validate(%s):\n got pointer %q keyword %q reason %q more %d\nwant pointer %q keyword %q reason containing %q more %d",
					tc.payload, v.Pointer, v.Keyword, v.Reason, v.More, tc.pointer, tc.keyword, tc.inReason, tc.more)
			}
			if v.Schema != s.Ref || !strings.Contains(v.Error(), `subject "orders-OrderCreated" version 3`) {
				t.Fatalf("violation %q does not name the subject and version %v", v.Error(), s.Ref)
			}
			if _, err := s.Encode(nil, []byte(tc.payload)); !errors.As(err, new(*Violation)) {
				t.Fatalf("Encode(%s) = %v, want the same violation as Validate", tc.payload, err)
			}
		})
	}
}

// TestValidPayloads: what fits is passed, and encoded as header + the
// payload's own bytes (no re-serialization: key order and spacing kept).
func TestValidPayloads(t *testing.T) {
	t.Parallel()
	s := testSchema(t, orderSchema)
	for _, p := range []string{
		`{"id":"o1","qty":1}`,
		`{ "qty": 12345678901234567890, "id": "o1" }`, // big integers stay integers
		`{"id":"o1","qty":2,"state":"paid","lines":[{"sku":"a","a/b~c":true}]}`,
	} {
		if err := s.Validate([]byte(p)); err != nil {
			t.Fatalf("Validate(%s) = %v", p, err)
		}
		out, err := s.Encode([]byte("prefix"), []byte(p))
		if err != nil {
			t.Fatalf("Encode(%s) = %v", p, err)
		}
		want := string(AppendHeader([]byte("prefix"), 42)) + p
		if string(out) != want {
			t.Fatalf("Encode(%s) = %q, want %q", p, out, want)
		}
	}
}

// TestSchemaRefusesLoaders: a registered schema cannot make the connector
// read a local file or call out through $ref.
func TestSchemaRefusesLoaders(t *testing.T) {
	t.Parallel()
	for _, ref := range []string{"file:///etc/passwd", "http://127.0.0.1:1/x.json", "other.json"} {
		if _, err := (jsonSchemaCodec{}).compile(`{"$ref":"` + ref + `"}`); err == nil {
			t.Fatalf("a schema with $ref %s compiled", ref)
		}
	}
	if _, err := (jsonSchemaCodec{}).compile(`{"type":"record","fields":[]}`); err == nil {
		t.Fatal("an Avro schema compiled as JSON Schema")
	}
}
