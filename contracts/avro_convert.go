package contracts

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// avroCompiled is one compiled Avro schema version; immutable, shared.
type avroCompiled struct{ root *avroNode }

// scratch holds the bodies validate writes and drops, so a validate costs
// no buffer allocation once warm.
var scratch = sync.Pool{New: func() any { return new([]byte) }}

func (a *avroCompiled) check(payload []byte) *Violation {
	buf := scratch.Get().(*[]byte)
	out, v := a.encode((*buf)[:0], payload)
	if cap(out) <= 1<<20 { // do not keep a huge event's buffer alive
		*buf = out[:0]
		scratch.Put(buf)
	}
	return v
}

func (a *avroCompiled) encode(dst, payload []byte) ([]byte, *Violation) {
	doc, v := parsePayload(payload)
	if v != nil {
		return dst, v
	}
	c := converter{budget: stepBudget(len(payload))}
	out, err := c.value(dst, a.root, doc)
	if err != nil {
		return dst, c.violation
	}
	return out, nil
}

// parsePayload reads the payload as JSON, numbers kept as their literal
// (json.Number) so that integers beyond 2^53 and decimals stay exact.
// Invalid UTF-8 is refused rather than replaced with U+FFFD as
// encoding/json would: an Avro string is UTF-8, and the event must not be
// altered on its way.
func parsePayload(payload []byte) (any, *Violation) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, &Violation{Reason: "empty payload, want a JSON value"}
	}
	if !utf8.Valid(payload) {
		return nil, &Violation{Reason: "not JSON: invalid UTF-8"}
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, &Violation{Reason: "not JSON: " + err.Error()}
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &Violation{Reason: "not JSON: data after the value"}
	}
	return doc, nil
}

// The values one payload may visit are bounded: unions are matched by
// trying each branch, and a schema of nested unions of records could make
// that exponential in the payload's depth. The bound grows with the
// payload, so that a large payload that fits (a union's wrong branches
// visit its arrays before failing) is never refused for its size alone:
// at least maxSteps, and stepsPerByte for each byte (review9: a 540 KB
// payload of a four-branch union needed about 1.1 million).
const (
	maxSteps     = 1 << 20
	stepsPerByte = 16
)

// stepBudget is the bound for a payload of n bytes.
func stepBudget(n int) int { return max(maxSteps, stepsPerByte*n) }

// errMismatch stops a conversion; the converter's violation says why.
var errMismatch = errors.New("mismatch")

// converter walks one payload. path is where it is, for the pointer;
// trial > 0 while a union branch is tried, when failures are expected and
// no violation is built.
type converter struct {
	path      []pathStep
	rec       string // the innermost record and field, for Violation.Keyword
	field     string
	trial     int
	steps     int
	budget    int // stepBudget of the payload
	violation *Violation
}

type pathStep struct {
	key   string
	index int // -1 for an object key
}

// fail records the violation at the current path: got is what was found,
// want what the schema expects.
func (c *converter) fail(got, want string) error {
	if c.trial > 0 {
		return errMismatch
	}
	return c.failReason("got " + got + ", want " + want)
}

func (c *converter) failReason(reason string) error {
	if c.trial > 0 {
		return errMismatch
	}
	c.violation = &Violation{Pointer: c.pointer(), Keyword: c.keyword(), Reason: reason}
	return errMismatch
}

func (c *converter) pointer() string {
	var b []byte
	for _, s := range c.path {
		b = append(b, '/')
		if s.index >= 0 {
			b = strconv.AppendInt(b, int64(s.index), 10)
		} else {
			b = append(b, pointerEscaper.Replace(s.key)...)
		}
	}
	return string(b)
}

// keyword is the schema location in Avro's terms: the record's full name
// and the field the value belongs to.
func (c *converter) keyword() string {
	if c.field == "" {
		return c.rec
	}
	return c.rec + "." + c.field
}

func (c *converter) value(dst []byte, n *avroNode, v any) ([]byte, error) {
	if c.steps++; c.steps > c.budget {
		c.trial = 0 // a budget exhausted is final, even inside a trial
		return dst, c.fail("a payload too complex to match", "at most "+strconv.Itoa(c.budget)+" values visited")
	}
	switch n.kind {
	case avroRecord:
		return c.record(dst, n, v)
	case avroUnion:
		return c.union(dst, n, v)
	case avroArray:
		return c.array(dst, n, v)
	case avroMap:
		return c.object(dst, n, v)
	}
	return c.scalar(dst, n, v)
}

func (c *converter) record(dst []byte, n *avroNode, v any) ([]byte, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return dst, c.fail(jsonKind(v), "an object (record "+n.name+")")
	}
	saveRec, saveField := c.rec, c.field
	defer func() { c.rec, c.field = saveRec, saveField }()
	c.rec, c.field = n.name, ""
	// Unknown fields are violations: a field the schema does not have
	// would be dropped from the encoded event without a trace (or, in
	// validate mode, reach consumers that do not expect it). Reported in
	// key order, so the same payload always names the same field.
	if len(m) > len(n.fields) || c.hasUnknown(n, m) {
		for _, k := range sortedKeys(m) {
			if _, known := n.fieldAt[k]; !known {
				c.path = append(c.path, pathStep{key: k, index: -1})
				err := c.failReason("unknown field " + strconv.Quote(k) + ": record " + n.name + " has no such field")
				c.path = c.path[:len(c.path)-1]
				return dst, err
			}
		}
	}
	var err error
	for i := range n.fields {
		f := &n.fields[i]
		c.field = f.name
		c.path = append(c.path, pathStep{key: f.name, index: -1})
		fv, present := m[f.name]
		switch {
		case present:
			dst, err = c.value(dst, f.node, fv)
		case f.hasDef:
			dst = append(dst, f.def...)
		default:
			err = c.failReason("missing field " + strconv.Quote(f.name) + " of type " + f.node.name + " (required: the schema gives it no default)")
		}
		c.path = c.path[:len(c.path)-1]
		if err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func (c *converter) hasUnknown(n *avroNode, m map[string]any) bool {
	for k := range m {
		if _, ok := n.fieldAt[k]; !ok {
			return true
		}
	}
	return false
}

// union picks the first branch, in schema order, that the plain JSON value
// fits (JSON null fits only the null branch). Only when none fits, an
// object with a single key naming a branch ({"string": "x"},
// {"com.acme.Money": {...}}: Avro's JSON encoding of unions) is read as
// that branch: the plain reading always wins, so the wrapped form never
// changes the meaning of a payload that fits plainly.
func (c *converter) union(dst []byte, n *avroNode, v any) ([]byte, error) {
	c.trial++
	for i, br := range n.branches {
		if !mayFit(br, v) {
			continue
		}
		out, err := c.value(appendLong(dst, int64(i)), br, v)
		if err == nil {
			c.trial--
			return out, nil
		}
		if c.trial == 0 { // the step budget ran out
			return dst, err
		}
	}
	c.trial--
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		for i, br := range n.branches {
			if inner, ok := m[br.wrap]; ok {
				c.path = append(c.path, pathStep{key: br.wrap, index: -1})
				out, err := c.value(appendLong(dst, int64(i)), br, inner)
				c.path = c.path[:len(c.path)-1]
				if err != nil {
					return dst, err
				}
				return out, nil
			}
		}
	}
	return dst, c.fail(jsonKind(v), "a value of "+n.name)
}

// mayFit rules a branch out by the JSON kind alone, so a union does not
// try to convert a whole object as a string.
func mayFit(n *avroNode, v any) bool {
	switch v.(type) {
	case nil:
		return n.kind == avroNull
	case bool:
		return n.kind == avroBoolean
	case json.Number:
		switch n.kind {
		case avroInt, avroLong, avroFloat, avroDouble:
			return true
		case avroBytes, avroFixed:
			return n.logical != ""
		}
		return false
	case string:
		switch n.kind {
		case avroString, avroBytes, avroFixed, avroEnum:
			return true
		case avroInt, avroLong: // dates, times, timestamps
			return n.logical != ""
		}
		return false
	case []any:
		return n.kind == avroArray
	case map[string]any:
		return n.kind == avroRecord || n.kind == avroMap
	}
	return false
}

// array writes one block of all the items, then the end marker.
func (c *converter) array(dst []byte, n *avroNode, v any) ([]byte, error) {
	a, ok := v.([]any)
	if !ok {
		return dst, c.fail(jsonKind(v), "an array")
	}
	if len(a) > 0 {
		dst = appendLong(dst, int64(len(a)))
	}
	var err error
	for i, e := range a {
		c.path = append(c.path, pathStep{index: i})
		dst, err = c.value(dst, n.items, e)
		c.path = c.path[:len(c.path)-1]
		if err != nil {
			return dst, err
		}
	}
	return appendLong(dst, 0), nil
}

// object writes an Avro map: one block, keys in sorted order, so the same
// payload always makes the same bytes whatever order its keys came in.
func (c *converter) object(dst []byte, n *avroNode, v any) ([]byte, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return dst, c.fail(jsonKind(v), "an object (map)")
	}
	if len(m) > 0 {
		dst = appendLong(dst, int64(len(m)))
	}
	var err error
	for _, k := range sortedKeys(m) {
		c.path = append(c.path, pathStep{key: k, index: -1})
		dst, err = c.value(appendString(dst, k), n.items, m[k])
		c.path = c.path[:len(c.path)-1]
		if err != nil {
			return dst, err
		}
	}
	return appendLong(dst, 0), nil
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// jsonKind names a decoded JSON value's kind, as reasons say it.
func jsonKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean " + strconv.FormatBool(v)
	case json.Number:
		return "number " + string(v)
	case string:
		return "string " + quoteShort(v)
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

// quoteShort quotes a string for a reason, cut so a large value does not
// make a large header.
func quoteShort(s string) string {
	const max = 64
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}
