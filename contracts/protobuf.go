package contracts

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/linker"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protobufCodec compiles the registered .proto text at run time (schemaType
// PROTOBUF). An event is the file's first top-level message: the message
// Confluent's serializers and deserializers default to, and the one whose
// message indexes are the single byte 0.
//
// The payload, the outbox row's JSON, is read with protojson's rules, the
// JSON mapping every Protobuf runtime shares: a field by its JSON name or its
// .proto name, int64 and uint64 as a JSON number or a decimal string, enums
// by name (or number), Timestamp and Duration as RFC 3339 and "1.5s"
// strings, bytes as base64, null as unset. An unknown field is a violation,
// not dropped: a field the schema does not know would be lost by encode
// without anyone noticing.
type protobufCodec struct{}

// protoFileName is the name the registered text is compiled under; imports
// are resolved by protoImport, never from this host's files.
const protoFileName = "contract.proto"

func (protobufCodec) compile(text string) (compiled, error) {
	c := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
			return protoImport(path, text)
		})),
		// One small file: more goroutines would only compete with the
		// pipeline.
		MaxParallelism: 1,
	}
	files, err := c.Compile(context.Background(), protoFileName)
	if err != nil {
		return nil, fmt.Errorf("schema is not a valid .proto file: %w", err)
	}
	file := files[0]
	if file.Messages().Len() == 0 {
		return nil, errors.New("the .proto file declares no message, so no event can be encoded with it")
	}
	md := file.Messages().Get(0)
	return &protoCompiled{
		typ:     dynamicpb.NewMessageType(md),
		indexes: appendMessageIndexes(nil, messageIndexes(md)),
		// Any's @type resolves against the file and its imports only,
		// not against whatever types this binary happens to link in.
		unmarshal: protojson.UnmarshalOptions{Resolver: linker.ResolverFromFile(file)},
	}, nil
}

// errReference is an import other than a well-known type: a registry schema
// reference, which this version does not resolve.
var errReference = errors.New("schema references are not supported in this version; " +
	"only the google/protobuf/*.proto well-known types can be imported")

// protoImport serves the registered text under protoFileName and refuses
// every other path; WithStandardImports answers the well-known types first
// when this refuses them.
func protoImport(path, text string) (protocompile.SearchResult, error) {
	if path == protoFileName {
		return protocompile.SearchResult{Source: strings.NewReader(text)}, nil
	}
	return protocompile.SearchResult{}, fmt.Errorf("import %q: %w", path, errReference)
}

// protoCompiled is one compiled .proto version and the message events use.
type protoCompiled struct {
	typ       protoreflect.MessageType
	indexes   []byte // the message indexes, encoded once
	unmarshal protojson.UnmarshalOptions
}

// deterministic: map entries sorted by key, so the same payload always
// yields the same bytes (replays, repair and exactly_once retries).
var deterministic = proto.MarshalOptions{Deterministic: true}

func (p *protoCompiled) check(payload []byte) *Violation {
	_, v := p.message(payload)
	return v
}

// encode appends the message indexes, then the binary message.
func (p *protoCompiled) encode(dst, payload []byte) ([]byte, *Violation) {
	m, v := p.message(payload)
	if v != nil {
		return dst, v
	}
	out, err := deterministic.MarshalAppend(append(dst, p.indexes...), m)
	if err != nil { // protojson accepted it, so this is not the payload's fault; say so anyway rather than panic
		return dst, &Violation{Reason: "cannot encode as Protobuf: " + err.Error()}
	}
	return out, nil
}

// message reads payload into a message of the event's type.
func (p *protoCompiled) message(payload []byte) (proto.Message, *Violation) {
	if len(bytes.TrimSpace(payload)) == 0 {
		return nil, &Violation{Keyword: string(p.typ.Descriptor().FullName()),
			Reason: "empty payload, want a JSON object (message " + string(p.typ.Descriptor().FullName()) + ")"}
	}
	m := p.typ.New().Interface()
	if err := p.unmarshal.Unmarshal(payload, m); err != nil {
		return nil, protoViolation(p.typ.Descriptor(), payload, err)
	}
	return m, nil
}

// messageIndexes is the path of md from its file's root: its index among
// the file's top-level messages, then among the nested messages of each
// enclosing message (Confluent's wire format; map entries are nested
// messages too, as in the descriptor's nested_type).
func messageIndexes(md protoreflect.MessageDescriptor) []int {
	var idx []int
	var d protoreflect.Descriptor = md
	for {
		idx = append(idx, d.Index())
		parent, ok := d.Parent().(protoreflect.MessageDescriptor)
		if !ok {
			break
		}
		d = parent
	}
	slices.Reverse(idx)
	return idx
}

// appendMessageIndexes encodes indexes as Confluent's Protobuf serializers
// do: the count, then each index, all as zig-zag varints
// (binary.AppendVarint); the first message, [0], is the single byte 0
// instead of 0x02 0x00, which deserializers read as an empty array, meaning
// the first message.
func appendMessageIndexes(dst []byte, idx []int) []byte {
	if len(idx) == 1 && idx[0] == 0 {
		return append(dst, 0)
	}
	dst = binary.AppendVarint(dst, int64(len(idx)))
	for _, i := range idx {
		dst = binary.AppendVarint(dst, int64(i))
	}
	return dst
}

// maxMessageDepth bounds the index array a reader accepts: a count from
// the wire is checked before anything is allocated. Protobuf itself stops
// nesting at 100 levels.
const maxMessageDepth = 100

// parseMessageIndexes reads the indexes at the start of a Protobuf body and
// returns them and the message bytes; the single byte 0 reads as [0]. For
// tests and consumers written in Go: every varint is bounded, the count is
// checked before allocating.
func parseMessageIndexes(body []byte) ([]int, []byte, error) {
	n, w := binary.Varint(body)
	if w <= 0 {
		return nil, nil, fmt.Errorf("%w: message index count: bad varint", ErrNotFramed)
	}
	switch {
	case n == 0:
		return []int{0}, body[w:], nil
	case n < 0 || n > maxMessageDepth:
		return nil, nil, fmt.Errorf("%w: message index count %d, want 1 to %d", ErrNotFramed, n, maxMessageDepth)
	}
	idx := make([]int, 0, n)
	rest := body[w:]
	for k := range n {
		i, w := binary.Varint(rest)
		if w <= 0 || i < 0 || i > 1<<31-1 {
			return nil, nil, fmt.Errorf("%w: message index %d of %d: bad varint or negative", ErrNotFramed, k, n)
		}
		idx = append(idx, int(i))
		rest = rest[w:]
	}
	return idx, rest, nil
}
