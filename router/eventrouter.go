package router

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Source is where a row comes from: its transaction's commit time and xid,
// and the WAL position of its insert (zero for rows read from the table).
type Source struct {
	Commit time.Time
	Xid    uint32
	LSN    lsn.LSN
}

var (
	textTrue  = []byte("true")
	textFalse = []byte("false")
)

// extras is what the EventRouter options add to a Router.
type extras struct {
	fields    []Field
	envelope  bool
	std       [3]bool // id, event_type, aggregate_type headers
	source    []string
	tsColumn  string
	tombstone bool
}

func newExtras(cfg Config) extras {
	x := extras{fields: slices.Clone(cfg.Fields), source: slices.Clone(cfg.SourceHeaders),
		tsColumn: cfg.TimestampColumn, tombstone: cfg.TombstoneOnEmpty, std: [3]bool{true, true, true}}
	if cfg.StandardHeaders != nil {
		for i, h := range standardHeaders {
			x.std[i] = slices.Contains(cfg.StandardHeaders, h)
		}
	}
	for _, f := range x.fields {
		x.envelope = x.envelope || f.Placement == PlaceEnvelope
	}
	return x
}

// RouteFrom is Route with the transaction's xid and the row's WAL position,
// which outbox.source_headers may publish.
func (r *Router) RouteFrom(ev *decode.Event, src Source, rec *Record) (reason string) {
	if ev.Invalid != "" {
		return ev.Invalid
	}
	if ev.AggregateID.Null {
		return "aggregate_id is NULL"
	}
	rt := r.topicFor(ev)
	if rt.reason != "" {
		return rt.reason
	}
	rec.Topic = rt.topic
	rec.Key = ev.AggregateID.Bytes
	rec.Partition, rec.HasPartition = 0, false
	rec.Timestamp = src.Commit
	x := &r.x
	if reason := x.timestamp(ev, rec); reason != "" {
		return reason
	}
	h, reason := x.headers(ev, src, rec)
	if reason != "" {
		return reason
	}
	rec.Headers = h
	if r.traceColumn != "" {
		rec.Headers = r.traceHeaders(rec.Headers, ev)
	}
	switch {
	case x.tombstone && emptyPayload(ev.Payload):
		rec.Value = nil
	case x.envelope:
		rec.Value = r.envelope(ev)
	default:
		rec.Value = valueOf(ev.Payload)
	}
	if r.ce != nil {
		return r.ce.shape(ev, src.Commit, rec)
	}
	return ""
}

// timestamp sets rec's timestamp from outbox.timestamp_column, if set and
// not NULL (NULL falls back to the commit time, as Debezium falls back to
// ts_ms).
func (x *extras) timestamp(ev *decode.Event, rec *Record) (reason string) {
	if x.tsColumn == "" {
		return ""
	}
	v, typ := column(ev, x.tsColumn)
	if v.Null {
		return ""
	}
	ts, err := parseTimestamp(string(v.Bytes), typ)
	if err != nil {
		return fmt.Sprintf("outbox.timestamp_column %q: %v", x.tsColumn, err)
	}
	rec.Timestamp = ts
	return ""
}

// headers builds rec's headers in their order (standard, the event's own,
// the fields placed as headers, the source headers) in rec.Headers' array,
// and sets rec's partition from a field placed there.
func (x *extras) headers(ev *decode.Event, src Source, rec *Record) (h []Header, reason string) {
	h = rec.Headers[:0]
	if x.std[0] {
		h = appendValue(h, wire.HeaderID, ev.ID)
	}
	if x.std[1] {
		h = appendValue(h, wire.HeaderEventType, ev.EventType)
	}
	if x.std[2] {
		h = appendValue(h, wire.HeaderAggregateType, ev.AggregateType)
	}
	for _, c := range ev.Headers {
		h = appendValue(h, c.Name, c.Value)
	}
	for _, f := range x.fields {
		v, typ := column(ev, f.Column)
		switch f.Placement {
		case PlaceHeader:
			// Kafka Connect's SimpleHeaderConverter: NULL is a null header,
			// a boolean is true/false, anything else its text.
			h = append(h, Header{f.Alias, headerValue(v, typ)})
		case PlacePartition:
			if v.Null {
				continue // Debezium: a NULL partition leaves it to the key
			}
			p, err := strconv.ParseInt(string(v.Bytes), 10, 32)
			if err != nil || p < 0 {
				return h, fmt.Sprintf("partition column %q holds %q, not a partition number", f.Column, v.Bytes)
			}
			rec.Partition, rec.HasPartition = int32(p), true
		}
	}
	for _, s := range x.source {
		switch s {
		case wire.HeaderLSN:
			if src.LSN != 0 {
				h = append(h, Header{wire.HeaderLSN, []byte(src.LSN.String())})
			}
		case wire.HeaderXid:
			if src.Xid != 0 {
				h = append(h, Header{wire.HeaderXid, strconv.AppendUint(nil, uint64(src.Xid), 10)})
			}
		case wire.HeaderCommitTime:
			h = append(h, Header{wire.HeaderCommitTime, src.Commit.UTC().AppendFormat(nil, "2006-01-02T15:04:05.000000Z07:00")})
		}
	}
	return h, ""
}

// appendValue appends a header for v unless it is NULL.
func appendValue(h []Header, key string, v decode.Value) []Header {
	if v.Null {
		return h
	}
	return append(h, Header{key, v.Bytes})
}

// emptyPayload is Debezium's route.tombstone.on.empty.payload test: NULL, or
// nothing but what Java's String.trim removes (characters up to U+0020).
func emptyPayload(v decode.Value) bool {
	if v.Null {
		return true
	}
	for _, c := range v.Bytes {
		if c > ' ' {
			return false
		}
	}
	return true
}

// envelope builds the value Debezium's EventRouter gives with an envelope
// placement, as Kafka's JsonConverter writes it with schemas.enable=false:
// {"payload":<payload as a JSON string, base64 for bytes>,<alias>:<value>,...}, compact, members
// in outbox.fields order. The value is a new slice: it outlives the call.
func (r *Router) envelope(ev *decode.Event) []byte {
	b := make([]byte, 0, 16+len(ev.Payload.Bytes)*11/10)
	b = append(b, `{"`+envelopePayload+`":`...)
	if ev.PayloadFormat == decode.PayloadBinary && !ev.Payload.Null { // JsonConverter writes bytes as base64
		b = appendJSONString(b, base64.StdEncoding.EncodeToString(ev.Payload.Bytes))
	} else {
		b = appendJSONValue(b, ev.Payload, 0)
	}
	for _, f := range r.x.fields {
		if f.Placement != PlaceEnvelope {
			continue
		}
		v, typ := column(ev, f.Column)
		b = append(b, ',')
		b = appendJSONString(b, f.Alias)
		b = append(b, ':')
		b = appendJSONValue(b, v, typ)
	}
	return append(b, '}')
}

// headerValue is a column's header value.
func headerValue(v decode.Value, typ uint32) []byte {
	switch {
	case v.Null:
		return nil
	case typ == decode.OIDBool && len(v.Bytes) == 1:
		if v.Bytes[0] == 't' {
			return textTrue
		}
		return textFalse
	case v.Bytes == nil:
		return []byte{}
	}
	return v.Bytes
}

// appendJSONValue writes a column value as Debezium's schema for its type
// reaches JsonConverter: booleans and integers as JSON literals, everything
// else (text, uuid, json/jsonb, numeric as with decimal.handling.mode=string)
// as a JSON string of its text form.
func appendJSONValue(b []byte, v decode.Value, typ uint32) []byte {
	switch {
	case v.Null:
		return append(b, "null"...)
	case typ == decode.OIDBool && len(v.Bytes) == 1:
		if v.Bytes[0] == 't' {
			return append(b, "true"...)
		}
		return append(b, "false"...)
	case typ == decode.OIDInt2 || typ == decode.OIDInt4 || typ == decode.OIDInt8:
		return append(b, v.Bytes...)
	case typ == decode.OIDFloat4 || typ == decode.OIDFloat8:
		if _, err := strconv.ParseFloat(string(v.Bytes), 64); err == nil && v.Bytes[len(v.Bytes)-1] >= '0' && v.Bytes[len(v.Bytes)-1] <= '9' {
			return append(b, v.Bytes...)
		}
	}
	return appendJSONString(b, string(v.Bytes))
}

// appendJSONString quotes s as Jackson's UTF8JsonGenerator does for
// JsonConverter: ", \ and control characters escaped (\b \t \n \f \r by
// name, others \u00XX in upper case), a character outside the BMP as its
// UTF-16 surrogate pair (\uD83D\uDE80: Jackson escapes each half), nothing
// else.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 0xF0: // the first byte of a 4-byte sequence: outside the BMP
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError || size != 4 {
				b = append(b, c) // not valid UTF-8: as it is, as before
				continue
			}
			hi, lo := utf16.EncodeRune(r)
			for _, u := range [2]rune{hi, lo} {
				b = append(b, '\\', 'u', hex[u>>12&0xF], hex[u>>8&0xF], hex[u>>4&0xF], hex[u&0xF])
			}
			i += size - 1
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// parseTimestamp reads a timestamp or timestamptz column in PostgreSQL's
// text form (DateStyle ISO, the default); a timestamp without time zone is
// UTC, as Debezium reads it.
func parseTimestamp(s string, typ uint32) (time.Time, error) {
	layout := "2006-01-02 15:04:05.999999999"
	if typ == decode.OIDTimestamptz {
		layout += "Z07"
		if len(s) > 3 && s[len(s)-3] == ':' { // an offset with minutes: +05:30
			layout += ":00"
		}
	} else if typ != decode.OIDTimestamp && typ != 0 {
		return time.Time{}, fmt.Errorf("type OID %d is not timestamp or timestamptz", typ)
	}
	if typ == 0 && len(s) > 3 && (s[len(s)-3] == '+' || s[len(s)-3] == '-') { // type unknown: offset present
		layout += "Z07"
	}
	t, err := time.Parse(layout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is not a timestamp in ISO form", s)
	}
	return t, nil
}
