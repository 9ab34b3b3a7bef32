package router

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// col is an extra column as the decoder delivers it.
func col(name, v string, typ uint32) decode.Column {
	return decode.Column{Name: name, Value: val(v), Type: typ}
}

func nullCol(name string, typ uint32) decode.Column {
	return decode.Column{Name: name, Value: null, Type: typ}
}

func fields(t *testing.T, specs ...string) []Field {
	t.Helper()
	out := make([]Field, len(specs))
	for i, s := range specs {
		f, err := ParseField(s)
		if err != nil {
			t.Fatalf("ParseField(%q): %v", s, err)
		}
		out[i] = f
	}
	return out
}

// hv is a header in a test's expectation; null marks a null value.
type hv struct {
	k, v string
	null bool
}

func TestRouteFrom(t *testing.T) {
	src := Source{Commit: commitTime, Xid: 584, LSN: lsn.LSN(0x16B3748)}
	tests := []struct {
		name      string
		cfg       Config
		cols      []decode.Column
		payload   *decode.Value // nil: event()'s
		binary    bool          // the payload is bytea
		wantTopic string        // "" = outbox.event.order
		wantValue *string       // nil: a tombstone
		wantHdrs  []hv
		wantPart  int32 // -1: by key
		wantTime  time.Time
		wantFail  string // a dead-letter reason containing this
	}{
		{
			name:     "defaults unchanged",
			wantHdrs: []hv{{k: "id", v: "0b6f1c2e-0000-4000-8000-000000000001"}, {k: "event_type", v: "OrderCreated"}, {k: "aggregate_type", v: "order"}},
		},
		{
			name: "Debezium: id header only, header fields with aliases",
			cfg:  Config{StandardHeaders: []string{"id"}, Fields: fields(t, "type:header:eventType", "flag:header", "note:header")},
			cols: []decode.Column{col("type", "OrderCreated", 25), col("flag", "t", decode.OIDBool), nullCol("note", 25)},
			wantHdrs: []hv{{k: "id", v: "0b6f1c2e-0000-4000-8000-000000000001"}, {k: "eventType", v: "OrderCreated"},
				{k: "flag", v: "true"}, {k: "note", null: true}},
		},
		{
			name: "no standard headers",
			cfg:  Config{StandardHeaders: []string{}},
		},
		{
			name: "envelope: payload as a JSON string, members in order and typed",
			cfg: Config{StandardHeaders: []string{"id"}, Fields: fields(t, "type:envelope:eventType", "n:envelope",
				"ok:envelope", "gone:envelope", "f:envelope", "nan:envelope", "big:envelope")},
			cols: []decode.Column{col("type", "Order\"Created\n\x01", 25), col("n", "-12", decode.OIDInt4), col("ok", "f", decode.OIDBool),
				nullCol("gone", 25), col("f", "1.5", decode.OIDFloat8), col("nan", "NaN", decode.OIDFloat8), col("big", "12.30", 1700)},
			wantValue: ptr(`{"payload":"{\"total\":10}","eventType":"Order\"Created\n\u0001","n":-12,"ok":false,"gone":null,"f":1.5,"nan":"NaN","big":"12.30"}`),
			wantHdrs:  []hv{{k: "id", v: "0b6f1c2e-0000-4000-8000-000000000001"}},
		},
		{
			name:      "envelope keeps non-ASCII and slashes as they are",
			cfg:       Config{StandardHeaders: []string{}, Fields: fields(t, "type:envelope")},
			cols:      []decode.Column{col("type", "a/é\u2028<b>", 25)},
			payload:   &decode.Value{Bytes: []byte(`"x\y"`)},
			wantValue: ptr(`{"payload":"\"x\\y\"","type":"a/é` + "\u2028" + `<b>"}`),
		},
		{
			// Jackson's UTF8JsonGenerator (JsonConverter) escapes each half of
			// a character outside the BMP; BMP characters stay raw UTF-8.
			name:      "envelope escapes characters outside the BMP as surrogate pairs, as JsonConverter does",
			cfg:       Config{StandardHeaders: []string{}, Fields: fields(t, "type:envelope")},
			cols:      []decode.Column{col("type", "go 🚀!é", 25)},
			payload:   &decode.Value{Bytes: []byte("{\"r\": \"🚀𐍈\"}")},
			wantValue: ptr(`{"payload":"{\"r\": \"\uD83D\uDE80\uD800\uDF48\"}","type":"go \uD83D\uDE80!é"}`),
		},
		{
			name:      "envelope with a bytea payload: base64",
			cfg:       Config{StandardHeaders: []string{}, Fields: fields(t, "type:envelope")},
			cols:      []decode.Column{col("type", "T", 25)},
			payload:   &decode.Value{Bytes: []byte{0xff, 0x00, '"'}},
			binary:    true,
			wantValue: ptr(`{"payload":"/wAi","type":"T"}`),
		},
		{
			name:      "envelope with NULL payload and no tombstone option",
			cfg:       Config{StandardHeaders: []string{}, Fields: fields(t, "type:envelope")},
			cols:      []decode.Column{col("type", "T", 25)},
			payload:   &null,
			wantValue: ptr(`{"payload":null,"type":"T"}`),
		},
		{
			name:     "tombstone on empty payload, envelope or not",
			cfg:      Config{StandardHeaders: []string{}, Fields: fields(t, "type:envelope"), TombstoneOnEmpty: true},
			cols:     []decode.Column{col("type", "T", 25)},
			payload:  &decode.Value{Bytes: []byte(" \t\n")},
			wantHdrs: nil,
		},
		{
			name:      "empty payload without the option is an empty value",
			cfg:       Config{StandardHeaders: []string{}},
			payload:   &decode.Value{Bytes: []byte{}},
			wantValue: ptr(""),
		},
		{
			name:      "tombstone option leaves a non-blank payload",
			cfg:       Config{StandardHeaders: []string{}, TombstoneOnEmpty: true},
			payload:   &decode.Value{Bytes: []byte(" {} ")},
			wantValue: ptr(" {} "),
		},
		{
			name:     "partition column",
			cfg:      Config{StandardHeaders: []string{}, Fields: fields(t, "p:partition")},
			cols:     []decode.Column{col("p", "3", decode.OIDInt4)},
			wantPart: 3,
		},
		{
			name:     "NULL partition column leaves it to the key",
			cfg:      Config{StandardHeaders: []string{}, Fields: fields(t, "p:partition")},
			cols:     []decode.Column{nullCol("p", decode.OIDInt4)},
			wantPart: -1,
		},
		{
			name:     "negative partition is dead-lettered",
			cfg:      Config{Fields: fields(t, "p:partition")},
			cols:     []decode.Column{col("p", "-1", decode.OIDInt4)},
			wantFail: `partition column "p" holds "-1"`,
		},
		{
			name:     "timestamp column without time zone is UTC",
			cfg:      Config{StandardHeaders: []string{}, TimestampColumn: "ts"},
			cols:     []decode.Column{col("ts", "2019-05-03 13:58:14.344123", decode.OIDTimestamp)},
			wantTime: time.Date(2019, 5, 3, 13, 58, 14, 344123000, time.UTC),
		},
		{
			name:     "timestamptz column with an offset",
			cfg:      Config{StandardHeaders: []string{}, TimestampColumn: "ts"},
			cols:     []decode.Column{col("ts", "2019-05-03 19:28:14.5+05:30", decode.OIDTimestamptz)},
			wantTime: time.Date(2019, 5, 3, 13, 58, 14, 500000000, time.UTC),
		},
		{
			name:     "NULL timestamp column falls back to the commit time",
			cfg:      Config{StandardHeaders: []string{}, TimestampColumn: "ts"},
			cols:     []decode.Column{nullCol("ts", decode.OIDTimestamptz)},
			wantTime: commitTime,
		},
		{
			name:     "unreadable timestamp is dead-lettered",
			cfg:      Config{TimestampColumn: "ts"},
			cols:     []decode.Column{col("ts", "infinity", decode.OIDTimestamptz)},
			wantFail: `outbox.timestamp_column "ts"`,
		},
		{
			name: "source headers after the others",
			cfg:  Config{StandardHeaders: []string{"id"}, SourceHeaders: []string{"lsn", "xid", "commit_time"}},
			wantHdrs: []hv{{k: "id", v: "0b6f1c2e-0000-4000-8000-000000000001"}, {k: "lsn", v: "0/16B3748"},
				{k: "xid", v: "584"}, {k: "commit_time", v: "2024-05-06T07:08:09.123000Z"}},
		},
		{
			name:      "column placeholders",
			cfg:       Config{TopicTemplate: "svc.{column:tenant}." + Placeholder + ".{column:type}", StandardHeaders: []string{}},
			cols:      []decode.Column{col("tenant", "acme", 25), col("type", "Created", 25)},
			wantTopic: "svc.acme.order.Created",
		},
		{
			name:     "NULL column placeholder is dead-lettered",
			cfg:      Config{TopicTemplate: "svc.{column:tenant}"},
			cols:     []decode.Column{nullCol("tenant", 25)},
			wantFail: `column "tenant" is NULL`,
		},
		{
			name: "Debezium's default regex and replacement",
			cfg: Config{TopicTemplate: Placeholder, TopicRegex: `(?<routedByValue>.*)`,
				TopicReplacement: `outbox.event.${routedByValue}`, StandardHeaders: []string{}},
			wantTopic: "outbox.event.order",
		},
		{
			name: "regex that does not match leaves the name",
			cfg: Config{TopicTemplate: Placeholder, TopicRegex: `user`,
				TopicReplacement: `users`, StandardHeaders: []string{}},
			wantTopic: "order",
		},
		{
			name: "regex groups in Java syntax",
			cfg: Config{TopicTemplate: "{column:tenant}-" + Placeholder, TopicRegex: `(\w+)-(\w+)`,
				TopicReplacement: `events.$2.$1\$`, StandardHeaders: []string{}},
			cols:     []decode.Column{col("tenant", "acme", 25)},
			wantFail: `"events.order.acme$" built from "acme-order"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, tc.cfg)
			ev := event()
			ev.Columns = tc.cols
			if tc.payload != nil {
				ev.Payload = *tc.payload
			}
			if tc.binary {
				ev.PayloadFormat = decode.PayloadBinary
			}
			rec := Record{Partition: 99, HasPartition: true}
			reason := r.RouteFrom(&ev, src, &rec)
			if tc.wantFail != "" {
				if !strings.Contains(reason, tc.wantFail) {
					t.Fatalf("reason %q, want one containing %q", reason, tc.wantFail)
				}
				return
			}
			if reason != "" {
				t.Fatalf("dead-lettered: %s", reason)
			}
			wantTopic := tc.wantTopic
			if wantTopic == "" {
				wantTopic = "outbox.event.order"
			}
			if rec.Topic != wantTopic || string(rec.Key) != "42" {
				t.Errorf("topic %q key %q, want %q and 42", rec.Topic, rec.Key, wantTopic)
			}
			wantValue := tc.wantValue
			if wantValue == nil && !strings.Contains(tc.name, "tombstone on") {
				wantValue = ptr(string(ev.Payload.Bytes))
			}
			switch {
			case wantValue == nil && rec.Value != nil:
				t.Errorf("value %q, want a tombstone", rec.Value)
			case wantValue != nil && (rec.Value == nil || string(rec.Value) != *wantValue):
				t.Errorf("value\n%q (nil %v), want\n%q", rec.Value, rec.Value == nil, *wantValue)
			}
			if tc.wantHdrs != nil || tc.cfg.StandardHeaders != nil {
				var got []hv
				for _, h := range rec.Headers {
					got = append(got, hv{k: h.Key, v: string(h.Value), null: h.Value == nil})
				}
				if !slices.Equal(got, tc.wantHdrs) {
					t.Errorf("headers %+v, want %+v", got, tc.wantHdrs)
				}
			}
			part := int32(-1)
			if rec.HasPartition {
				part = rec.Partition
			}
			if tc.wantPart == 0 && !slices.ContainsFunc(tc.cfg.Fields, func(f Field) bool { return f.Placement == PlacePartition }) {
				tc.wantPart = -1
			}
			if part != tc.wantPart {
				t.Errorf("partition %d, want %d", part, tc.wantPart)
			}
			wantTime := tc.wantTime
			if wantTime.IsZero() {
				wantTime = commitTime
			}
			if !rec.Timestamp.Equal(wantTime) {
				t.Errorf("timestamp %v, want %v", rec.Timestamp, wantTime)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// A regex rewrite that yields an illegal name dead-letters the row; the
// test above expects that for the '$', here a legal one goes through.
func TestRouteFromRegexGroups(t *testing.T) {
	r := mustNew(t, Config{TopicTemplate: "{column:tenant}-" + Placeholder, TopicRegex: `(\w+)-(?<agg>\w+)`,
		TopicReplacement: `events.${agg}.$1`})
	ev := event()
	ev.Columns = []decode.Column{col("tenant", "acme", 25)}
	var rec Record
	if reason := r.RouteFrom(&ev, Source{Commit: commitTime}, &rec); reason != "" || rec.Topic != "events.order.acme" {
		t.Fatalf("topic %q reason %q, want events.order.acme", rec.Topic, reason)
	}
}

func TestJavaReplacement(t *testing.T) {
	tests := []struct {
		in     string
		groups int
		want   string
		err    bool
	}{
		{in: "outbox.event.${routedByValue}", groups: 1, want: "outbox.event.${routedByValue}"},
		{in: "a$1b", groups: 1, want: "a${1}b"},
		{in: "a$12", groups: 1, want: "a${1}2"},        // Java: group 12 does not exist, so $1 then "2"
		{in: "a$12", groups: 12, want: "a${12}"},       // it does now
		{in: `cost\$5\\`, groups: 0, want: `cost$$5\`}, // escapes
		{in: "$2", groups: 1, err: true},
		{in: "a$", groups: 1, err: true},
		{in: "${}", groups: 1, err: true},
		{in: `trailing\`, groups: 0, err: true},
	}
	for _, tc := range tests {
		got, err := javaReplacement(tc.in, tc.groups)
		if (err != nil) != tc.err || got != tc.want && !tc.err {
			t.Errorf("javaReplacement(%q, %d) = %q, %v; want %q, error %v", tc.in, tc.groups, got, err, tc.want, tc.err)
		}
	}
}

func TestParseField(t *testing.T) {
	tests := []struct {
		in   string
		want Field
		err  string
	}{
		{in: "type:header", want: Field{"type", PlaceHeader, "type"}},
		{in: " eventType : HEADER : type ", want: Field{"eventType", PlaceHeader, "type"}},
		{in: "type:envelope:payloadType", want: Field{"type", PlaceEnvelope, "payloadType"}},
		{in: "p:partition", want: Field{"p", PlacePartition, "p"}},
		{in: "p:partition:x", err: "takes no alias"},
		{in: "type", err: "not column:placement"},
		{in: "type:body", err: `placement "body"`},
		{in: ":header", err: "not column:placement"},
		{in: "a:header:", err: "empty alias"},
		{in: "a:header:b:c", err: "not column:placement"},
	}
	for _, tc := range tests {
		got, err := ParseField(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseField(%q) error %v, want one containing %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseField(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		case tc.err == "":
			if back, err := ParseField(got.String()); err != nil || back != got {
				t.Errorf("ParseField(%q.String()) = %+v, %v", tc.in, back, err)
			}
		}
	}
}

func TestEventRouterProblems(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the first problem; "" = none
	}{
		{name: "valid", cfg: Config{Fields: []Field{{"a", PlaceHeader, "x"}, {"a", PlaceEnvelope, "x"}, {"p", PlacePartition, "p"}},
			StandardHeaders: []string{"id"}, SourceHeaders: []string{"xid", "lsn"}}},
		{name: "envelope alias payload", cfg: Config{Fields: []Field{{"a", PlaceEnvelope, "payload"}}}, want: `envelope member "payload" appears twice`},
		{name: "header alias twice", cfg: Config{Fields: []Field{{"a", PlaceHeader, "h"}, {"b", PlaceHeader, "h"}}}, want: `header "h" appears twice`},
		{name: "two partitions", cfg: Config{Fields: []Field{{"a", PlacePartition, "a"}, {"b", PlacePartition, "b"}}}, want: "second partition"},
		{name: "unknown standard header", cfg: Config{StandardHeaders: []string{"type"}}, want: "outbox.standard_headers"},
		{name: "repeated source header", cfg: Config{SourceHeaders: []string{"lsn", "lsn"}}, want: "outbox.source_headers"},
		{name: "bad regex", cfg: Config{TopicTemplate: Placeholder, DLQTopic: defDLQ, TopicRegex: "(", TopicReplacement: "x"}, want: "kafka.topic_regex"},
		{name: "replacement group missing", cfg: Config{TopicTemplate: Placeholder, DLQTopic: defDLQ, TopicRegex: "(a)", TopicReplacement: "$2"}, want: "group 2"},
		{name: "column placeholder", cfg: Config{TopicTemplate: "t.{column:x}", DLQTopic: defDLQ}},
		{name: "empty column placeholder", cfg: Config{TopicTemplate: "t.{column:}", DLQTopic: defDLQ}, want: "unknown placeholder {column:}"},
		{name: "regex lets the template hold illegal text", cfg: Config{TopicTemplate: "a b", DLQTopic: defDLQ, TopicRegex: "a b", TopicReplacement: "ab"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.TopicTemplate == "" {
				tc.cfg.TopicTemplate, tc.cfg.DLQTopic = defTemplate, defDLQ
			}
			ps := tc.cfg.Check()
			switch {
			case tc.want == "" && len(ps) > 0:
				t.Fatalf("problems %v", ps)
			case tc.want != "" && (len(ps) == 0 || !strings.Contains(ps[0].Error(), tc.want)):
				t.Fatalf("problems %v, want one containing %q", ps, tc.want)
			}
		})
	}
}

func TestColumns(t *testing.T) {
	cfg := Config{TopicTemplate: "x.{column:tenant}.{column:p}", TimestampColumn: "ts",
		Fields: []Field{{"p", PlacePartition, "p"}, {"type", PlaceHeader, "t"}, {"type", PlaceEnvelope, "t"}}}
	if got, want := cfg.Columns(), []string{"p", "type", "ts", "tenant"}; !slices.Equal(got, want) {
		t.Fatalf("Columns() = %v, want %v", got, want)
	}
}
