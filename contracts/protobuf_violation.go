package contracts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// protojson's errors name a position, not a path: "(line 1:18): invalid
// value for int32 field qty: \"x\"" (the "proto:" prefix has a varying
// space, so only the position is matched). The position is the start of the
// offending token: the value, or the name of an unknown field.
var protojsonPos = regexp.MustCompile(`\(line (\d+):(\d+)\): `)

// protoRequired is proto.CheckInitialized's error: a proto2 required field
// not set, named in full.
var protoRequired = regexp.MustCompile(`required field (\S+) not set`)

// protoViolation turns protojson's error about payload into a Violation: the
// JSON pointer of the token it points at, the field's full name as Keyword,
// and protojson's message with what the field wants. The same payload and
// schema always give the same violation.
func protoViolation(md protoreflect.MessageDescriptor, payload []byte, err error) *Violation {
	msg := err.Error()
	v := &Violation{Keyword: string(md.FullName())}
	// protojson reports some syntax errors as invalid values; the
	// producer team needs to know the payload is not JSON at all.
	notJSON := ""
	if !json.Valid(payload) {
		notJSON = "not JSON: "
	}
	m := protojsonPos.FindStringSubmatchIndex(msg)
	if m == nil {
		// No position: a proto2 required field not set ("required field
		// pkg.Msg.name not set"), an unexpected end of input.
		_, after, _ := strings.Cut(msg, ":")
		v.Reason = notJSON + strings.TrimSpace(after)
		if r := protoRequired.FindStringSubmatch(msg); r != nil {
			v.Pointer, v.Keyword = requiredAt(md, payload, r[1])
		}
		return v
	}
	line, _ := strconv.Atoi(msg[m[2]:m[3]])
	col, _ := strconv.Atoi(msg[m[4]:m[5]])
	v.Reason = notJSON + msg[m[1]:]
	v.Pointer = pointerAt(payload, byteOffset(payload, line, col))
	fd, elem, parent := expectAt(md, splitPointer(v.Pointer))
	switch {
	case fd != nil:
		v.Keyword = string(fd.FullName())
		v.Reason += ", want " + wantOf(fd, elem)
	case parent != nil && v.Pointer != "" && strings.Contains(v.Reason, "unknown field"):
		v.Keyword = string(parent.FullName())
		v.Reason += ", want a field of message " + string(parent.FullName())
	case v.Pointer == "" && notJSON == "":
		v.Reason += ", want a JSON object (message " + string(md.FullName()) + ")"
	}
	return v
}

// requiredAt points at a missing proto2 required field when it is one of
// the event's message and the payload's top level lacks it (a recursive
// message names the same field at every depth); else "", the field's name.
func requiredAt(md protoreflect.MessageDescriptor, payload []byte, field string) (pointer, keyword string) {
	fd := md.Fields().ByName(protoreflect.FullName(field).Name())
	var top map[string]json.RawMessage
	if fd == nil || string(fd.FullName()) != field || json.Unmarshal(payload, &top) != nil {
		return "", field
	}
	for _, k := range []string{fd.JSONName(), fd.TextName()} {
		if raw, ok := top[k]; ok && string(raw) != "null" {
			return "", field
		}
	}
	return "/" + pointerEscaper.Replace(fd.JSONName()), field
}

// byteOffset converts protojson's 1-based line and column, the column
// counted in runes (an invalid byte counts as one), to a byte offset.
func byteOffset(b []byte, line, col int) int {
	off := 0
	for ; line > 1; line-- {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			return len(b)
		}
		off += i + 1
	}
	for ; col > 1 && off < len(b); col-- {
		_, w := utf8.DecodeRune(b[off:])
		off += w
	}
	return off
}

// jsonFrame is an object or array being read by pointerAt.
type jsonFrame struct {
	path    string // its own pointer
	object  bool
	key     string // object: the current member's name
	wantKey bool   // object: the next string is a member name
	index   int    // array: the current element's index
}

func (f *jsonFrame) child() string {
	if f.object {
		return f.path + "/" + pointerEscaper.Replace(f.key)
	}
	return f.path + "/" + strconv.Itoa(f.index)
}

// done records that the current member or element was read.
func (f *jsonFrame) done() {
	if f.object {
		f.wantKey = true
	} else {
		f.index++
	}
}

// pointerAt returns the JSON pointer of the token of payload that contains
// byte off: a value's own pointer, or for a member name the member's
// pointer (an unknown field points at itself). Where payload stops being
// JSON before off, the pointer of the deepest value reached.
func pointerAt(payload []byte, off int) string {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var stack []*jsonFrame
	valuePath := func() string {
		if len(stack) == 0 {
			return ""
		}
		return stack[len(stack)-1].child()
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return valuePath()
		}
		// Each Token call consumes the separators and spaces before its
		// token, so the token containing off is the first to end past it.
		hit := int(dec.InputOffset()) > off
		var top *jsonFrame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				p := valuePath()
				if hit {
					return p
				}
				stack = append(stack, &jsonFrame{path: p, object: t == '{', wantKey: t == '{'})
				continue
			}
			if hit {
				return top.path
			}
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				stack[len(stack)-1].done()
			}
		case string:
			if top != nil && top.object && top.wantKey {
				top.key, top.wantKey = t, false
				if hit {
					return top.child()
				}
				continue
			}
			if hit {
				return valuePath()
			}
			if top != nil {
				top.done()
			}
		default:
			if hit {
				return valuePath()
			}
			if top != nil {
				top.done()
			}
		}
	}
}

// splitPointer returns the unescaped reference tokens of an RFC 6901
// pointer.
func splitPointer(p string) []string {
	if p == "" {
		return nil
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		toks[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return toks
}

// expectAt follows tokens through md: the field the last token names and
// whether the pointer is at one element of that repeated or map field. nil
// when a token names no field; parent is then the message it was looked up
// in (nil inside a well-known type's JSON form, which has no fields there).
func expectAt(md protoreflect.MessageDescriptor, tokens []string) (fd protoreflect.FieldDescriptor, elem bool, parent protoreflect.MessageDescriptor) {
	cur := md
	for i := 0; i < len(tokens); i++ {
		if cur == nil || specialJSON(cur) {
			return nil, false, nil
		}
		f := cur.Fields().ByJSONName(tokens[i])
		if f == nil {
			f = cur.Fields().ByTextName(tokens[i])
		}
		if f == nil {
			return nil, false, cur
		}
		if i == len(tokens)-1 {
			return f, false, cur
		}
		if f.IsList() || f.IsMap() {
			if i++; i == len(tokens)-1 {
				return f, true, cur
			}
			if f.IsMap() {
				f = f.MapValue()
			}
		}
		cur = f.Message()
	}
	return nil, false, cur
}

// specialJSON: the well-known types whose JSON form is not an object of
// their fields (protojson's list).
func specialJSON(md protoreflect.MessageDescriptor) bool {
	switch md.FullName() {
	case "google.protobuf.Any", "google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask",
		"google.protobuf.Struct", "google.protobuf.ListValue", "google.protobuf.Value":
		return true
	}
	return isWrapper(md)
}

// isWrapper: google.protobuf.Int64Value and the other wrappers, read as the
// value they wrap.
func isWrapper(md protoreflect.MessageDescriptor) bool {
	return md.FullName().Parent() == "google.protobuf" && strings.HasSuffix(string(md.Name()), "Value") &&
		md.Fields().Len() == 1 && md.Fields().ByName("value") != nil && md.FullName() != "google.protobuf.Value"
}

// wantOf says what JSON fd accepts (one element of it when elem).
func wantOf(fd protoreflect.FieldDescriptor, elem bool) string {
	switch {
	case fd.IsMap() && !elem:
		return "a JSON object whose values are " + wantOf(fd.MapValue(), false)
	case fd.IsMap():
		return wantOf(fd.MapValue(), false)
	case fd.IsList() && !elem:
		return "a JSON array of " + wantKind(fd)
	}
	return wantKind(fd)
}

func wantKind(fd protoreflect.FieldDescriptor) string {
	switch k := fd.Kind(); k {
	case protoreflect.BoolKind:
		return "true or false"
	case protoreflect.StringKind:
		return "a string"
	case protoreflect.BytesKind:
		return "a base64 string"
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "a number or \"NaN\", \"Infinity\", \"-Infinity\""
	case protoreflect.EnumKind:
		return enumWant(fd.Enum())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return messageWant(fd.Message())
	default: // the integer kinds
		return fmt.Sprintf("an integer in %s range (a JSON number or a decimal string)", k)
	}
}

func enumWant(ed protoreflect.EnumDescriptor) string {
	vals := ed.Values()
	names := make([]string, 0, min(vals.Len(), 8))
	for i := range min(vals.Len(), 8) {
		names = append(names, string(vals.Get(i).Name()))
	}
	more := ""
	if vals.Len() > len(names) {
		more = ", ..."
	}
	return fmt.Sprintf("a name of enum %s (%s%s) or its number", ed.FullName(), strings.Join(names, ", "), more)
}

func messageWant(md protoreflect.MessageDescriptor) string {
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		return "an RFC 3339 timestamp string such as \"2024-05-01T12:00:00Z\""
	case "google.protobuf.Duration":
		return "a duration string such as \"1.5s\""
	case "google.protobuf.FieldMask":
		return "a string of comma-separated field paths"
	case "google.protobuf.Struct":
		return "a JSON object"
	case "google.protobuf.ListValue":
		return "a JSON array"
	case "google.protobuf.Value":
		return "any JSON value"
	case "google.protobuf.Any":
		return "a JSON object with \"@type\""
	}
	if isWrapper(md) {
		return wantKind(md.Fields().ByName("value"))
	}
	return "a JSON object (message " + string(md.FullName()) + ")"
}
