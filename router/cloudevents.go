package router

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Record formats (kafka.format). The CloudEvents ones follow CloudEvents 1.0.2
// and its Kafka protocol binding (docs/guide.md shows a record of each).
const (
	FormatPlain        = "plain"
	FormatCEBinary     = "cloudevents-binary"
	FormatCEStructured = "cloudevents-structured"
)

// Formats lists the values of kafka.format.
func Formats() []string { return []string{FormatPlain, FormatCEBinary, FormatCEStructured} }

// ceSpecVersion is the CloudEvents version the records follow; the header
// names are wire's.
const ceSpecVersion = "1.0"

// The placeholders kafka.cloudevents.source may use, resolved once at start.
const (
	SourceDatabase = "{database}"
	SourceSchema   = "{schema}"
	SourceTable    = "{table}"
)

// DefaultSource is kafka.cloudevents.source's default.
const DefaultSource = "/outbox-cdc/" + SourceDatabase + "/" + SourceSchema + "." + SourceTable

// CloudEvents holds the settings of the cloudevents-* formats
// (kafka.cloudevents.*).
type CloudEvents struct {
	// Source is the ce source, placeholders already expanded (ExpandSource).
	Source string
	// ContentType overrides the datacontenttype derived from the payload
	// column's type; "" derives it.
	ContentType string
}

// ExpandSource fills a kafka.cloudevents.source template in. The values are
// path-escaped so that a template that is a URI reference stays one.
func ExpandSource(template, database, schema, table string) string {
	return strings.NewReplacer(SourceDatabase, url.PathEscape(database), SourceSchema, url.PathEscape(schema),
		SourceTable, url.PathEscape(table)).Replace(template)
}

// CheckCloudEvents returns the problems of kafka.format and the
// kafka.cloudevents keys; source is the template, before ExpandSource.
func CheckCloudEvents(format string, ce CloudEvents) []Problem {
	var out []Problem
	ceFormat := format == FormatCEBinary || format == FormatCEStructured
	if !ceFormat && format != FormatPlain {
		out = append(out, Problem{"kafka.format", format, "not supported", "use one of " + strings.Join(Formats(), ", ")})
	}
	if p := sourceProblem(ce.Source); p != "" {
		out = append(out, Problem{"kafka.cloudevents.source", ce.Source, p,
			"use a URI reference such as " + DefaultSource + "; placeholders: " + SourceDatabase + ", " + SourceSchema + ", " + SourceTable})
	}
	if ce.ContentType == "" {
		return out
	}
	if !ceFormat {
		out = append(out, Problem{"kafka.cloudevents.content_type", ce.ContentType, "set while kafka.format is " + format + ", which does not use it",
			"set kafka.format to " + FormatCEBinary + " or " + FormatCEStructured + ", or remove the key"})
	}
	switch mt, _, err := mime.ParseMediaType(ce.ContentType); {
	case err != nil || !strings.Contains(mt, "/"):
		out = append(out, Problem{"kafka.cloudevents.content_type", ce.ContentType, "not a media type (type/subtype)",
			`use a media type such as application/json, or "" to derive it from the payload column's type`})
	case strings.HasPrefix(mt, wire.CEMediaPrefix):
		out = append(out, Problem{"kafka.cloudevents.content_type", ce.ContentType, "a CloudEvents event format, which receivers would read as structured mode",
			"give the media type of the payload itself"})
	}
	return out
}

// sourceProblem checks a source template: only the known placeholders, and
// a non-empty URI reference once they are filled in (CloudEvents 1.0.2,
// "source").
func sourceProblem(t string) string {
	if t == "" {
		return "must not be empty"
	}
	for _, ph := range placeholderRE.FindAllString(t, -1) {
		switch ph {
		case SourceDatabase, SourceSchema, SourceTable:
		default:
			return "unknown placeholder " + ph
		}
	}
	if _, err := url.Parse(ExpandSource(t, "x", "x", "x")); err != nil {
		return "not a URI reference: " + err.Error()
	}
	return ""
}

// shaper turns a routed plain record into a CloudEvent in place.
type shaper struct {
	structured  bool
	source      []byte
	contentType string // the override, or ""
}

// newShaper returns nil for the plain format.
func newShaper(format string, ce CloudEvents) (*shaper, error) {
	if format == FormatPlain {
		return nil, nil
	}
	if problems := CheckCloudEvents(format, ce); len(problems) > 0 {
		return nil, problems[0]
	}
	return &shaper{structured: format == FormatCEStructured, source: []byte(ce.Source), contentType: ce.ContentType}, nil
}

// contentTypes derived from the payload column's type.
var contentTypes = [...]string{
	decode.PayloadText:   "text/plain",
	decode.PayloadJSON:   "application/json",
	decode.PayloadBinary: "application/octet-stream",
}

// shape rewrites rec, which Route filled in for ev, as a CloudEvent. The
// plain headers stay (the inbox and existing consumers read them; the
// binding allows other headers). It returns why ev cannot be a CloudEvent,
// or "". Unlike the plain record, its new bytes are allocated per record:
// the sink keeps them until the broker acknowledges.
func (s *shaper) shape(ev *decode.Event, commit time.Time, rec *Record) string {
	for _, a := range [...]struct {
		name string
		v    decode.Value
	}{{"id", ev.ID}, {"event_type", ev.EventType}} {
		switch {
		case a.v.Null || len(a.v.Bytes) == 0:
			return a.name + " is NULL or empty, but a CloudEvent requires it"
		case !utf8.Valid(a.v.Bytes):
			return a.name + " is not valid UTF-8, but a CloudEvent attribute is a string"
		}
	}
	// subject and partitionkey are optional: the key carries the aggregate
	// id whatever it holds.
	subject := ev.AggregateID.Bytes
	if !utf8.Valid(subject) {
		subject = nil
	}
	ct := s.contentType
	if ct == "" {
		ct = contentTypes[ev.PayloadFormat]
	}
	attrs := [...]Header{
		{"specversion", []byte(ceSpecVersion)},
		{"id", ev.ID.Bytes},
		{"source", s.source},
		{"type", ev.EventType.Bytes},
		{"subject", subject},
		{"time", commit.UTC().AppendFormat(nil, time.RFC3339Nano)},
		{"partitionkey", subject}, // Partitioning extension: lets CloudEvents forwarders keep the key
	}
	// A tombstone (a NULL payload, or an empty one with
	// outbox.tombstone_on_empty_payload) stays a nil value, which compaction
	// needs, so it is sent in binary mode in either format: an event without
	// data.
	if !s.structured || rec.Value == nil {
		for _, a := range attrs {
			if len(a.Value) > 0 {
				rec.Headers = append(rec.Headers, Header{wire.CEHeaderPrefix + a.Key, a.Value})
			}
		}
		if rec.Value != nil {
			rec.Headers = append(rec.Headers, Header{wire.HeaderContentType, []byte(ct)})
		}
		return ""
	}
	v, reason := structuredValue(attrs[:], ct, ev)
	if reason != "" {
		return reason
	}
	rec.Value = v
	rec.Headers = append(rec.Headers, Header{wire.HeaderContentType, []byte(wire.CEStructuredJSON)})
	return ""
}

// structuredValue renders the JSON event format (CloudEvents 1.0.2
// json-format.md): a payload of a JSON content type goes in as data
// byte for byte, bytes (and text that is not UTF-8) as data_base64, other
// text as a JSON string.
func structuredValue(attrs []Header, ct string, ev *decode.Event) ([]byte, string) {
	p := ev.Payload.Bytes
	var data []byte
	name := "data"
	switch {
	case ev.PayloadFormat == decode.PayloadBinary || !utf8.Valid(p):
		name, data = "data_base64", jsonString(base64.StdEncoding.EncodeToString(p))
	case wire.JSONContentType(ct):
		// json and jsonb values are JSON already; text under a configured
		// JSON type may not be.
		if ev.PayloadFormat != decode.PayloadJSON && !json.Valid(p) {
			return nil, fmt.Sprintf("payload is not JSON, but its datacontenttype %q says it is", ct)
		}
		data = p
	default:
		data = jsonString(string(p))
	}
	v := make([]byte, 0, len(data)+256)
	v = append(v, '{')
	for _, a := range attrs {
		if len(a.Value) > 0 {
			v = append(append(append(v, jsonString(a.Key)...), ':'), jsonString(string(a.Value))...)
			v = append(v, ',')
		}
	}
	v = append(append(append(v, `"datacontenttype":`...), jsonString(ct)...), ',')
	v = append(append(append(append(v, jsonString(name)...), ':'), data...), '}')
	return v, ""
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}

// Format is the router's kafka.format: FormatPlain, FormatCEBinary or
// FormatCEStructured.
func (r *Router) Format() string {
	switch {
	case r.ce == nil:
		return FormatPlain
	case r.ce.structured:
		return FormatCEStructured
	}
	return FormatCEBinary
}
