package router

import (
	"fmt"
	"slices"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Placement says where an extra column goes (outbox.fields), as in
// Debezium's table.fields.additional.placement.
type Placement string

const (
	PlaceHeader    Placement = "header"    // a header named by the alias
	PlaceEnvelope  Placement = "envelope"  // a member of the JSON envelope the value becomes
	PlacePartition Placement = "partition" // the record's partition (an integer column)
)

// Field is one outbox.fields entry: column:placement[:alias].
type Field struct {
	Column    string
	Placement Placement
	Alias     string // header or envelope member name; the column's when not given
}

// ParseField reads "column:placement[:alias]" the way Debezium does
// (EventRouterConfigDefinition.parseAdditionalFieldsConfig): parts trimmed,
// placement case-insensitive, the alias defaulting to the column.
func ParseField(s string) (Field, error) {
	parts := strings.Split(s, ":")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
		return Field{}, fmt.Errorf("%q is not column:placement[:alias]", s)
	}
	f := Field{Column: parts[0], Placement: Placement(strings.ToLower(parts[1])), Alias: parts[0]}
	if len(parts) == 3 {
		if parts[2] == "" {
			return Field{}, fmt.Errorf("%q has an empty alias", s)
		}
		f.Alias = parts[2]
	}
	switch f.Placement {
	case PlaceHeader, PlaceEnvelope:
	case PlacePartition:
		if len(parts) == 3 {
			return Field{}, fmt.Errorf("%q: a partition placement takes no alias", s)
		}
	default:
		return Field{}, fmt.Errorf("%q: placement %q is not header, envelope or partition", s, parts[1])
	}
	return f, nil
}

// String is the field in outbox.fields syntax.
func (f Field) String() string {
	if f.Placement == PlacePartition || f.Alias == f.Column {
		return f.Column + ":" + string(f.Placement)
	}
	return f.Column + ":" + string(f.Placement) + ":" + f.Alias
}

// The built-in headers outbox.standard_headers chooses from, and the
// transaction headers of outbox.source_headers.
var (
	standardHeaders = []string{"id", "event_type", "aggregate_type"}
	sourceHeaders   = []string{wire.HeaderLSN, wire.HeaderXid, wire.HeaderCommitTime}
)

// envelopePayload is the envelope member holding the payload (Debezium's
// EventRouterDelegate.ENVELOPE_PAYLOAD).
const envelopePayload = "payload"

// FieldProblems returns the problems of cfg's EventRouter options
// (Fields, StandardHeaders, SourceHeaders); Check includes them.
func (cfg Config) FieldProblems() []Problem {
	var out []Problem
	envelope := map[string]bool{envelopePayload: true}
	headers := map[string]bool{}
	partitions := 0
	for i, f := range cfg.Fields {
		key := fmt.Sprintf("outbox.fields[%d]", i)
		if _, err := ParseField(f.String()); err != nil || f.Column == "" {
			out = append(out, Problem{key, f.String(), "not column:placement[:alias]", "header, envelope or partition"})
			continue
		}
		switch f.Placement {
		case PlaceEnvelope:
			if envelope[f.Alias] {
				out = append(out, Problem{key, f.String(), fmt.Sprintf("envelope member %q appears twice", f.Alias),
					"give it another alias (payload is the payload's)"})
			}
			envelope[f.Alias] = true
			if cfg.Format == FormatCEBinary || cfg.Format == FormatCEStructured {
				// Two value formats for one record: a CloudEvent's data would
				// be the envelope, which neither Debezium nor CloudEvents
				// consumers expect.
				out = append(out, Problem{key, f.String(), "an envelope placement with kafka.format " + cfg.Format,
					"place the column as a header, or use kafka.format plain"})
			}
		case PlaceHeader:
			if headers[f.Alias] {
				out = append(out, Problem{key, f.String(), fmt.Sprintf("header %q appears twice", f.Alias), "give it another alias"})
			}
			headers[f.Alias] = true
		case PlacePartition:
			if partitions++; partitions > 1 {
				out = append(out, Problem{key, f.String(), "a second partition column", "keep one"})
			}
		}
	}
	for i, h := range cfg.StandardHeaders {
		if !slices.Contains(standardHeaders, h) || slices.Index(cfg.StandardHeaders, h) != i {
			out = append(out, Problem{"outbox.standard_headers", h, "not one of id, event_type, aggregate_type, or repeated", ""})
		}
	}
	for i, h := range cfg.SourceHeaders {
		if !slices.Contains(sourceHeaders, h) || slices.Index(cfg.SourceHeaders, h) != i {
			out = append(out, Problem{"outbox.source_headers", h, "not one of lsn, xid, commit_time, or repeated", ""})
		}
	}
	return out
}

// Columns lists the extra columns the router needs delivered
// (decode.Mapping.Columns): those of outbox.fields, the timestamp column and
// the topic template's {column:NAME} placeholders, each once.
func (cfg Config) Columns() []string {
	var out []string
	add := func(c string) {
		if c != "" && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	for _, f := range cfg.Fields {
		add(f.Column)
	}
	add(cfg.TimestampColumn)
	for _, c := range templateColumns(cfg.TopicTemplate) {
		add(c)
	}
	return out
}
