package contracts

import (
	"strings"

	writer "github.com/outbox-cdc/outbox-cdc/outbox/contracts"
)

// pointerEscaper escapes a reference token (RFC 6901 section 3).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// jsonSchemaCodec compiles JSON Schema with the writer library's judge
// (outbox/contracts: draft-07 by default, every loader refused, the error
// tree reduced to one pointer and one reason), so that the writer refuses
// before the INSERT exactly what the connector would dead-letter.
type jsonSchemaCodec struct{}

func (jsonSchemaCodec) compile(text string) (compiled, error) {
	s, err := writer.CompileJSONSchema(text)
	if err != nil {
		return nil, err
	}
	return jsonCompiled{s}, nil
}

type jsonCompiled struct{ s *writer.JSONSchema }

func (j jsonCompiled) check(payload []byte) *Violation {
	v := j.s.Check(payload)
	if v == nil {
		return nil
	}
	return &Violation{Pointer: v.Pointer, Keyword: v.Keyword, Reason: v.Reason, More: v.More}
}

// encode: the JSON Schema body is the payload's bytes, unchanged: consumers'
// JSON Schema deserializers read JSON, and re-serializing would make the
// bytes depend on this code's formatting.
func (j jsonCompiled) encode(dst, payload []byte) ([]byte, *Violation) {
	if v := j.check(payload); v != nil {
		return dst, v
	}
	return append(dst, payload...), nil
}
