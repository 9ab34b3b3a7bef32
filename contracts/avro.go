package contracts

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/hamba/avro/v2"
)

// Avro: a registered Avro schema (schemaType AVRO) is parsed by hamba/avro
// and compiled into a tree of avroNodes; the outbox payload (JSON) is
// converted following that tree and written as the Avro binary body in the
// same pass (avro_convert.go). The JSON → Avro rules are in
// docs/configuration.md (contracts.format).
//
// Why our own writer rather than hamba's Marshal: hamba encodes Go values,
// so the JSON would first become a second tree of Go values typed for
// hamba (int vs int64, unions by Go type, big.Rat decimals), and its errors
// do not say where in the payload the value was. Converting and writing in
// one walk keeps one place that decides what a JSON value means, gives the
// violation its JSON pointer, and makes validate and encode the same code:
// validate is an encode whose bytes are dropped. The binary format itself is
// small (zig-zag varints, little-endian floats, length-prefixed bytes); the
// tests decode what it writes with linkedin/goavro, another implementation.
//
// The conversion stops at the first value that does not fit, in a fixed
// order (fields in schema order, array items in order, map keys sorted), so
// a payload always gets the same Violation and More stays 0.

// avroCodec compiles Avro schemas.
type avroCodec struct{}

// avroKind is a node's Avro type.
type avroKind uint8

const (
	avroNull avroKind = iota
	avroBoolean
	avroInt
	avroLong
	avroFloat
	avroDouble
	avroBytes
	avroString
	avroFixed
	avroEnum
	avroArray
	avroMap
	avroRecord
	avroUnion
)

// avroNode is one compiled schema type. Named types appear once, so a
// recursive schema is a cyclic graph; the converter only follows it as
// deep as the payload goes.
type avroNode struct {
	kind    avroKind
	logical avro.LogicalType // "" or one this package interprets
	name    string           // what a reason calls it: "int", "com.acme.Order", "decimal(10,2)"
	wrap    string           // the key of the Avro JSON union wrapping: a type name or a full name

	size             int // fixed
	precision, scale int // decimal

	symbols  []string // enum
	symbolAt map[string]int

	items *avroNode // array items, map values

	fields  []avroField // record
	fieldAt map[string]int

	branches []*avroNode // union
}

// avroField is a record field and its default, written once at compile
// time: the same bytes for every event that leaves the field out.
type avroField struct {
	name   string
	node   *avroNode
	hasDef bool
	def    []byte
}

// compile parses text with a schema cache of its own: hamba's default cache
// is process-wide, so a name defined by one subject's schema would resolve
// in another's (or an older version's definition would shadow a newer one).
func (avroCodec) compile(text string) (compiled, error) {
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, err
	}
	b := &avroBuilder{named: map[string]*avroNode{}}
	root, err := b.node(s)
	if err != nil {
		return nil, err
	}
	// Defaults last: a default may be a value of a record whose fields
	// were not all built when the field was met (a recursive schema).
	for _, d := range b.defaults {
		if d.f.def, err = appendDefault(nil, d.f.node, d.value); err != nil {
			return nil, fmt.Errorf("field %s.%s: default: %w", d.record, d.f.name, err)
		}
	}
	return &avroCompiled{root: root}, nil
}

type avroBuilder struct {
	named    map[string]*avroNode
	defaults []pendingDefault
}

type pendingDefault struct {
	record string
	f      *avroField
	value  any
}

func (b *avroBuilder) node(s avro.Schema) (*avroNode, error) {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		if done := b.named[n.FullName()]; done != nil {
			return done, nil
		}
	}
	switch s := s.(type) {
	case *avro.NullSchema:
		return &avroNode{kind: avroNull, name: "null", wrap: "null"}, nil
	case *avro.PrimitiveSchema:
		return primitiveNode(s)
	case *avro.FixedSchema:
		n := &avroNode{kind: avroFixed, name: s.FullName(), wrap: s.FullName(), size: s.Size()}
		b.named[s.FullName()] = n
		if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
			n.logical, n.precision, n.scale = avro.Decimal, d.Precision(), d.Scale()
		}
		return n, nil
	case *avro.EnumSchema:
		n := &avroNode{kind: avroEnum, name: s.FullName(), wrap: s.FullName(), symbols: s.Symbols(), symbolAt: map[string]int{}}
		for i, sym := range n.symbols {
			n.symbolAt[sym] = i
		}
		b.named[s.FullName()] = n
		return n, nil
	case *avro.ArraySchema:
		items, err := b.node(s.Items())
		return &avroNode{kind: avroArray, name: "array", wrap: "array", items: items}, err
	case *avro.MapSchema:
		values, err := b.node(s.Values())
		return &avroNode{kind: avroMap, name: "map", wrap: "map", items: values}, err
	case *avro.RecordSchema:
		return b.record(s)
	case *avro.UnionSchema:
		n := &avroNode{kind: avroUnion}
		names := make([]string, 0, len(s.Types()))
		for _, t := range s.Types() {
			br, err := b.node(t)
			if err != nil {
				return nil, err
			}
			n.branches = append(n.branches, br)
			names = append(names, br.name)
		}
		n.name = "union [" + strings.Join(names, ", ") + "]"
		return n, nil
	}
	return nil, fmt.Errorf("avro type %s is not supported", s.Type())
}

func (b *avroBuilder) record(s *avro.RecordSchema) (*avroNode, error) {
	n := &avroNode{kind: avroRecord, name: s.FullName(), wrap: s.FullName(), fieldAt: map[string]int{}}
	b.named[s.FullName()] = n // before the fields: they may refer back to it
	n.fields = make([]avroField, len(s.Fields()))
	for i, f := range s.Fields() {
		fn, err := b.node(f.Type())
		if err != nil {
			return nil, err
		}
		n.fields[i] = avroField{name: f.Name(), node: fn, hasDef: f.HasDefault()}
		n.fieldAt[f.Name()] = i
		if f.HasDefault() {
			b.defaults = append(b.defaults, pendingDefault{record: s.FullName(), f: &n.fields[i], value: f.Default()})
		}
	}
	return n, nil
}

var primitiveKinds = map[avro.Type]avroKind{
	avro.Boolean: avroBoolean, avro.Int: avroInt, avro.Long: avroLong, avro.Float: avroFloat,
	avro.Double: avroDouble, avro.Bytes: avroBytes, avro.String: avroString, avro.Null: avroNull,
}

// logicalBases lists the logical types this package interprets and the
// type each annotates; any other annotation is ignored, as the Avro
// specification says, and the value follows its base type.
var logicalBases = map[avro.LogicalType]avro.Type{
	avro.Date: avro.Int, avro.TimeMillis: avro.Int, avro.TimeMicros: avro.Long,
	avro.TimestampMillis: avro.Long, avro.TimestampMicros: avro.Long,
	avro.LocalTimestampMillis: avro.Long, avro.LocalTimestampMicros: avro.Long,
	avro.UUID: avro.String, avro.Decimal: avro.Bytes,
}

func primitiveNode(s *avro.PrimitiveSchema) (*avroNode, error) {
	k, ok := primitiveKinds[s.Type()]
	if !ok {
		return nil, fmt.Errorf("avro type %s is not supported", s.Type())
	}
	n := &avroNode{kind: k, name: string(s.Type()), wrap: string(s.Type())}
	if s.Logical() == nil {
		return n, nil
	}
	lt := s.Logical().Type()
	if logicalBases[lt] != s.Type() {
		return n, nil
	}
	n.logical = lt
	n.name = string(lt)
	if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
		n.precision, n.scale = d.Precision(), d.Scale()
		n.name = fmt.Sprintf("decimal(%d,%d)", n.precision, n.scale)
	}
	return n, nil
}

// appendDefault writes a field's default, as hamba parsed it from the
// schema (Avro's JSON encoding: bytes and fixed as ISO-8859-1 strings,
// already turned into bytes; a union's default belongs to its first
// branch). Logical types do not matter here: a default is the base value.
func appendDefault(dst []byte, n *avroNode, v any) ([]byte, error) {
	switch n.kind {
	case avroNull:
		return dst, nil
	case avroBoolean:
		if b, ok := v.(bool); ok {
			return appendBool(dst, b), nil
		}
	case avroInt, avroLong:
		switch i := v.(type) {
		case int:
			return appendLong(dst, int64(i)), nil
		case int64:
			return appendLong(dst, i), nil
		}
	case avroFloat:
		if f, ok := v.(float32); ok {
			return appendFloat(dst, f), nil
		}
	case avroDouble:
		if f, ok := v.(float64); ok {
			return appendDouble(dst, f), nil
		}
	case avroString, avroEnum:
		return appendDefaultString(dst, n, v)
	case avroBytes, avroFixed:
		return appendDefaultBytes(dst, n, v)
	case avroArray:
		return appendDefaultArray(dst, n, v)
	case avroMap, avroRecord:
		return appendDefaultObject(dst, n, v)
	case avroUnion:
		return appendDefault(appendLong(dst, 0), n.branches[0], v)
	}
	return nil, fmt.Errorf("%v (%T) is not a %s", v, v, n.name)
}

func appendDefaultString(dst []byte, n *avroNode, v any) ([]byte, error) {
	s, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("%v (%T) is not a %s", v, v, n.name)
	}
	if n.kind == avroEnum {
		i, ok := n.symbolAt[s]
		if !ok {
			return nil, fmt.Errorf("%q is not a symbol of %s", s, n.name)
		}
		return appendLong(dst, int64(i)), nil
	}
	return appendString(dst, s), nil
}

func appendDefaultBytes(dst []byte, n *avroNode, v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	if v == nil || (rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array) || rv.Type().Elem().Kind() != reflect.Uint8 {
		return nil, fmt.Errorf("%v (%T) is not %s", v, v, n.name)
	}
	b := make([]byte, rv.Len())
	reflect.Copy(reflect.ValueOf(b), rv)
	if n.kind == avroFixed {
		if len(b) != n.size {
			return nil, fmt.Errorf("%d bytes, %s has %d", len(b), n.name, n.size)
		}
		return append(dst, b...), nil
	}
	return appendString(dst, string(b)), nil
}

func appendDefaultArray(dst []byte, n *avroNode, v any) ([]byte, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%v (%T) is not an array", v, v)
	}
	if len(a) > 0 {
		dst = appendLong(dst, int64(len(a)))
	}
	for _, e := range a {
		var err error
		if dst, err = appendDefault(dst, n.items, e); err != nil {
			return nil, err
		}
	}
	return appendLong(dst, 0), nil
}

func appendDefaultObject(dst []byte, n *avroNode, v any) ([]byte, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%v (%T) is not a %s", v, v, n.name)
	}
	var err error
	if n.kind == avroRecord {
		for _, f := range n.fields {
			fv, ok := m[f.name]
			if !ok {
				return nil, fmt.Errorf("no value for field %s", f.name)
			}
			if dst, err = appendDefault(dst, f.node, fv); err != nil {
				return nil, err
			}
		}
		return dst, nil
	}
	keys := sortedKeys(m)
	if len(keys) > 0 {
		dst = appendLong(dst, int64(len(keys)))
	}
	for _, k := range keys {
		if dst, err = appendDefault(appendString(dst, k), n.items, m[k]); err != nil {
			return nil, err
		}
	}
	return appendLong(dst, 0), nil
}
