package contracts

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// avroOf compiles a record t.T with one field v of type typ: each rule is
// tested on the value of /v.
func avroOf(t testing.TB, typ string) *Schema {
	t.Helper()
	return avroSchema(t, `{"type":"record","name":"T","namespace":"t","fields":[{"name":"v","type":`+typ+`}]}`)
}

func avroSchema(t testing.TB, text string) *Schema {
	t.Helper()
	c, err := avroCodec{}.compile(text)
	if err != nil {
		t.Fatalf("compile %s: %v", text, err)
	}
	return &Schema{Ref: SchemaRef{Subject: "orders-OrderCreated", Version: 2, ID: 7}, Text: text, c: c}
}

// zz is the hex of a long's zig-zag varint, for expected bodies.
func zz(i int64) string { return hex.EncodeToString(appendLong(nil, i)) }

// avroRule is one row: value (JSON) is /v; a good value gives body (hex),
// a bad one the exact reason.
type avroRule struct {
	typ, value   string
	body, reason string
}

const (
	decimalBytes = `{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}`
	decimalFixed = `{"type":"fixed","name":"D","size":4,"logicalType":"decimal","precision":9,"scale":2}`
	union3       = `["null","int","string"]`
)

var avroRules = []avroRule{
	// int and long: integral numbers in any notation; no fraction, no wrap.
	{typ: `"int"`, value: `0`, body: "00"}, {typ: `"int"`, value: `-1`, body: "01"},
	{typ: `"int"`, value: `2.0`, body: "04"}, {typ: `"int"`, value: `1e2`, body: zz(100)},
	{typ: `"int"`, value: `2147483647`, body: "feffffff0f"}, {typ: `"int"`, value: `-2147483648`, body: "ffffffff0f"},
	{typ: `"int"`, value: `1.5`, reason: "got number 1.5, want int: not an integer"},
	{typ: `"int"`, value: `2147483648`, reason: "got number 2147483648, want int: out of range (int is 32-bit: -2147483648 to 2147483647)"},
	{typ: `"int"`, value: `1e400`, reason: "got number 1e400, want int: out of range (int is 32-bit: -2147483648 to 2147483647)"},
	{typ: `"int"`, value: `"1"`, reason: `got string "1", want an integer (int)`},
	{typ: `"int"`, value: `null`, reason: "got null, want an integer (int)"},
	{typ: `"long"`, value: `9223372036854775807`, body: "feffffffffffffffff01"},
	{typ: `"long"`, value: `-9223372036854775808`, body: "ffffffffffffffffff01"},
	{typ: `"long"`, value: `-92233720368547758.08e2`, body: "ffffffffffffffffff01"},
	{typ: `"long"`, value: `9223372036854775808`, reason: "got number 9223372036854775808, want long: out of range (long is 64-bit: -9223372036854775808 to 9223372036854775807)"},
	{typ: `"long"`, value: `12345678901234567890e-10`, reason: "got number 12345678901234567890e-10, want long: not an integer"},
	// float and double: the nearest value; beyond the largest finite, refused.
	{typ: `"float"`, value: `1.5`, body: "0000c03f"}, {typ: `"float"`, value: `1`, body: "0000803f"},
	{typ: `"float"`, value: `1e39`, reason: "got number 1e39, want float: out of range"},
	{typ: `"double"`, value: `1.5`, body: "000000000000f83f"},
	{typ: `"double"`, value: `1e309`, reason: "got number 1e309, want double: out of range"},
	{typ: `"double"`, value: `"NaN"`, reason: `got string "NaN", want a number (double)`},
	{typ: `"boolean"`, value: `true`, body: "01"},
	{typ: `"boolean"`, value: `1`, reason: "got number 1, want boolean"},
	{typ: `"null"`, value: `null`, body: ""},
	{typ: `"null"`, value: `0`, reason: "got number 0, want null"},
	{typ: `"string"`, value: `"héllo"`, body: "0c68c3a96c6c6f"},
	{typ: `"string"`, value: `5`, reason: "got number 5, want a string"},
	// bytes and fixed: base64, standard alphabet, padded.
	{typ: `"bytes"`, value: `"AAEC"`, body: "06000102"}, {typ: `"bytes"`, value: `""`, body: "00"},
	{typ: `"bytes"`, value: `"AAE"`, reason: `got string "AAE", want a base64 string (bytes): not base64: illegal base64 data at input byte 0`},
	{typ: `"bytes"`, value: `"_-8="`, reason: `got string "_-8=", want a base64 string (bytes): not base64: illegal base64 data at input byte 0`},
	{typ: `{"type":"fixed","name":"F","size":2}`, value: `"AAE="`, body: "0001"},
	{typ: `{"type":"fixed","name":"F","size":2}`, value: `"AAEC"`, reason: "got 3 bytes in base64, want a base64 string (fixed t.F of 2 bytes)"},
	{typ: `{"type":"enum","name":"E","symbols":["A","B"]}`, value: `"B"`, body: "02"},
	{typ: `{"type":"enum","name":"E","symbols":["A","B"]}`, value: `"b"`, reason: `got string "b", want a symbol of enum t.E: A, B`},
	// unions: the first branch the plain value fits; the wrapped form only
	// when none does.
	{typ: union3, value: `null`, body: "00"}, {typ: union3, value: `5`, body: "020a"},
	{typ: union3, value: `"x"`, body: "040278"}, {typ: union3, value: `{"int":5}`, body: "020a"},
	{typ: union3, value: `{"string":"5"}`, body: "040235"},
	{typ: union3, value: `true`, reason: "got boolean true, want a value of union [null, int, string]"},
	{typ: union3, value: `{"long":5}`, reason: "got object, want a value of union [null, int, string]"},
	{typ: `["string","int"]`, value: `"5"`, body: "000235"},
	{typ: `["double","int"]`, value: `5`, body: "000000000000001440"},
	{typ: `["int","double"]`, value: `5.5`, body: "020000000000001640"},
	{typ: `["null",{"type":"map","values":"int"}]`, value: `{"null":1}`, body: "020208" + hex.EncodeToString([]byte("null")) + "0200"},
	{typ: `["null",{"type":"map","values":"int"}]`, value: `{"null":null}`, body: "00"}, // no plain fit: wrapped
	// date, times, timestamps: text or the base integer; never truncated.
	{typ: `{"type":"int","logicalType":"date"}`, value: `"2024-05-01"`, body: zz(19844)},
	{typ: `{"type":"int","logicalType":"date"}`, value: `"1969-12-31"`, body: zz(-1)},
	{typ: `{"type":"int","logicalType":"date"}`, value: `19844`, body: zz(19844)},
	{typ: `{"type":"int","logicalType":"date"}`, value: `"2024-5-1"`, reason: `got string "2024-5-1", want date: a date "YYYY-MM-DD" or an integer of days since 1970-01-01`},
	{typ: `{"type":"int","logicalType":"time-millis"}`, value: `"12:00:00.5"`, body: zz(43_200_500)},
	{typ: `{"type":"int","logicalType":"time-millis"}`, value: `"12:00:00.0005"`, reason: `got string "12:00:00.0005", want time-millis: more precise than a millisecond`},
	{typ: `{"type":"int","logicalType":"time-millis"}`, value: `86400000`, reason: "got number 86400000, want time-millis: out of range (a time of day: 0 to 86399999)"},
	{typ: `{"type":"long","logicalType":"time-micros"}`, value: `"00:00:01.000001"`, body: zz(1_000_001)},
	{typ: `{"type":"long","logicalType":"timestamp-millis"}`, value: `"2024-05-01T12:00:00.123Z"`, body: zz(1714564800123)},
	{typ: `{"type":"long","logicalType":"timestamp-millis"}`, value: `"2024-05-01T14:00:00.123+02:00"`, body: zz(1714564800123)},
	{typ: `{"type":"long","logicalType":"timestamp-millis"}`, value: `1714564800123`, body: zz(1714564800123)},
	{typ: `{"type":"long","logicalType":"timestamp-millis"}`, value: `"2024-05-01T12:00:00.1234Z"`, reason: `got string "2024-05-01T12:00:00.1234Z", want timestamp-millis: more precise than a millisecond`},
	{typ: `{"type":"long","logicalType":"timestamp-millis"}`, value: `"2024-05-01 12:00"`, reason: `got string "2024-05-01 12:00", want timestamp-millis: an RFC 3339 date-time such as 2024-05-01T12:00:00.123Z or an integer of milliseconds since the epoch`},
	{typ: `{"type":"long","logicalType":"timestamp-micros"}`, value: `"2024-05-01T12:00:00.123456Z"`, body: zz(1714564800123456)},
	{typ: `{"type":"long","logicalType":"local-timestamp-millis"}`, value: `"2024-05-01T12:00:00.123"`, body: zz(1714564800123)},
	{typ: `{"type":"long","logicalType":"local-timestamp-millis"}`, value: `"2024-05-01T12:00:00Z"`, reason: `got string "2024-05-01T12:00:00Z", want local-timestamp-millis: a date-time without offset such as 2024-05-01T12:00:00.123 or an integer of milliseconds`},
	// decimal: exact, scale and precision checked, two's complement.
	{typ: decimalBytes, value: `12.3`, body: "0404ce"}, {typ: decimalBytes, value: `"12.30"`, body: "0404ce"},
	{typ: decimalBytes, value: `-1`, body: "029c"}, {typ: decimalBytes, value: `0`, body: "0200"},
	{typ: decimalBytes, value: `1e2`, body: "042710"}, {typ: decimalBytes, value: `9999999.99`, body: "083b9ac9ff"},
	{typ: decimalBytes, value: `1.234`, reason: "got number 1.234, want decimal(9,2): more than 2 digits after the decimal point"},
	{typ: decimalBytes, value: `12345678.9`, reason: "got number 12345678.9, want decimal(9,2): more than 9 digits in all (precision)"},
	{typ: decimalBytes, value: `"12,3"`, reason: `got string "12,3", want decimal(9,2): a number or a string such as "12.30"`},
	{typ: decimalFixed, value: `-1`, body: "ffffff9c"}, {typ: decimalFixed, value: `"0.01"`, body: "00000001"},
	{typ: `{"type":"string","logicalType":"uuid"}`, value: `"123e4567-e89b-12d3-A456-426614174000"`, body: "48" + hex.EncodeToString([]byte("123e4567-e89b-12d3-A456-426614174000"))},
	{typ: `{"type":"string","logicalType":"uuid"}`, value: `"123e4567e89b12d3a456426614174000"`, reason: `got string "123e4567e89b12d3a456426614174000", want uuid: a string such as 123e4567-e89b-12d3-a456-426614174000`},
	// containers: one block, map keys sorted; the pointer goes inside.
	{typ: `{"type":"array","items":"int"}`, value: `[1,2]`, body: "04020400"},
	{typ: `{"type":"array","items":"int"}`, value: `[]`, body: "00"},
	{typ: `{"type":"map","values":"long"}`, value: `{"b":1,"a":2}`, body: "0402610402620200"},
	{typ: `{"type":"map","values":"long"}`, value: `[]`, reason: "got array, want an object (map)"},
	{typ: `{"type":"array","items":"int"}`, value: `{}`, reason: "got object, want an array"},
}

// TestAvroRules: each JSON → Avro rule, a good value's exact body and a bad
// one's exact reason; the pointer is /v for the value itself.
func TestAvroRules(t *testing.T) {
	t.Parallel()
	for _, r := range avroRules {
		s := avroOf(t, r.typ)
		payload := []byte(`{"v":` + r.value + `}`)
		out, err := s.Encode([]byte{0xAA}, payload)
		verr := s.Validate(payload)
		if (err == nil) != (verr == nil) {
			t.Errorf("%s %s: Encode %v but Validate %v", r.typ, r.value, err, verr)
		}
		if r.reason == "" {
			if err != nil {
				t.Errorf("%s %s: %v", r.typ, r.value, err)
				continue
			}
			if got := hex.EncodeToString(out[1+HeaderSize:]); got != r.body {
				t.Errorf("%s %s: body %s, want %s", r.typ, r.value, got, r.body)
			}
			decodesWithGoavro(t, s, out[1+HeaderSize:])
			continue
		}
		var v *Violation
		if !errors.As(err, &v) || !bytes.Equal(out, []byte{0xAA}) {
			t.Errorf("%s %s: %v (dst %x); want a violation, dst unchanged", r.typ, r.value, err, out)
			continue
		}
		if v.Reason != r.reason || !strings.HasPrefix(v.Pointer, "/v") || v.Keyword != "t.T.v" || v.Schema != s.Ref {
			t.Errorf("%s %s:\n got %q at %q (%s)\nwant %q at /v", r.typ, r.value, v.Reason, v.Pointer, v.Keyword, r.reason)
		}
	}
}

// decodesWithGoavro: another implementation reads the body whole.
func decodesWithGoavro(t *testing.T, s *Schema, body []byte) any {
	t.Helper()
	codec, err := goavro.NewCodec(s.Text)
	if err != nil {
		t.Fatalf("goavro cannot read the schema: %v", err)
	}
	native, rest, err := codec.NativeFromBinary(body)
	if err != nil || len(rest) != 0 {
		t.Errorf("goavro decoding %x: %v, %d bytes left", body, err, len(rest))
	}
	return native
}

const avroOrder = `{"type":"record","name":"Order","namespace":"com.acme","fields":[
  {"name":"id","type":"string"},
  {"name":"qty","type":"int","default":1},
  {"name":"note","type":["null","string"],"default":null},
  {"name":"tags","type":{"type":"array","items":"string"},"default":["a"]},
  {"name":"price","type":` + decimalBytes + `,"default":"\u0004\u00ce"},
  {"name":"line","type":{"type":"record","name":"Line","fields":[
    {"name":"sku","type":"string"},{"name":"n","type":"long","default":0}]}},
  {"name":"lines","type":{"type":"array","items":"Line"},"default":[]}
]}`

// TestAvroRecords: missing fields with a default take it (the schema's
// bytes, as goavro reads them back); missing required fields and unknown
// fields are violations pointing where the field is or should be.
func TestAvroRecords(t *testing.T) {
	t.Parallel()
	s := avroSchema(t, avroOrder)
	out, err := s.Encode(nil, []byte(`{"id":"o1","line":{"sku":"s"}}`))
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	got, ok := decodesWithGoavro(t, s, out[HeaderSize:]).(map[string]any)
	if !ok || got["qty"] != int32(1) || got["note"] != nil || len(got["tags"].([]any)) != 1 ||
		got["tags"].([]any)[0] != "a" || got["line"].(map[string]any)["n"] != int64(0) {
		t.Fatalf("defaults decoded as %v", got)
	}
	if p := got["price"].(interface{ FloatString(int) string }).FloatString(2); p != "12.30" {
		t.Fatalf("decimal default decoded as %s, want 12.30", p)
	}
	for _, tc := range []struct{ payload, pointer, keyword, reason string }{
		{`{"line":{"sku":"s"}}`, "/id", "com.acme.Order.id",
			`missing field "id" of type string (required: the schema gives it no default)`},
		{`{"id":"o1","line":{"sku":"s","x":1,"a":2}}`, "/line/a", "com.acme.Line",
			`unknown field "a": record com.acme.Line has no such field`},
		{`{"id":"o1","line":{"sku":"s"},"lines":[{"sku":"a"},{"sku":7}]}`, "/lines/1/sku", "com.acme.Line.sku",
			"got number 7, want a string"},
		{`{"id":"o1","line":{"sku":"s"},"note":{"string":1}}`, "/note/string", "com.acme.Order.note",
			"got number 1, want a string"},
		{`["o1"]`, "", "", "got array, want an object (record com.acme.Order)"},
		{`{"id":"o1"} {}`, "", "", "not JSON: data after the value"},
		{"{\"id\":\"\xff\"}", "", "", "not JSON: invalid UTF-8"},
		{` `, "", "", "empty payload, want a JSON value"},
	} {
		err := s.Validate([]byte(tc.payload))
		var v *Violation
		if !errors.As(err, &v) || v.Pointer != tc.pointer || v.Keyword != tc.keyword || v.Reason != tc.reason {
			t.Errorf("%s: %v\nwant at %q (%s): %s", tc.payload, err, tc.pointer, tc.keyword, tc.reason)
		}
	}
}

// TestAvroEscapedPointer: map keys and field names are RFC 6901 tokens.
func TestAvroEscapedPointer(t *testing.T) {
	t.Parallel()
	s := avroOf(t, `{"type":"map","values":"int"}`)
	var v *Violation
	if err := s.Validate([]byte(`{"v":{"a/b~c":"x"}}`)); !errors.As(err, &v) || v.Pointer != "/v/a~1b~0c" {
		t.Fatalf("%v; want a violation at /v/a~1b~0c", err)
	}
}

// TestAvroRecursive: a recursive type follows the payload as deep as it
// goes, and a recursive field with a default is fine.
func TestAvroRecursive(t *testing.T) {
	t.Parallel()
	s := avroSchema(t, `{"type":"record","name":"List","fields":[{"name":"value","type":"int"},
		{"name":"next","type":["null","List"],"default":null}]}`)
	out, err := s.Encode(nil, []byte(`{"value":1,"next":{"value":2,"next":{"value":3}}}`))
	if err != nil || hex.EncodeToString(out[HeaderSize:]) != "02"+"02"+"04"+"02"+"06"+"00" {
		t.Fatalf("list: %x, %v", out, err)
	}
	decodesWithGoavro(t, s, out[HeaderSize:])
	var v *Violation
	if err := s.Validate([]byte(`{"value":1,"next":{"value":"2"}}`)); !errors.As(err, &v) || v.Pointer != "/next" {
		t.Fatalf("%v; want a violation at /next (no branch fits)", err)
	}
}

// TestAvroDeterministic: the same payload (whatever its key order) makes
// the same bytes, which replays and exactly_once retries rely on.
func TestAvroDeterministic(t *testing.T) {
	t.Parallel()
	s := avroOf(t, `{"type":"map","values":{"type":"map","values":"int"}}`)
	want, err := s.Encode(nil, []byte(`{"v":{"b":{"y":1,"x":2},"a":{"z":3,"c":4}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		got, err := s.Encode(nil, []byte(`{"v":{"a":{"c":4,"z":3},"b":{"x":2,"y":1}}}`))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%x, %v; want %x", got, err, want)
		}
	}
}

// TestAvroSchemas: what compiles and what does not. Names are per schema:
// a name defined in one schema does not resolve in another.
func TestAvroSchemas(t *testing.T) {
	t.Parallel()
	avroSchema(t, `{"type":"record","name":"Money","namespace":"shared","fields":[{"name":"c","type":"long"}]}`)
	for _, bad := range []string{
		`{"type":"record","name":"X","fields":[{"name":"m","type":"shared.Money"}]}`,
		`{"type":"object"}`,
		`{"type":"record","name":"X","fields":[{"name":"n","type":"int","default":"one"}]}`,
		`not json`,
	} {
		if _, err := (avroCodec{}).compile(bad); err == nil {
			t.Errorf("compiled %s", bad)
		}
	}
	// An unknown logical type is ignored: the base type's rules apply.
	s := avroOf(t, `{"type":"string","logicalType":"iso-country"}`)
	if err := s.Validate([]byte(`{"v":"anything"}`)); err != nil {
		t.Fatal(err)
	}
}

// TestAvroStepBudget: a payload whose union matching would cost far more
// than its size (forty record branches that differ only in a tag after a
// long array, the fitting one last) is refused with a reason, not left to
// run; the bound grows with the payload (stepBudget), so the same shape
// with four branches passes (TestReview9AvroStepBudgetDeadLettersFittingEvent).
func TestAvroStepBudget(t *testing.T) {
	t.Parallel()
	var branches []string
	for i := range 40 {
		name := "B" + strconv.Itoa(i)
		branches = append(branches, `{"type":"record","name":"`+name+`","fields":[`+
			`{"name":"vals","type":{"type":"array","items":"long"}},`+
			`{"name":"tag","type":{"type":"enum","name":"Tag`+name+`","symbols":["t`+strconv.Itoa(i)+`"]}}]}`)
	}
	s := avroOf(t, `{"type":"array","items":[`+strings.Join(branches, ",")+`]}`)
	payload := []byte(`{"v":[{"vals":[` + strings.Repeat("1,", 100_000) + `1],"tag":"t39"}]}`)
	var v *Violation
	if err := s.Validate(payload); !errors.As(err, &v) || !strings.Contains(v.Reason, "too complex") {
		t.Fatalf("%v; want the step budget's violation", err)
	}
}

// TestAvroThroughRegistry: contracts.format avro resolves an AVRO schema
// and encodes with its id; a schema of another type under the subject is
// ErrBadSchema naming both; auto registers with schemaType AVRO.
func TestAvroThroughRegistry(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	fake.SeedSchema(subject, 1, 9, sr.Schema{Schema: avroOrder, Type: sr.TypeAvro})
	fake.SeedSchema("orders-Json", 1, 10, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, _ := newTestContracts(t, fake.URL(), Config{Format: FormatAvro, Mode: ModeEncode, Strategy: StrategyRecord})
	res, err := c.Apply(ctx, "t", subject, []byte(`{"id":"o1","line":{"sku":"s"}}`))
	if err != nil || res.Schema.ID != 9 || !bytes.HasPrefix(res.Value, AppendHeader(nil, 9)) {
		t.Fatalf("apply: %x %v, %v", res.Value, res.Schema, err)
	}
	if _, err := c.Apply(ctx, "t", "orders-Json", []byte(`{}`)); !errors.Is(err, ErrBadSchema) ||
		!strings.Contains(err.Error(), "is a JSON schema, not AVRO") {
		t.Fatalf("a JSON schema under avro: %v; want ErrBadSchema", err)
	}
	auto, _ := newTestContracts(t, fake.URL(), Config{Format: FormatAvro, Strategy: StrategyRecord, Resolution: ResolutionAuto,
		Schemas: func(s string) (string, bool) { return avroOrder, s == "orders-Auto" }})
	if _, err := auto.Apply(ctx, "t", "orders-Auto", []byte(`{"id":"o1","line":{"sku":"s"}}`)); err != nil {
		t.Fatalf("auto: %v", err)
	}
	ss, err := auto.Registry().Client().SchemaByVersion(ctx, "orders-Auto", -1)
	if err != nil || ss.Type != sr.TypeAvro {
		t.Fatalf("auto registered %+v, %v; want schemaType AVRO", ss, err)
	}
}

// BenchmarkAvro: the per-event cost of validate and encode, for
// make bench's contracts rows.
func BenchmarkAvro(b *testing.B) {
	s := avroSchema(b, avroOrder)
	payload := []byte(`{"id":"o1","qty":3,"note":"gift","tags":["a","b"],"price":"19.90","line":{"sku":"s-1","n":2},
		"lines":[{"sku":"a","n":1},{"sku":"b","n":2}]}`)
	b.Run("validate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Validate(payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 256)
		for b.Loop() {
			if _, err := s.Encode(buf[:0], payload); err != nil {
				b.Fatal(err)
			}
		}
	})
}
