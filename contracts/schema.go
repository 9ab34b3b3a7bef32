package contracts

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/twmb/franz-go/pkg/sr"
)

// codec turns a registered schema's text into a compiled checker of its
// format.
type codec interface {
	compile(text string) (compiled, error)
}

// codecOf is the one place a format picks its codec and the schemaType its
// texts are registered under; ok is false for a format this version cannot
// check.
func codecOf(f Format) (c codec, typ sr.SchemaType, ok bool) {
	switch f {
	case FormatJSONSchema:
		return jsonSchemaCodec{}, sr.TypeJSON, true
	case FormatProtobuf:
		return protobufCodec{}, sr.TypeProtobuf, true
	case FormatAvro:
		return avroCodec{}, sr.TypeAvro, true
	}
	return nil, 0, false
}

// compiled is one schema version of one format.
type compiled interface {
	// check reports how payload, the outbox row's JSON, fails the schema;
	// nil when it fits. The Violation's Schema is filled by the caller.
	check(payload []byte) *Violation
	// encode appends the body the format makes of payload to dst (after
	// the wire header: Protobuf's message indexes belong to the body).
	encode(dst, payload []byte) ([]byte, *Violation)
}

// Schema is one resolved schema version, compiled. Immutable; shared by
// every event of its subject.
type Schema struct {
	Ref  SchemaRef
	Text string // as registered
	c    compiled
}

// Validate returns nil when payload fits the schema, else a *Violation.
func (s *Schema) Validate(payload []byte) error {
	if v := s.c.check(payload); v != nil {
		v.Schema = s.Ref
		return v
	}
	return nil
}

// Encode appends the Confluent wire format of payload to dst: 0x00, the
// schema id (4 bytes, big-endian), then the body. On a *Violation dst is
// returned unchanged.
func (s *Schema) Encode(dst, payload []byte) ([]byte, error) {
	out, v := s.c.encode(AppendHeader(dst, s.Ref.ID), payload)
	if v != nil {
		v.Schema = s.Ref
		return dst, v
	}
	return out, nil
}

// Wire format: a magic byte then the schema id.
const (
	magic      = 0x00
	HeaderSize = 5
)

// AppendHeader appends the wire header of schema id to dst. id is a
// registry id, which Resolve has checked fits in 31 bits.
func AppendHeader(dst []byte, id int) []byte {
	return binary.BigEndian.AppendUint32(append(dst, magic), uint32(id))
}

// ErrNotFramed: a value that does not start with the wire header.
var ErrNotFramed = errors.New("not in the Confluent wire format")

// ParseHeader splits a framed value into its schema id and body, for
// consumers and tests; the length and the magic byte are checked first.
func ParseHeader(value []byte) (id int, body []byte, err error) {
	if len(value) < HeaderSize {
		return 0, nil, fmt.Errorf("%w: %d bytes, the header alone is %d", ErrNotFramed, len(value), HeaderSize)
	}
	if value[0] != magic {
		return 0, nil, fmt.Errorf("%w: first byte 0x%02x, want 0x00", ErrNotFramed, value[0])
	}
	u := binary.BigEndian.Uint32(value[1:HeaderSize])
	if u > math.MaxInt32 {
		return 0, nil, fmt.Errorf("%w: schema id %d is negative as the signed 32-bit id registries use", ErrNotFramed, int32(u))
	}
	return int(u), value[HeaderSize:], nil
}

// validID: registries hand out ids as Java ints; a negative or wider id
// cannot be framed and means the answer is not a registry's.
func validID(id int) bool { return id >= 0 && id <= math.MaxInt32 }
