package contracts

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
)

// fuzzAvroSchema has a field of every rule the converter applies.
const fuzzAvroSchema = `{"type":"record","name":"E","namespace":"f","fields":[
  {"name":"i","type":"int","default":0},
  {"name":"l","type":"long","default":0},
  {"name":"f","type":"float","default":0},
  {"name":"d","type":"double","default":0},
  {"name":"b","type":"boolean","default":false},
  {"name":"s","type":"string","default":""},
  {"name":"y","type":"bytes","default":""},
  {"name":"x","type":{"type":"fixed","name":"X","size":2},"default":"\u0000\u0000"},
  {"name":"e","type":{"type":"enum","name":"S","symbols":["A","B"]},"default":"A"},
  {"name":"a","type":{"type":"array","items":["null","int","string"]},"default":[]},
  {"name":"m","type":{"type":"map","values":"long"},"default":{}},
  {"name":"u","type":["null","string",{"type":"record","name":"R","fields":[{"name":"k","type":"int"}]}],"default":null},
  {"name":"dt","type":{"type":"int","logicalType":"date"},"default":0},
  {"name":"tm","type":{"type":"int","logicalType":"time-millis"},"default":0},
  {"name":"ts","type":{"type":"long","logicalType":"timestamp-micros"},"default":0},
  {"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":3},"default":"\u0000"},
  {"name":"id","type":{"type":"string","logicalType":"uuid"},"default":"00000000-0000-0000-0000-000000000000"}
]}`

// FuzzAvro: no panic; Validate and Encode agree; a failure is a *Violation
// with a JSON pointer and dst unchanged; every accepted payload's body is
// decoded by goavro (another implementation) to the values of the payload,
// read by the documented rules.
func FuzzAvro(f *testing.F) {
	for _, p := range []string{`{}`, `{"i":1,"l":-9223372036854775808,"f":1.5,"d":1e300,"b":true,"s":"é"}`,
		`{"y":"AAEC","x":"AAE=","e":"B","a":[null,1,"x"],"m":{"b":1,"a":-2}}`,
		`{"u":"x"}`, `{"u":{"k":3}}`, `{"u":{"f.R":{"k":3}}}`, `{"u":{"string":"s"}}`,
		`{"dt":"2024-05-01","tm":"23:59:59.999","ts":"2024-05-01T12:00:00.123456+02:00"}`,
		`{"dt":-3,"tm":0,"ts":-1,"dec":"-123456789.012","id":"123e4567-e89b-12d3-a456-426614174000"}`,
		`{"dec":1e-3,"i":2e9,"l":1.0}`, `{"i":1.5}`, `{"zz":1}`, `[`, `null`} {
		f.Add([]byte(p))
	}
	s := avroSchema(f, fuzzAvroSchema)
	codec, err := goavro.NewCodec(fuzzAvroSchema)
	if err != nil {
		f.Fatal(err)
	}
	root := s.c.(*avroCompiled).root
	f.Fuzz(func(t *testing.T, payload []byte) {
		verr := s.Validate(payload)
		dst := []byte{0xAA}
		out, eerr := s.Encode(dst, payload)
		if (verr == nil) != (eerr == nil) {
			t.Fatalf("Validate = %v but Encode = %v", verr, eerr)
		}
		if verr != nil {
			var v *Violation
			if !errors.As(verr, &v) || v.Reason == "" || (v.Pointer != "" && v.Pointer[0] != '/') || !bytes.Equal(out, dst) {
				t.Fatalf("failure %#v (dst %x)", verr, out)
			}
			return
		}
		native, rest, err := codec.NativeFromBinary(out[len(dst)+HeaderSize:])
		if err != nil || len(rest) != 0 {
			t.Fatalf("goavro: %v, %d bytes left, of %s", err, len(rest), payload)
		}
		doc, _ := parsePayload(payload)
		if err := sameAvro(root, doc, native); err != nil {
			t.Fatalf("%s decoded as %v: %v", payload, native, err)
		}
	})
}

// sameAvro compares a JSON value with goavro's decoding of its Avro form.
// Record fields absent from the JSON took their default (TestAvroRecords
// checks those), so only the present ones are compared.
func sameAvro(n *avroNode, j, native any) error {
	switch n.kind {
	case avroRecord:
		jm, ok1 := j.(map[string]any)
		nm, ok2 := native.(map[string]any)
		if !ok1 || !ok2 {
			return fmt.Errorf("%T decoded as %T", j, native)
		}
		for _, f := range n.fields {
			if jv, ok := jm[f.name]; ok {
				if err := sameAvro(f.node, jv, nm[f.name]); err != nil {
					return fmt.Errorf("%s: %w", f.name, err)
				}
			}
		}
		return nil
	case avroUnion:
		return sameUnion(n, j, native)
	case avroArray:
		ja, ok1 := j.([]any)
		na, ok2 := native.([]any)
		if !ok1 || !ok2 || len(ja) != len(na) {
			return fmt.Errorf("%v decoded as %v", j, native)
		}
		for i := range ja {
			if err := sameAvro(n.items, ja[i], na[i]); err != nil {
				return fmt.Errorf("%d: %w", i, err)
			}
		}
		return nil
	case avroMap:
		jm, ok1 := j.(map[string]any)
		nm, ok2 := native.(map[string]any)
		if !ok1 || !ok2 || len(jm) != len(nm) {
			return fmt.Errorf("%v decoded as %v", j, native)
		}
		for k, v := range jm {
			if err := sameAvro(n.items, v, nm[k]); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return nil
	}
	if want := expectedNative(n, j); fmt.Sprint(want) != fmt.Sprint(native) {
		return fmt.Errorf("%v decoded as %v (%T), want %v (%T)", j, native, native, want, want)
	}
	return nil
}

// sameUnion: goavro names the branch it read ({"string": "x"}, nil for
// null); the JSON must be that branch's value, plainly or wrapped.
func sameUnion(n *avroNode, j, native any) error {
	if native == nil {
		if j != nil {
			return fmt.Errorf("%v decoded as null", j)
		}
		return nil
	}
	nm, ok := native.(map[string]any)
	if !ok || len(nm) != 1 {
		return fmt.Errorf("union decoded as %v", native)
	}
	for name, v := range nm {
		for _, br := range n.branches {
			if br.wrap != name {
				continue
			}
			err := sameAvro(br, j, v)
			if m, ok := j.(map[string]any); err != nil && ok && len(m) == 1 && m[name] != nil {
				err = sameAvro(br, m[name], v) // the wrapped form
			}
			return err
		}
		return fmt.Errorf("decoded branch %s is not in %s", name, n.name)
	}
	return nil
}

// expectedNative is what goavro decodes a scalar to, computed from the JSON
// by the documented rules with the standard library.
func expectedNative(n *avroNode, j any) any {
	num, _ := j.(json.Number)
	str, _ := j.(string)
	switch n.logical {
	case "date":
		if str != "" {
			t, _ := time.Parse(time.DateOnly, str)
			return t
		}
		r := ratOf(string(num))
		return time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC).AddDate(0, 0, int(r.Num().Int64()))
	case "time-millis":
		if str != "" {
			t, _ := time.Parse(time.TimeOnly, str)
			return t.Sub(time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC))
		}
		r := ratOf(string(num))
		return time.Duration(r.Num().Int64()) * time.Millisecond
	case "timestamp-micros":
		if str != "" {
			t, _ := time.Parse(time.RFC3339Nano, str)
			return t.UTC()
		}
		r := ratOf(string(num))
		return time.UnixMicro(r.Num().Int64()).UTC()
	case "decimal":
		return ratOf(string(num) + str)
	}
	switch n.kind {
	case avroInt, avroLong:
		r := ratOf(string(num))
		if n.kind == avroInt {
			return int32(r.Num().Int64())
		}
		return r.Num().Int64()
	case avroFloat:
		f, _ := strconv.ParseFloat(string(num), 32)
		return float32(f)
	case avroDouble:
		f, _ := strconv.ParseFloat(string(num), 64)
		return f
	case avroBytes, avroFixed:
		b, _ := base64.StdEncoding.DecodeString(str)
		return b
	}
	return j // null, boolean, string, enum, uuid
}

// ratOf is a number literal's exact value. An accepted int, long or
// decimal with an exponent beyond ±1000 can only be a zero (0e999999999),
// which big.Rat would take ages to scale.
func ratOf(lit string) *big.Rat {
	if i := strings.IndexAny(lit, "eE"); i >= 0 {
		if e, err := strconv.ParseInt(strings.TrimPrefix(lit[i+1:], "+"), 10, 64); err != nil || e > 1000 || e < -1000 {
			return new(big.Rat)
		}
	}
	r, _ := new(big.Rat).SetString(lit)
	return r
}
