package contracts

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// decodeJSON reads payload into the values jsonschema.UnmarshalJSON gives
// the validator (map[string]any, []any, string, json.Number, bool, nil),
// accepting and rejecting exactly what it does, at a fraction of its cost:
// UnmarshalJSON runs encoding/json's Decoder, which scans every byte twice,
// copies the input into its buffer and allocates each string and number on
// its own. FuzzDecode holds the two to the same results.
//
// What UnmarshalJSON does, and so this does too:
//   - the input is one value with optional whitespace (space, tab, CR, LF)
//     around it; anything else after the value is an error;
//   - numbers are json.Number holding the text as written;
//   - invalid UTF-8 in a string becomes U+FFFD per bad byte, and a \u
//     escape of an unpaired surrogate becomes U+FFFD;
//   - a repeated key keeps its last value;
//   - more than 10000 nested arrays and objects is an error.
func decodeJSON(payload []byte) (any, error) {
	d := decoderPool.Get().(*decoder)
	defer d.release()
	// One copy of the payload: strings without escapes and numbers are
	// substrings of it, so they cost no allocation of their own.
	d.src = string(payload)
	d.pos = 0
	d.skipSpace()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.pos < len(d.src) {
		return nil, d.errAt("after top-level value")
	}
	return v, nil
}

// maxDepth is encoding/json's nesting limit: deeper input is refused there,
// so it is refused here, and the recursion below stays bounded.
const maxDepth = 10000

// decoder is the state of one decode. The pools of pending array elements
// and object members are shared by every level of nesting (a level uses the
// tail above where it started), so each array or object is allocated once,
// at its final size, and the pools are reused across calls.
type decoder struct {
	src  string
	pos  int
	vals []any
	keys []string
}

var decoderPool = sync.Pool{New: func() any { return new(decoder) }}

// maxPooled bounds the pending members a pooled decoder keeps room for: one
// huge payload should not pin its scratch space for every later event.
const maxPooled = 4096

// release returns d to the pool without references into the payload, so
// that a pooled decoder keeps no event's data alive. Every level clears what
// it pops, so only members left pending by an error remain to clear.
func (d *decoder) release() {
	clear(d.vals)
	clear(d.keys)
	d.vals, d.keys = d.vals[:0], d.keys[:0]
	d.src = ""
	if cap(d.vals) > maxPooled || cap(d.keys) > maxPooled {
		return
	}
	decoderPool.Put(d)
}

// syntaxError is a position in the input and what is wrong there.
type syntaxError struct {
	msg string
	off int
}

func (e *syntaxError) Error() string {
	return e.msg + " (offset " + strconv.Itoa(e.off) + ")"
}

// errAt describes the byte at d.pos, or the end of the input.
func (d *decoder) errAt(context string) error {
	if d.pos >= len(d.src) {
		return &syntaxError{msg: "unexpected end of JSON input", off: d.pos}
	}
	return &syntaxError{msg: "invalid character " + quoteChar(d.src[d.pos]) + " " + context, off: d.pos}
}

// quoteChar is encoding/json's rendering of an offending byte.
func quoteChar(c byte) string {
	if c == '\'' {
		return `'\''`
	}
	if c == '"' {
		return `'"'`
	}
	s := strconv.Quote(string(rune(c)))
	return "'" + s[1:len(s)-1] + "'"
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (d *decoder) skipSpace() {
	for d.pos < len(d.src) && isSpace(d.src[d.pos]) {
		d.pos++
	}
}

// value reads one value at d.pos (no leading whitespace); depth is the
// number of arrays and objects it is inside.
func (d *decoder) value(depth int) (any, error) {
	if d.pos >= len(d.src) {
		return nil, d.errAt("")
	}
	switch c := d.src[d.pos]; c {
	case '{':
		return d.object(depth + 1)
	case '[':
		return d.array(depth + 1)
	case '"':
		s, err := d.str()
		if err != nil {
			return nil, err
		}
		return s, nil
	case 't':
		return true, d.literal("true")
	case 'f':
		return false, d.literal("false")
	case 'n':
		return nil, d.literal("null")
	default:
		if c == '-' || c >= '0' && c <= '9' {
			return d.number()
		}
		return nil, d.errAt("looking for beginning of value")
	}
}

// literal consumes word (true, false, null) or fails at its first
// mismatching byte.
func (d *decoder) literal(word string) error {
	for i := 0; i < len(word); i++ {
		if d.pos >= len(d.src) || d.src[d.pos] != word[i] {
			return d.errAt("in literal " + word + " (expecting " + quoteChar(word[i]) + ")")
		}
		d.pos++
	}
	return nil
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? and keeps the
// text: the validator compares numbers exactly (big.Rat), so no parse here.
func (d *decoder) number() (any, error) {
	start := d.pos
	if d.src[d.pos] == '-' {
		d.pos++
	}
	if d.pos < len(d.src) && d.src[d.pos] == '0' {
		d.pos++
	} else if !d.digits() {
		return nil, d.errAt("in numeric literal")
	}
	if d.pos < len(d.src) && d.src[d.pos] == '.' {
		d.pos++
		if !d.digits() {
			return nil, d.errAt("after decimal point in numeric literal")
		}
	}
	if d.pos < len(d.src) && (d.src[d.pos] == 'e' || d.src[d.pos] == 'E') {
		d.pos++
		if d.pos < len(d.src) && (d.src[d.pos] == '+' || d.src[d.pos] == '-') {
			d.pos++
		}
		if !d.digits() {
			return nil, d.errAt("in exponent of numeric literal")
		}
	}
	return json.Number(d.src[start:d.pos]), nil
}

// digits consumes [0-9]+ and reports whether there was at least one.
func (d *decoder) digits() bool {
	start := d.pos
	for d.pos < len(d.src) && d.src[d.pos] >= '0' && d.src[d.pos] <= '9' {
		d.pos++
	}
	return d.pos > start
}

// array reads [v, ...] at d.pos; its elements wait in d.vals until the
// closing bracket gives their count.
func (d *decoder) array(depth int) (any, error) {
	if depth > maxDepth {
		return nil, &syntaxError{msg: "exceeded max depth", off: d.pos}
	}
	d.pos++ // [
	mark := len(d.vals)
	d.skipSpace()
	if d.pos < len(d.src) && d.src[d.pos] == ']' {
		d.pos++
		return []any{}, nil // non-nil, as encoding/json makes it
	}
	for {
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		d.vals = append(d.vals, v)
		d.skipSpace()
		if d.pos >= len(d.src) {
			return nil, d.errAt("")
		}
		switch d.src[d.pos] {
		case ',':
			d.pos++
			d.skipSpace()
			continue
		case ']':
			d.pos++
			arr := make([]any, len(d.vals)-mark)
			copy(arr, d.vals[mark:])
			clear(d.vals[mark:])
			d.vals = d.vals[:mark]
			return arr, nil
		}
		return nil, d.errAt("after array element")
	}
}

// object reads {"k": v, ...} at d.pos; its members wait in d.keys and
// d.vals until the closing brace gives the map's size. Inserting them in
// input order makes the last of a repeated key win, as in encoding/json.
func (d *decoder) object(depth int) (any, error) {
	if depth > maxDepth {
		return nil, &syntaxError{msg: "exceeded max depth", off: d.pos}
	}
	d.pos++ // {
	kmark, vmark := len(d.keys), len(d.vals)
	d.skipSpace()
	if d.pos < len(d.src) && d.src[d.pos] == '}' {
		d.pos++
		return map[string]any{}, nil
	}
	for {
		if d.pos >= len(d.src) || d.src[d.pos] != '"' {
			return nil, d.errAt("looking for beginning of object key string")
		}
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		d.skipSpace()
		if d.pos >= len(d.src) || d.src[d.pos] != ':' {
			return nil, d.errAt("after object key")
		}
		d.pos++
		d.skipSpace()
		v, err := d.value(depth)
		if err != nil {
			return nil, err
		}
		d.keys, d.vals = append(d.keys, k), append(d.vals, v)
		d.skipSpace()
		if d.pos >= len(d.src) {
			return nil, d.errAt("")
		}
		switch d.src[d.pos] {
		case ',':
			d.pos++
			d.skipSpace()
			continue
		case '}':
			d.pos++
			return d.finishObject(kmark, vmark), nil
		}
		return nil, d.errAt("after object key:value pair")
	}
}

// finishObject builds the map of the members above the marks and pops them.
func (d *decoder) finishObject(kmark, vmark int) map[string]any {
	keys, vals := d.keys[kmark:], d.vals[vmark:]
	m := make(map[string]any, len(keys))
	for i, k := range keys {
		m[k] = vals[i]
	}
	clear(keys)
	clear(vals)
	d.keys, d.vals = d.keys[:kmark], d.vals[:vmark]
	return m
}

// str reads a string at d.pos (the opening quote). The common case, no
// escape and valid UTF-8, is a substring of the one copy of the payload;
// anything else is rebuilt by unescape.
func (d *decoder) str() (string, error) {
	start := d.pos + 1
	for i := start; i < len(d.src); {
		c := d.src[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return d.src[start:i], nil
		case c == '\\':
			return d.unescape(start, i)
		case c < 0x20:
			d.pos = i
			return "", d.errAt("in string literal")
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRuneInString(d.src[i:])
			if r == utf8.RuneError && size == 1 {
				return d.unescape(start, i)
			}
			i += size
		}
	}
	d.pos = len(d.src)
	return "", d.errAt("")
}

// unescape finishes a string whose bytes from start to i are plain, from
// the first escape or invalid UTF-8 byte at i, decoding as encoding/json
// does: a bad UTF-8 byte becomes U+FFFD, and so does a \u escape of a
// surrogate that is not the first half of a pair followed by the second.
func (d *decoder) unescape(start, i int) (string, error) {
	var b strings.Builder
	b.Grow(len(d.src) - start)
	b.WriteString(d.src[start:i])
	for i < len(d.src) {
		c := d.src[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return b.String(), nil
		case c == '\\':
			n, err := d.escape(&b, i)
			if err != nil {
				return "", err
			}
			i += n
		case c < 0x20:
			d.pos = i
			return "", d.errAt("in string literal")
		case c < utf8.RuneSelf:
			b.WriteByte(c)
			i++
		default:
			r, size := utf8.DecodeRuneInString(d.src[i:])
			b.WriteRune(r) // utf8.RuneError, U+FFFD, for a bad byte
			i += size
		}
	}
	d.pos = len(d.src)
	return "", d.errAt("")
}

// escape writes the escape sequence at i (a backslash) to b and returns its
// length in the input.
func (d *decoder) escape(b *strings.Builder, i int) (int, error) {
	if i+1 >= len(d.src) {
		d.pos = len(d.src)
		return 0, d.errAt("")
	}
	switch c := d.src[i+1]; c {
	case '"', '\\', '/':
		b.WriteByte(c)
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'n':
		b.WriteByte('\n')
	case 'r':
		b.WriteByte('\r')
	case 't':
		b.WriteByte('\t')
	case 'u':
		r := hex4(d.src, i+2)
		if r < 0 {
			d.pos = min(i+2+firstNonHex(d.src, i+2), len(d.src))
			return 0, d.errAt("in \\u hexadecimal character escape")
		}
		if !utf16.IsSurrogate(r) {
			b.WriteRune(r)
			return 6, nil
		}
		// A pair is a high then a low surrogate escape; anything else
		// leaves this one unpaired, and the next escape is read on its own.
		if i+7 < len(d.src) && d.src[i+6] == '\\' && d.src[i+7] == 'u' {
			if r2 := hex4(d.src, i+8); r2 >= 0 {
				if pr := utf16.DecodeRune(r, r2); pr != utf8.RuneError {
					b.WriteRune(pr)
					return 12, nil
				}
			}
		}
		b.WriteRune(utf8.RuneError)
		return 6, nil
	default:
		d.pos = i + 1
		return 0, d.errAt("in string escape code")
	}
	return 2, nil
}

// hex4 is the value of the four hex digits at s[i:], or -1.
func hex4(s string, i int) rune {
	if i+4 > len(s) {
		return -1
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		v := hexVal(c)
		if v < 0 {
			return -1
		}
		r = r<<4 | v
	}
	return r
}

func hexVal(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10
	}
	return -1
}

// firstNonHex is how many of the (at most four) bytes at s[i:] are hex
// digits: where a short \u escape goes wrong, for the error's offset.
func firstNonHex(s string, i int) int {
	n := 0
	for n < 4 && i+n < len(s) && hexVal(s[i+n]) >= 0 {
		n++
	}
	return n
}
