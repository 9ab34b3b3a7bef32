package contracts

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// printer renders the library's failure kinds ("got string, want integer").
var printer = message.NewPrinter(language.English)

// pointerEscaper escapes a reference token (RFC 6901 section 3).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// jsonSchemaCodec compiles JSON Schema. Schemas without $schema are read as
// draft-07, the draft Confluent's JSON Schema serializers default to, so the
// connector and the registry's compatibility check agree on what a schema
// means.
type jsonSchemaCodec struct{}

// schemaURL is the name the schema text is compiled under; no file or
// network location is ever read (see compile).
const schemaURL = "mem:///contract.json"

func (jsonSchemaCodec) compile(text string) (compiled, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	// A $ref to a file or a URL would make a registry entry read this
	// host's files or call out; references are registry references, which
	// this version does not resolve, so every loader is refused.
	c.UseLoader(jsonschema.SchemeURLLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		return nil, err
	}
	return jsonCompiled{s}, nil
}

type jsonCompiled struct{ s *jsonschema.Schema }

func (j jsonCompiled) check(payload []byte) *Violation {
	if len(bytes.TrimSpace(payload)) == 0 {
		return &Violation{Reason: "empty payload, want a JSON value"}
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &Violation{Reason: "not JSON: " + err.Error()}
	}
	err = j.s.Validate(inst)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok { // not a schema failure: say so rather than guess a pointer
		return &Violation{Reason: err.Error()}
	}
	return violationOf(ve)
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

// failure is one leaf of a validation error tree.
type failure struct{ pointer, keyword, reason string }

// violationOf reduces the library's error tree to its leaves, the failures
// that say what was wrong (the inner nodes only say "allOf failed"), and
// reports the first by pointer, then keyword: a fixed order, so the same
// payload always gets the same reason whatever order the library found them.
func violationOf(ve *jsonschema.ValidationError) *Violation {
	var leaves []failure
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		leaves = append(leaves, leafFailure(e))
	}
	walk(ve)
	if len(leaves) == 0 { // cannot happen: a failure has a leaf
		return &Violation{Reason: ve.Error()}
	}
	slices.SortFunc(leaves, func(a, b failure) int {
		return cmp.Or(strings.Compare(a.pointer, b.pointer), strings.Compare(a.keyword, b.keyword), strings.Compare(a.reason, b.reason))
	})
	f := leaves[0]
	return &Violation{Pointer: f.pointer, Keyword: f.keyword, Reason: f.reason, More: len(leaves) - 1}
}

func leafFailure(e *jsonschema.ValidationError) failure {
	f := failure{pointer: pointer(e.InstanceLocation), reason: e.ErrorKind.LocalizedString(printer)}
	// The keyword's location in the schema: the fragment of the absolute
	// location the library records, plus the keyword itself.
	_, frag, _ := strings.Cut(e.SchemaURL, "#")
	f.keyword = frag + pointer(e.ErrorKind.KeywordPath())
	// A missing property has no value to point at; point where it belongs,
	// which is what a producer team needs to fix.
	if r, ok := e.ErrorKind.(*kind.Required); ok && len(r.Missing) > 0 {
		f.pointer += pointer([]string{r.Missing[0]})
		if len(r.Missing) == 1 {
			f.reason = "required property missing"
		}
	}
	return f
}

// pointer builds an RFC 6901 JSON pointer from reference tokens.
func pointer(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(pointerEscaper.Replace(t))
	}
	return b.String()
}
