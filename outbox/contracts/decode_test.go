package contracts

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

type obj = map[string]any
type arr = []any

// TestDecodeJSON: the values the validator is given, for valid input of
// every kind, and an error for invalid input.
func TestDecodeJSON(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     any
	}{
		{"null", `null`, nil},
		{"true", ` true `, true},
		{"false", "\t\r\nfalse\n", false},
		{"empty string", `""`, ""},
		{"plain string", `"abc"`, "abc"},
		{"utf-8", `"é€😀"`, "é€😀"},
		{"simple escapes", `"\"\\\/\b\f\n\r\t"`, "\"\\/\b\f\n\r\t"},
		{"escape after text", `"ab\ncd"`, "ab\ncd"},
		{"unicode escape", `"\u00e9\u20AC\u0000"`, "é€\x00"},
		{"surrogate pair", `"\ud83d\ude00"`, "😀"},
		{"lone high surrogate", `"\ud83dx"`, "\ufffdx"},
		{"lone low surrogate", `"\ude00"`, "\ufffd"},
		{"high then non-low", `"\ud83d\u0041"`, "\ufffdA"},
		{"high then high then low", `"\ud83d\ud83d\ude00"`, "\ufffd😀"},
		{"high at end", `"\ud83d"`, "\ufffd"},
		{"invalid utf-8 byte", "\"a\xffb\"", "a\ufffdb"},
		{"utf-8 surrogate bytes", "\"\xed\xa0\x80\"", "\ufffd\ufffd\ufffd"},
		{"truncated utf-8", "\"\xe2\x82\"", "\ufffd\ufffd"},
		{"invalid utf-8 then escape", "\"\xff\\n\"", "\ufffd\n"},
		{"del is allowed", "\"\x7f\"", "\x7f"},
		{"zero", `0`, json.Number("0")},
		{"negative zero", `-0`, json.Number("-0")},
		{"number text kept", `[1.50, 1E+2, -2e-3, 10]`, arr{json.Number("1.50"), json.Number("1E+2"), json.Number("-2e-3"), json.Number("10")}},
		{"big number", `123456789012345678901234567890.5e400`, json.Number("123456789012345678901234567890.5e400")},
		{"empty array", `[]`, arr{}},
		{"empty object", `{ }`, obj{}},
		{"nested", `{"a":[1,{"b":null}],"c":{"d":[[]]}}`, obj{"a": arr{json.Number("1"), obj{"b": nil}}, "c": obj{"d": arr{arr{}}}}},
		{"whitespace everywhere", " { \"a\" : [ 1 , 2 ] , \"b\" : { } } ", obj{"a": arr{json.Number("1"), json.Number("2")}, "b": obj{}}},
		{"duplicate key last wins", `{"a":1,"b":2,"a":3}`, obj{"a": json.Number("3"), "b": json.Number("2")}},
		{"escaped key", `{"a\u0062":1}`, obj{"ab": json.Number("1")}},
		{"many members", `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10}`, obj{"a": json.Number("1"),
			"b": json.Number("2"), "c": json.Number("3"), "d": json.Number("4"), "e": json.Number("5"), "f": json.Number("6"),
			"g": json.Number("7"), "h": json.Number("8"), "i": json.Number("9"), "j": json.Number("10")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeJSON([]byte(tc.in))
			if err != nil {
				t.Fatalf("decodeJSON(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decodeJSON(%q) = %#v, want %#v", tc.in, got, tc.want)
			}
		})
	}
}

func TestDecodeJSONInvalid(t *testing.T) {
	for _, in := range []string{
		``, ` `, `nul`, `nulL`, `True`, `tru`, `+1`, `01`, `-`, `-a`, `1.`, `1.e3`, `.5`, `1e`, `1e+`, `0x10`,
		`NaN`, `Infinity`, `"abc`, `"\`, `"\x"`, `"\'"`, `"\u12"`, `"\u12G4"`, `"\ud83d\u12"`, "\"a\tb\"", "\"\x00\"",
		`[`, `[1`, `[1,`, `[1,]`, `[,1]`, `[1 2]`, `]`, `{`, `{"a"`, `{"a":`, `{"a":1,}`, `{,}`, `{a:1}`, `{"a" 1}`,
		`{"a":1 "b":2}`, `{'a':1}`, `{1:2}`, `{"a":1]`, `[1}`, `1 2`, `{} {}`, `[] x`, `"a" "b"`, `1,`, `null]`,
		"\ufeff{}", "{}\x00", "\v{}", "{}\u00a0",
	} {
		if v, err := decodeJSON([]byte(in)); err == nil {
			t.Errorf("decodeJSON(%q) = %#v, want an error", in, v)
		}
		if _, err := jsonschema.UnmarshalJSON(strings.NewReader(in)); err == nil {
			t.Errorf("jsonschema.UnmarshalJSON(%q) accepts it: the case is wrong", in)
		}
	}
}

// TestDecodeJSONDepth: encoding/json's limit, 10000 levels, holds; one more
// is an error, and far more is an error, not a stack overflow.
func TestDecodeJSONDepth(t *testing.T) {
	nest := func(n int, open, close string) []byte {
		inner := ""
		if open != "[" {
			inner = "1"
		}
		return []byte(strings.Repeat(open, n) + inner + strings.Repeat(close, n))
	}
	for _, c := range []struct{ open, close string }{{"[", "]"}, {`{"a":`, "}"}} {
		if _, err := decodeJSON(nest(maxDepth, c.open, c.close)); err != nil {
			t.Errorf("%d levels of %s: %v", maxDepth, c.open, err)
		}
		for _, n := range []int{maxDepth + 1, 1_000_000} {
			_, err := decodeJSON(nest(n, c.open, c.close))
			if err == nil || !strings.Contains(err.Error(), "exceeded max depth") {
				t.Errorf("%d levels of %s: err = %v, want exceeded max depth", n, c.open, err)
			}
		}
	}
	if _, err := jsonschema.UnmarshalJSON(bytes.NewReader(nest(maxDepth+1, "[", "]"))); err == nil {
		t.Errorf("UnmarshalJSON accepts %d levels: maxDepth no longer matches encoding/json", maxDepth+1)
	}
}

// TestDecodeJSONNoAliasing: the values do not share memory with the
// payload, which the caller may reuse once Check returns.
func TestDecodeJSONNoAliasing(t *testing.T) {
	p := []byte(`{"k":"value","n":12}`)
	v, err := decodeJSON(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range p {
		p[i] = 'x'
	}
	if want := (obj{"k": "value", "n": json.Number("12")}); !reflect.DeepEqual(v, want) {
		t.Fatalf("after overwriting the payload: %#v, want %#v", v, want)
	}
}

// TestCheckNotJSON: Check still reports undecodable payloads as "not JSON: ".
func TestCheckNotJSON(t *testing.T) {
	s, err := CompileJSONSchema(`{"type":"object"}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{`{"a":`, `{} x`, `{"a":"\q"}`} {
		v := s.Check([]byte(p))
		if v == nil || !strings.HasPrefix(v.Reason, "not JSON: ") {
			t.Errorf("Check(%q) = %+v, want a reason starting %q", p, v, "not JSON: ")
		}
	}
	if v := s.Check([]byte("{\"a\":\"\xff\"}")); v != nil {
		t.Errorf("invalid UTF-8 in a string is U+FFFD to encoding/json, so it fits: %+v", v)
	}
}

// FuzzDecode: decodeJSON and jsonschema.UnmarshalJSON, which it replaces,
// accept the same inputs and, when they do, give deep-equal values.
func FuzzDecode(f *testing.F) {
	for _, p := range []string{
		// the payloads of the other fuzz tests and benchmarks
		`{"id":"o1","qty":1}`, `{"id":"o1","qty":"1"}`, `{}`, `[`, ``, `null`,
		`{"id":"o1","qty":1,"lines":[{"sku":"a","a/b~c":true}]}`, "{\"id\":\"\xff\",\"qty\":1}",
		`{"i":1,"l":-9223372036854775808,"f":1.5,"d":1e300,"b":true,"s":"é"}`,
		`{"y":"AAEC","x":"AAE=","e":"B","a":[null,1,"x"],"m":{"b":1,"a":-2}}`,
		`{"dec":1e-3,"i":2e9,"l":1.0}`, `{"u":{"f.R":{"k":3}}}`,
		`{"order_id":"ord-000123","customer":"cus-4711","amount_cents":129900,"currency":"EUR","status":"PAID",` +
			`"lines":[{"sku":"sku-1","qty":2},{"sku":"sku-22","qty":1}],"note":"deliver to the back door, ring twice"}`,
		// edges of this decoder
		`"\ud83d\ude00\ud83d\u0041\ude00"`, `"a\u00e9\"\\\/\b\f\n\r\t"`, "\"\xed\xa0\x80\xf0\x9f\"", `{"a":1,"a":[]}`,
		`-0.0e-0`, `1 x`, ` [1 , {"b" : false} ] `, `{"a":1,}`, `01`, `"\u12"`, "\"\x1f\"",
	} {
		f.Add([]byte(p))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		want, werr := jsonschema.UnmarshalJSON(bytes.NewReader(in))
		got, gerr := decodeJSON(in)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("input %q: UnmarshalJSON err = %v, decodeJSON err = %v", in, werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("input %q: decodeJSON = %#v, UnmarshalJSON = %#v", in, got, want)
		}
	})
}

// BenchmarkDecode: decodeJSON against the jsonschema.UnmarshalJSON it
// replaces, on a payload of the size make bench writes.
func BenchmarkDecode(b *testing.B) {
	p := []byte(`{"order_id":"ord-000123","customer":"cus-4711","amount_cents":129900,` +
		`"currency":"EUR","status":"PAID","lines":[{"sku":"sku-1","qty":2},{"sku":"sku-22","qty":1}],` +
		`"note":"deliver to the back door, ring twice"}`)
	b.Run("decodeJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeJSON(p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("UnmarshalJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := jsonschema.UnmarshalJSON(bytes.NewReader(p)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDecodeJSONPoolClean: after a decode, success or error, the pooled
// scratch space holds no value, so no event's data is kept alive.
func TestDecodeJSONPoolClean(t *testing.T) {
	for _, in := range []string{`{"a":[1,"x",{"b":"y"}],"c":"z"}`, `{"a":[1,"x",{"b":"y"`, `[1,2,[3,"s"],4,` + "\x00"} {
		d := new(decoder)
		d.src = in
		d.value(0)
		d.release()
		for i, v := range d.vals[:cap(d.vals)] {
			if v != nil {
				t.Errorf("%q: vals[%d] = %#v after release", in, i, v)
			}
		}
		for i, k := range d.keys[:cap(d.keys)] {
			if k != "" {
				t.Errorf("%q: keys[%d] = %q after release", in, i, k)
			}
		}
	}
}
