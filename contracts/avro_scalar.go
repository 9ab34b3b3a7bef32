package contracts

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
)

// scalar converts a JSON value to a non-container Avro type.
func (c *converter) scalar(dst []byte, n *avroNode, v any) ([]byte, error) {
	if n.logical != "" {
		return c.logical(dst, n, v)
	}
	switch n.kind {
	case avroNull:
		if v == nil {
			return dst, nil
		}
	case avroBoolean:
		if b, ok := v.(bool); ok {
			return appendBool(dst, b), nil
		}
	case avroInt, avroLong:
		if num, ok := v.(json.Number); ok {
			i, why := integer(string(num), n.kind)
			if why != "" {
				return dst, c.fail(jsonKind(v), n.name+": "+why)
			}
			return appendLong(dst, i), nil
		}
	case avroFloat, avroDouble:
		if num, ok := v.(json.Number); ok {
			return c.float(dst, n, num)
		}
	case avroString:
		if s, ok := v.(string); ok {
			return appendString(dst, s), nil
		}
	case avroBytes, avroFixed:
		if s, ok := v.(string); ok {
			return c.bytes(dst, n, s)
		}
	case avroEnum:
		if s, ok := v.(string); ok {
			if i, ok := n.symbolAt[s]; ok {
				return appendLong(dst, int64(i)), nil
			}
			return dst, c.fail(jsonKind(v), "a symbol of enum "+n.name+": "+symbolList(n.symbols))
		}
	}
	return dst, c.fail(jsonKind(v), avroWant(n))
}

// avroWant says what JSON a type takes, for a value of the wrong kind.
func avroWant(n *avroNode) string {
	switch n.kind {
	case avroInt, avroLong:
		return "an integer (" + n.name + ")"
	case avroFloat, avroDouble:
		return "a number (" + n.name + ")"
	case avroBytes:
		return "a base64 string (bytes)"
	case avroFixed:
		return "a base64 string (fixed " + n.name + " of " + strconv.Itoa(n.size) + " bytes)"
	case avroEnum:
		return "a string (enum " + n.name + ")"
	case avroString:
		return "a string"
	}
	return n.name
}

func symbolList(symbols []string) string {
	const max = 16
	if len(symbols) <= max {
		return strings.Join(symbols, ", ")
	}
	return strings.Join(symbols[:max], ", ") + ", ... (" + strconv.Itoa(len(symbols)) + " symbols)"
}

// integer reads a JSON number literal as an int or a long. Any notation of
// an integral value is accepted (2, 2.0, 2e3: JSON does not tell integers
// apart, and JSON Schema's "integer" accepts them too); a fraction or a
// value out of the type's range is refused, never rounded or wrapped.
func integer(lit string, k avroKind) (int64, string) {
	i, err := strconv.ParseInt(lit, 10, 64)
	if err != nil {
		d, ok := parseDecimal(lit)
		if !ok {
			return 0, "not a number"
		}
		var why string
		if i, why = d.int64(); why != "" {
			if why == whyRange {
				return 0, rangeOf(k)
			}
			return 0, why
		}
	}
	if k == avroInt && (i < math.MinInt32 || i > math.MaxInt32) {
		return 0, rangeOf(k)
	}
	return i, ""
}

const whyRange = "out of range"

func rangeOf(k avroKind) string {
	if k == avroInt {
		return "out of range (int is 32-bit: -2147483648 to 2147483647)"
	}
	return "out of range (long is 64-bit: -9223372036854775808 to 9223372036854775807)"
}

// float reads a JSON number as a float or a double: the nearest value,
// as every JSON reader does; one beyond the type's largest finite value is
// refused rather than written as an infinity.
func (c *converter) float(dst []byte, n *avroNode, num json.Number) ([]byte, error) {
	bits := 64
	if n.kind == avroFloat {
		bits = 32
	}
	f, err := strconv.ParseFloat(string(num), bits)
	if err != nil && (!errors.Is(err, strconv.ErrRange) || math.IsInf(f, 0)) {
		return dst, c.fail(jsonKind(num), n.name+": out of range")
	}
	if n.kind == avroFloat {
		return appendFloat(dst, float32(f)), nil
	}
	return appendDouble(dst, f), nil
}

// bytes reads bytes and fixed from base64 (RFC 4648 section 4, standard
// alphabet, padded). Why not Avro's own JSON encoding (each byte a code
// point U+0000..U+00FF of a string): outbox payloads are written by the
// application's JSON library, and those (Go's encoding/json for []byte,
// Jackson for byte[], JSON.stringify after btoa) produce base64; a
// producer team would have to learn a Latin-1 trick for this one field,
// and a text that happens to be Latin-1 would pass as bytes unnoticed.
func (c *converter) bytes(dst []byte, n *avroNode, s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return dst, c.fail(jsonKind(s), avroWant(n)+": not base64: "+err.Error())
	}
	if n.kind == avroFixed {
		if len(b) != n.size {
			return dst, c.fail(strconv.Itoa(len(b))+" bytes in base64", avroWant(n))
		}
		return append(dst, b...), nil
	}
	return appendString(dst, string(b)), nil
}

// The binary encoding (Avro specification, "Binary Encoding"): int and
// long are zig-zag varints (encoding/binary's Varint is the same zig-zag),
// float and double little-endian IEEE 754, bytes and string a long length
// then the bytes, boolean one byte.

func appendLong(dst []byte, i int64) []byte { return binary.AppendVarint(dst, i) }

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

func appendFloat(dst []byte, f float32) []byte {
	return binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
}

func appendDouble(dst []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
}

func appendString(dst []byte, s string) []byte {
	return append(appendLong(dst, int64(len(s))), s...)
}
