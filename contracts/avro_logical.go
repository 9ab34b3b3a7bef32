package contracts

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// logical converts a JSON value to a logical type. Each takes its base
// type's JSON (an integer of days, of milliseconds...) or the text form
// people write in JSON (RFC 3339, "YYYY-MM-DD", a decimal string). A text
// form with more precision than the type holds is refused: truncating a
// timestamp or a price would alter the event.
func (c *converter) logical(dst []byte, n *avroNode, v any) ([]byte, error) {
	switch n.logical {
	case avro.Decimal:
		return c.decimal(dst, n, v)
	case avro.UUID:
		if s, ok := v.(string); ok && isUUID(s) {
			return appendString(dst, s), nil
		}
		return dst, c.fail(jsonKind(v), "uuid: a string such as 123e4567-e89b-12d3-a456-426614174000")
	}
	lt := timeTypes[n.logical]
	kind := avroLong
	if n.logical == avro.Date || n.logical == avro.TimeMillis {
		kind = avroInt
	}
	switch v := v.(type) {
	case json.Number:
		i, why := integer(string(v), kind)
		if why == "" && lt.perDay > 0 && (i < 0 || i >= lt.perDay) {
			why = "out of range (a time of day: 0 to " + strconv.FormatInt(lt.perDay-1, 10) + ")"
		}
		if why == "" {
			return appendLong(dst, i), nil
		}
		return dst, c.fail(jsonKind(v), string(n.logical)+": "+why)
	case string:
		if i, why := lt.parse(v, lt); why == "" {
			return appendLong(dst, i), nil
		} else if why != "syntax" {
			return dst, c.fail(jsonKind(v), string(n.logical)+": "+why)
		}
	}
	return dst, c.fail(jsonKind(v), string(n.logical)+": "+lt.want)
}

// timeType is how a date or time logical type reads text.
type timeType struct {
	unit   time.Duration // of the integer: milliseconds, microseconds, days
	perDay int64         // units in a day, for times of day
	parse  func(s string, lt timeType) (int64, string)
	want   string
}

var timeTypes = map[avro.LogicalType]timeType{
	avro.Date: {unit: 24 * time.Hour, parse: parseDate,
		want: `a date "YYYY-MM-DD" or an integer of days since 1970-01-01`},
	avro.TimeMillis: {unit: time.Millisecond, perDay: 86_400_000, parse: parseTimeOfDay,
		want: `a time "HH:MM:SS[.sss]" or an integer of milliseconds after midnight`},
	avro.TimeMicros: {unit: time.Microsecond, perDay: 86_400_000_000, parse: parseTimeOfDay,
		want: `a time "HH:MM:SS[.ssssss]" or an integer of microseconds after midnight`},
	avro.TimestampMillis: {unit: time.Millisecond, parse: parseTimestamp,
		want: "an RFC 3339 date-time such as 2024-05-01T12:00:00.123Z or an integer of milliseconds since the epoch"},
	avro.TimestampMicros: {unit: time.Microsecond, parse: parseTimestamp,
		want: "an RFC 3339 date-time such as 2024-05-01T12:00:00.123456Z or an integer of microseconds since the epoch"},
	avro.LocalTimestampMillis: {unit: time.Millisecond, parse: parseLocalTimestamp,
		want: "a date-time without offset such as 2024-05-01T12:00:00.123 or an integer of milliseconds"},
	avro.LocalTimestampMicros: {unit: time.Microsecond, parse: parseLocalTimestamp,
		want: "a date-time without offset such as 2024-05-01T12:00:00.123456 or an integer of microseconds"},
}

// The parse functions answer "syntax" when the text is not of the form
// (the reason is then the type's want), another reason when it is but
// cannot be held.

func parseDate(s string, _ timeType) (int64, string) {
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return 0, "syntax"
	}
	return t.Unix() / 86400, "" // a UTC midnight: exact, also before 1970
}

func parseTimeOfDay(s string, lt timeType) (int64, string) {
	t, err := time.Parse(time.TimeOnly, s) // a fraction after the seconds is read too
	if err != nil {
		return 0, "syntax"
	}
	ns := time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute +
		time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond())
	return inUnits(ns, lt.unit)
}

func parseTimestamp(s string, lt timeType) (int64, string) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, "syntax"
	}
	return sinceEpoch(t, lt.unit)
}

func parseLocalTimestamp(s string, lt timeType) (int64, string) {
	t, err := time.Parse("2006-01-02T15:04:05", s)
	if err != nil {
		return 0, "syntax"
	}
	return sinceEpoch(t, lt.unit)
}

func sinceEpoch(t time.Time, unit time.Duration) (int64, string) {
	if unit == time.Millisecond {
		return t.UnixMilli(), fraction(time.Duration(t.Nanosecond()), unit)
	}
	return t.UnixMicro(), fraction(time.Duration(t.Nanosecond()), unit)
}

func inUnits(d, unit time.Duration) (int64, string) {
	return int64(d / unit), fraction(d, unit)
}

func fraction(d, unit time.Duration) string {
	if d%unit == 0 {
		return ""
	}
	if unit == time.Millisecond {
		return "more precise than a millisecond"
	}
	return "more precise than a microsecond"
}

// isUUID: the RFC 9562 text form, 8-4-4-4-12 hex digits, either case.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if ch != '-' {
				return false
			}
		case '0' <= ch && ch <= '9', 'a' <= ch && ch <= 'f', 'A' <= ch && ch <= 'F':
		default:
			return false
		}
	}
	return true
}

// decimal reads a JSON number or a string holding one (in JSON's number
// syntax, so "12.30" and 12.30 mean the same), exactly: the literal is
// read as digits, never through a float. The value must have at most scale
// digits after the point and precision digits in all; it is written as the
// unscaled integer in big-endian two's complement, as short as possible for
// bytes, sign-extended to the size for fixed.
func (c *converter) decimal(dst []byte, n *avroNode, v any) ([]byte, error) {
	var lit string
	switch v := v.(type) {
	case json.Number:
		lit = string(v)
	case string:
		lit = v
	default:
		return dst, c.fail(jsonKind(v), n.name+": a number or a string such as \"12.30\"")
	}
	d, ok := parseDecimal(lit)
	if !ok {
		return dst, c.fail(jsonKind(v), n.name+": a number or a string such as \"12.30\"")
	}
	unscaled, why := d.unscaled(n.precision, n.scale)
	if why != "" {
		return dst, c.fail(jsonKind(v), n.name+": "+why)
	}
	b := twosComplement(unscaled)
	if n.kind == avroBytes {
		return appendString(dst, string(b)), nil
	}
	if len(b) > n.size {
		return dst, c.fail(jsonKind(v), n.name+": does not fit in "+strconv.Itoa(n.size)+" bytes")
	}
	pad := byte(0)
	if unscaled.Sign() < 0 {
		pad = 0xff
	}
	for range n.size - len(b) {
		dst = append(dst, pad)
	}
	return append(dst, b...), nil
}

// decimalLit is a number literal: (-1)^neg × digits × 10^exp, digits
// without leading or trailing zeros ("" is zero).
type decimalLit struct {
	neg    bool
	digits string
	exp    int
}

// maxExp bounds the exponent read from a literal: far beyond any int,
// long or decimal precision, and small enough that arithmetic on it cannot
// overflow.
const maxExp = 1 << 20

// parseDecimal reads JSON's number syntax: -?(0|[1-9]d*)(.d+)?([eE][+-]?d+)?
func parseDecimal(s string) (decimalLit, bool) {
	var d decimalLit
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	intPart := leadingDigits(s)
	if intPart == "" || (len(intPart) > 1 && intPart[0] == '0') {
		return d, false
	}
	s = s[len(intPart):]
	var frac string
	if strings.HasPrefix(s, ".") {
		if frac = leadingDigits(s[1:]); frac == "" {
			return d, false
		}
		s = s[1+len(frac):]
	}
	if s != "" {
		exp, ok := parseExponent(s)
		if !ok {
			return d, false
		}
		d.exp = exp
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	d.exp -= len(frac)
	trimmed := strings.TrimRight(digits, "0")
	d.exp += len(digits) - len(trimmed)
	d.digits = trimmed
	return d, true
}

// parseExponent reads [eE][+-]?d+, saturated at ±maxExp.
func parseExponent(s string) (int, bool) {
	if s[0] != 'e' && s[0] != 'E' {
		return 0, false
	}
	s = s[1:]
	neg := strings.HasPrefix(s, "-")
	if neg || strings.HasPrefix(s, "+") {
		s = s[1:]
	}
	if s == "" || leadingDigits(s) != s {
		return 0, false
	}
	exp := maxExp
	if e := strings.TrimLeft(s, "0"); len(e) <= 7 {
		exp, _ = strconv.Atoi("0" + e)
		exp = min(exp, maxExp)
	}
	if neg {
		return -exp, true
	}
	return exp, true
}

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// int64 is the literal as an integer, or why it is not one.
func (d decimalLit) int64() (int64, string) {
	if d.digits == "" {
		return 0, ""
	}
	if d.exp < 0 {
		return 0, "not an integer"
	}
	if len(d.digits)+d.exp > 19 {
		return 0, whyRange
	}
	u, err := strconv.ParseUint(d.digits+strings.Repeat("0", d.exp), 10, 64)
	switch {
	case err != nil:
		return 0, whyRange
	case !d.neg && u <= math.MaxInt64:
		return int64(u), ""
	case d.neg && u <= 1<<63:
		return int64(-u), "" // -u wraps to MinInt64 exactly when u is 2^63
	}
	return 0, whyRange
}

// unscaled is the literal × 10^scale, checked against the precision.
func (d decimalLit) unscaled(precision, scale int) (*big.Int, string) {
	if d.digits == "" {
		return new(big.Int), ""
	}
	shift := d.exp + scale
	if shift < 0 {
		return nil, "more than " + strconv.Itoa(scale) + " digits after the decimal point"
	}
	if len(d.digits)+shift > precision {
		return nil, "more than " + strconv.Itoa(precision) + " digits in all (precision)"
	}
	u, _ := new(big.Int).SetString(d.digits+strings.Repeat("0", shift), 10)
	if d.neg {
		u.Neg(u)
	}
	return u, ""
}

// twosComplement is x in big-endian two's complement, in the fewest bytes
// (Java's BigInteger.toByteArray, which Avro's Java decimal conversion
// uses).
func twosComplement(x *big.Int) []byte {
	if x.Sign() >= 0 {
		b := x.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	// -x - 1 has the bits of x inverted.
	m := new(big.Int).Neg(x)
	b := m.Sub(m, big.NewInt(1)).Bytes()
	for i := range b {
		b[i] = ^b[i]
	}
	if len(b) == 0 || b[0]&0x80 == 0 {
		b = append([]byte{0xff}, b...)
	}
	return b
}
