package decode

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// mustDecode decodes msgs in order and returns the last result.
func mustDecode(t *testing.T, d *Decoder, msgs ...pgwire.Wire) *Result {
	t.Helper()
	var res *Result
	for i, m := range msgs {
		var err error
		res, err = d.Decode(m)
		if err != nil {
			t.Fatalf("message %d (%q): %v", i, m[0], err)
		}
		if res == nil {
			t.Fatalf("message %d: nil result without error", i)
		}
	}
	return res
}

func primed(t *testing.T) *Decoder {
	t.Helper()
	d := NewDecoder(testMapping())
	mustDecode(t, d, outboxRelation())
	return d
}

func val(s string) Value { return Value{Bytes: []byte(s)} }

var nullValue = Value{Null: true}

func eqValue(a, b Value) bool { return a.Null == b.Null && bytes.Equal(a.Bytes, b.Bytes) }

func checkValue(t *testing.T, field string, got, want Value) {
	t.Helper()
	if !eqValue(got, want) {
		t.Errorf("%s = {%q null=%v}, want {%q null=%v}", field, got.Bytes, got.Null, want.Bytes, want.Null)
	}
	// An empty string must still be distinguishable from NULL by Null alone,
	// and a NULL must carry no bytes.
	if got.Null && got.Bytes != nil {
		t.Errorf("%s: NULL with bytes %q", field, got.Bytes)
	}
}

func TestBeginCommit(t *testing.T) {
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	before2000 := time.Date(1999, 12, 31, 23, 59, 59, 500000000, time.UTC)
	d := NewDecoder(testMapping())

	tests := []struct {
		name string
		in   pgwire.Wire
		want Result
	}{
		{"begin", pgwire.Begin(0x16_B374D848, at, 0xFFFF_FFFE), Result{Kind: KindBegin,
			Begin: Begin{FinalLSN: 0x16_B374D848, CommitTime: at, Xid: 0xFFFF_FFFE}}},
		{"begin before 2000", pgwire.Begin(1, before2000, 7), Result{Kind: KindBegin,
			Begin: Begin{FinalLSN: 1, CommitTime: before2000, Xid: 7}}},
		{"begin at epoch", pgwire.Begin(0, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), 0), Result{Kind: KindBegin,
			Begin: Begin{CommitTime: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}}},
		{"commit", pgwire.Commit(0x16_B374D848, 0x16_B374D878, at), Result{Kind: KindCommit,
			Commit: Commit{CommitLSN: 0x16_B374D848, EndLSN: 0x16_B374D878, CommitTime: at}}},
		{"commit max LSN", pgwire.Commit(^uint64(0), ^uint64(0), at), Result{Kind: KindCommit,
			Commit: Commit{CommitLSN: lsn.LSN(^uint64(0)), EndLSN: lsn.LSN(^uint64(0)), CommitTime: at}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := mustDecode(t, d, tc.in)
			if res.Kind != tc.want.Kind || res.Begin.FinalLSN != tc.want.Begin.FinalLSN ||
				!res.Begin.CommitTime.Equal(tc.want.Begin.CommitTime) || res.Begin.Xid != tc.want.Begin.Xid ||
				res.Commit.CommitLSN != tc.want.Commit.CommitLSN || res.Commit.EndLSN != tc.want.Commit.EndLSN ||
				!res.Commit.CommitTime.Equal(tc.want.Commit.CommitTime) {
				t.Fatalf("got %+v\nwant %+v", *res, tc.want)
			}
			for _, ct := range []time.Time{res.Begin.CommitTime, res.Commit.CommitTime} {
				if !ct.IsZero() && ct.Location() != time.UTC {
					t.Errorf("time %v not in UTC", ct)
				}
			}
		})
	}
	if got := mustDecode(t, d, pgwire.Begin(0x16_B374D848, at, 1)).Begin.FinalLSN.String(); got != "16/B374D848" {
		t.Errorf("FinalLSN prints %s", got)
	}
}

func TestOriginTypeMessageTruncate(t *testing.T) {
	d := primed(t)
	mustDecode(t, d, pgwire.Relation(otherID, "public", "orders", pgwire.Col{Name: "id", OID: pgwire.OIDInt8}))

	res := mustDecode(t, d, pgwire.Msg('O').U64(0x1_00000010).Str("node_a"))
	if res.Kind != KindOrigin || res.Origin.LSN != 0x1_00000010 || res.Origin.Name != "node_a" {
		t.Errorf("origin: %+v", res.Origin)
	}

	res = mustDecode(t, d, pgwire.Msg('Y').U32(16500).Str("public").Str("mood"))
	if res.Kind != KindType || res.Type != (TypeInfo{OID: 16500, Namespace: "public", Name: "mood"}) {
		t.Errorf("type: %+v", res.Type)
	}

	res = mustDecode(t, d, pgwire.Msg('M').U8(1).U64(0x2_0000_0001).Str("outbox-cdc").I32(5).Lit("hello"))
	if res.Kind != KindMessage || !res.Message.Transactional || res.Message.LSN != 0x2_0000_0001 ||
		res.Message.Prefix != "outbox-cdc" || string(res.Message.Content) != "hello" {
		t.Errorf("message: %+v", res.Message)
	}
	res = mustDecode(t, d, pgwire.Msg('M').U8(0).U64(3).Str("").I32(0))
	if res.Kind != KindMessage || res.Message.Transactional || res.Message.Prefix != "" || len(res.Message.Content) != 0 {
		t.Errorf("empty message: %+v", res.Message)
	}

	res = mustDecode(t, d, pgwire.Msg('T').I32(2).U8(3).U32(otherID).U32(outboxID))
	if res.Kind != KindTruncate || !res.Truncate.Cascade || !res.Truncate.RestartIdentity || !res.Truncate.Outbox ||
		len(res.Truncate.RelationIDs) != 2 || res.Truncate.RelationIDs[0] != otherID || res.Truncate.RelationIDs[1] != outboxID {
		t.Errorf("truncate: %+v", res.Truncate)
	}
	res = mustDecode(t, d, pgwire.Msg('T').I32(1).U8(0).U32(otherID))
	if res.Truncate.Outbox || res.Truncate.Cascade || res.Truncate.RestartIdentity || len(res.Truncate.RelationIDs) != 1 {
		t.Errorf("truncate other: %+v", res.Truncate)
	}
}

func TestRelationResult(t *testing.T) {
	d := NewDecoder(testMapping())
	res := mustDecode(t, d, outboxRelation())
	if res.Kind != KindRelation || res.Relation != (RelationInfo{ID: outboxID, Namespace: "public", Name: "outbox", Outbox: true}) {
		t.Errorf("outbox relation: %+v", res.Relation)
	}
	res = mustDecode(t, d, pgwire.Relation(otherID, "public", "orders", pgwire.Col{Name: "id", OID: pgwire.OIDInt8}))
	if res.Relation.Outbox || res.Relation.Name != "orders" {
		t.Errorf("other relation: %+v", res.Relation)
	}
	// Same table name in another schema is not the outbox.
	res = mustDecode(t, d, pgwire.Relation(otherID+1, "audit", "outbox", outboxCols()...))
	if res.Relation.Outbox {
		t.Errorf("audit.outbox treated as the outbox")
	}
	res = mustDecode(t, d, pgwire.Relation(outboxID+5, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}))
	if !res.Relation.Outbox || !strings.Contains(res.Relation.Invalid, `"payload"`) {
		t.Errorf("relation lacking columns: %+v", res.Relation)
	}
}

func TestInsertEvent(t *testing.T) {
	const uuid = "0b8e2a52-3c1f-4f0e-9d59-5b7f3f0f6a11"
	utf8Payload := `{"name":"Zoë","city":"東京","emoji":"🚀"}`
	tests := []struct {
		name    string
		rel     pgwire.Wire
		ins     pgwire.Wire
		want    Event
		invalid string
	}{
		{
			name: "all fields",
			rel:  outboxRelation(),
			ins: pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("order"), pgwire.Txt("42"), pgwire.Txt("OrderCreated"),
				pgwire.Txt(`{"total":10}`), pgwire.Txt("trace-1"), pgwire.Txt("acme"), pgwire.Txt("2024-05-06 07:08:09+00")),
			want: Event{ID: val(uuid), AggregateType: val("order"), AggregateID: val("42"),
				EventType: val("OrderCreated"), Payload: val(`{"total":10}`),
				Headers: []Header{{"trace_id", val("trace-1")}, {"tenant", val("acme")}}},
		},
		{
			name: "null versus empty",
			rel:  outboxRelation(),
			ins:  pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt(""), pgwire.Null(), pgwire.Txt(""), pgwire.Null(), pgwire.Null(), pgwire.Txt(""), pgwire.Null()),
			want: Event{ID: val(uuid), AggregateType: val(""), AggregateID: nullValue,
				EventType: val(""), Payload: nullValue,
				Headers: []Header{{"trace_id", nullValue}, {"tenant", val("")}}},
		},
		{
			name: "multi-byte UTF-8",
			rel:  outboxRelation(),
			ins: pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("Bestellung"), pgwire.Txt("Ärger-1"), pgwire.Txt("日本"),
				pgwire.Txt(utf8Payload), pgwire.Txt("🚀"), pgwire.Txt("ü"), pgwire.Null()),
			want: Event{ID: val(uuid), AggregateType: val("Bestellung"), AggregateID: val("Ärger-1"),
				EventType: val("日本"), Payload: val(utf8Payload),
				Headers: []Header{{"trace_id", val("🚀")}, {"tenant", val("ü")}}},
		},
		{
			name: "bytea hex",
			rel: pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
				pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: OIDBytea},
				pgwire.Col{Name: "trace_id", OID: OIDBytea}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText}),
			ins: pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(`\x00ff10deadBEEF`), pgwire.Txt(`\x`), pgwire.Txt("x")),
			want: Event{ID: val(uuid), AggregateType: val("a"), AggregateID: val("1"), EventType: val("E"),
				Payload: Value{Bytes: []byte{0x00, 0xff, 0x10, 0xde, 0xad, 0xbe, 0xef}},
				Headers: []Header{{"trace_id", val("")}, {"tenant", val("x")}}},
		},
		{
			name: "bytea escape format",
			rel: pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
				pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: OIDBytea},
				pgwire.Col{Name: "trace_id", OID: OIDBytea}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText}),
			ins: pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(`ab\\c\000\377\012`), pgwire.Null(), pgwire.Txt("x")),
			want: Event{ID: val(uuid), AggregateType: val("a"), AggregateID: val("1"), EventType: val("E"),
				Payload: Value{Bytes: []byte{'a', 'b', '\\', 'c', 0, 0xff, '\n'}},
				Headers: []Header{{"trace_id", nullValue}, {"tenant", val("x")}}},
		},
		{
			name: "bytea text that is not a mapped column stays text",
			rel: pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "blob", OID: OIDBytea}, pgwire.Col{Name: "id", OID: pgwire.OIDUUID},
				pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText}, pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText},
				pgwire.Col{Name: "payload", OID: pgwire.OIDJSON}, pgwire.Col{Name: "trace_id", OID: pgwire.OIDText}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText}),
			ins: pgwire.Insert(outboxID, pgwire.Txt(`\xzz`), pgwire.Txt(uuid), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(`{}`), pgwire.Txt("t"), pgwire.Txt("x")),
			want: Event{ID: val(uuid), AggregateType: val("a"), AggregateID: val("1"), EventType: val("E"),
				Payload: val(`{}`), Headers: []Header{{"trace_id", val("t")}, {"tenant", val("x")}}},
		},
		{
			name: "payload column missing",
			rel: pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
				pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "trace_id", OID: pgwire.OIDText}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText}),
			ins: pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("t"), pgwire.Txt("x")),
			want: Event{ID: val(uuid), AggregateType: val("a"), AggregateID: val("1"), EventType: val("E"),
				Headers: []Header{{"trace_id", val("t")}, {"tenant", val("x")}}},
			invalid: `column "payload" missing from table public.outbox`,
		},
		{
			name: "header column missing",
			rel: pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
				pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: pgwire.OIDJSONB}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText}),
			ins: pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("x")),
			want: Event{ID: val(uuid), AggregateType: val("a"), AggregateID: val("1"), EventType: val("E"),
				Payload: val("{}"), Headers: []Header{{"trace_id", Value{}}, {"tenant", val("x")}}},
			invalid: `column "trace_id" missing from table public.outbox`,
		},
		{
			name: "several columns missing",
			rel:  pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "payload", OID: pgwire.OIDJSONB}),
			ins:  pgwire.Insert(outboxID, pgwire.Txt(uuid), pgwire.Txt("{}")),
			want: Event{ID: val(uuid), Payload: val("{}"),
				Headers: []Header{{"trace_id", Value{}}, {"tenant", Value{}}}},
			invalid: `columns "aggregate_type", "aggregate_id", "event_type", "trace_id", "tenant" missing from table public.outbox`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(testMapping())
			res := mustDecode(t, d, tc.rel, tc.ins)
			if res.Kind != KindEvent {
				t.Fatalf("kind %v, want event", res.Kind)
			}
			ev := res.Event
			checkValue(t, "ID", ev.ID, tc.want.ID)
			checkValue(t, "AggregateType", ev.AggregateType, tc.want.AggregateType)
			checkValue(t, "AggregateID", ev.AggregateID, tc.want.AggregateID)
			checkValue(t, "EventType", ev.EventType, tc.want.EventType)
			checkValue(t, "Payload", ev.Payload, tc.want.Payload)
			if len(ev.Headers) != len(tc.want.Headers) {
				t.Fatalf("%d headers, want %d", len(ev.Headers), len(tc.want.Headers))
			}
			for i, h := range ev.Headers {
				if h.Name != tc.want.Headers[i].Name {
					t.Errorf("header %d name %q, want %q", i, h.Name, tc.want.Headers[i].Name)
				}
				checkValue(t, "header "+h.Name, h.Value, tc.want.Headers[i].Value)
			}
			if ev.Invalid != tc.invalid {
				t.Errorf("Invalid = %q, want %q", ev.Invalid, tc.invalid)
			}
			if ev.RelationID != outboxID {
				t.Errorf("RelationID = %d", ev.RelationID)
			}
		})
	}
}

func TestInsertAliasesInput(t *testing.T) {
	d := primed(t)
	in := pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null())
	res := mustDecode(t, d, in)
	p := res.Event.Payload.Bytes
	if &p[0] != &in[bytes.Index(in, []byte("{}"))] {
		t.Errorf("payload was copied, want it to alias the input")
	}
	// Capacity is clipped so that an append by the caller cannot scribble
	// over the next column in the input.
	if cap(p) != len(p) {
		t.Errorf("payload cap %d > len %d", cap(p), len(p))
	}
}

func TestNoHeaderColumns(t *testing.T) {
	m := testMapping()
	m.HeaderColumns = nil
	d := NewDecoder(m)
	res := mustDecode(t, d, outboxRelation(),
		pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null()))
	if res.Kind != KindEvent || res.Event.Headers != nil || res.Event.Invalid != "" {
		t.Errorf("got %+v", res.Event)
	}
}

func TestMappingCopied(t *testing.T) {
	m := testMapping()
	d := NewDecoder(m)
	m.HeaderColumns[0] = "changed"
	res := mustDecode(t, d, outboxRelation(),
		pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null()))
	if res.Event.Headers[0].Name != "trace_id" || res.Event.Invalid != "" {
		t.Errorf("decoder saw the caller's later edit: %+v", res.Event)
	}
}

func TestSkips(t *testing.T) {
	d := primed(t)
	mustDecode(t, d, pgwire.Relation(otherID, "public", "orders", pgwire.Col{Name: "id", OID: pgwire.OIDInt8}, pgwire.Col{Name: "note", OID: pgwire.OIDText}))
	tests := []struct {
		name string
		in   pgwire.Wire
	}{
		{"insert into other table", pgwire.Insert(otherID, pgwire.Txt("1"), pgwire.Null())},
		{"update new only", pgwire.Tuple(pgwire.Msg('U').U32(outboxID).U8('N'), pgwire.Txt("x"), pgwire.Toast())},
		{"update with key", pgwire.Tuple(pgwire.Tuple(pgwire.Msg('U').U32(outboxID).U8('K'), pgwire.Txt("k")).U8('N'), pgwire.Txt("x"), pgwire.Txt("y"))},
		{"update with old row", pgwire.Tuple(pgwire.Tuple(pgwire.Msg('U').U32(otherID).U8('O'), pgwire.Txt("1"), pgwire.Null()).U8('N'), pgwire.Txt("1"), pgwire.Toast())},
		{"delete by key", pgwire.Tuple(pgwire.Msg('D').U32(outboxID).U8('K'), pgwire.Txt("k"), pgwire.Null())},
		{"delete old row", pgwire.Tuple(pgwire.Msg('D').U32(otherID).U8('O'), pgwire.Txt("1"), pgwire.Txt("n"))},
		// Update and Delete never consult the cache, so an unseen id is fine.
		{"delete unknown relation", pgwire.Tuple(pgwire.Msg('D').U32(999).U8('K'), pgwire.Txt("k"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if res := mustDecode(t, d, tc.in); res.Kind != KindSkip {
				t.Errorf("kind %v, want skip", res.Kind)
			}
		})
	}
}

func TestUnknownRelation(t *testing.T) {
	d := primed(t)
	res, err := d.Decode(pgwire.Insert(999, pgwire.Txt("x")))
	if !errors.Is(err, ErrUnknownRelation) || res != nil {
		t.Fatalf("got %v, %v; want ErrUnknownRelation", res, err)
	}
	if !strings.Contains(err.Error(), "999") {
		t.Errorf("error %q does not name the relation id", err)
	}
}

func TestRename(t *testing.T) {
	for _, tc := range []struct{ ns, name string }{{"public", "outbox_old"}, {"archive", "outbox"}} {
		d := primed(t)
		_, err := d.Decode(pgwire.Relation(outboxID, tc.ns, tc.name, outboxCols()...))
		if !errors.Is(err, ErrTableRenamed) {
			t.Fatalf("rename to %s.%s: got %v, want ErrTableRenamed", tc.ns, tc.name, err)
		}
		var re *RenameError
		if !errors.As(err, &re) || re.OldSchema != "public" || re.OldName != "outbox" ||
			re.NewSchema != tc.ns || re.NewName != tc.name || re.RelationID != outboxID {
			t.Fatalf("rename error %#v", re)
		}
		for _, s := range []string{"public.outbox", tc.ns + "." + tc.name} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not name %s", err, s)
			}
		}
		// The error leaves the cache alone.
		res := mustDecode(t, d, pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null()))
		if res.Kind != KindEvent {
			t.Errorf("after refused rename: kind %v", res.Kind)
		}
	}

	// A new table taking the outbox name under a new id is no rename.
	d := primed(t)
	mustDecode(t, d, pgwire.Relation(outboxID+1, "public", "outbox", outboxCols()...))
}

// TestRelationIDMatches: with the outbox OID known, rows under another name
// (the table renamed while the stream was written) are outbox rows, and a
// table taking the configured name is one too (dropped and recreated).
func TestRelationIDMatches(t *testing.T) {
	m := testMapping()
	m.RelationID = outboxID
	row := func(id uint32) []byte {
		return pgwire.Insert(id, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null())
	}
	tests := []struct {
		name     string
		id       uint32
		ns, tbl  string
		wantKind Kind
	}{
		{"renamed, same oid", outboxID, "public", "outbox_v2", KindEvent},
		{"moved schema, same oid", outboxID, "archive", "outbox", KindEvent},
		{"recreated under the name", outboxID + 7, "public", "outbox", KindEvent},
		{"other table", outboxID + 8, "public", "orders", KindSkip},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(m)
			res := mustDecode(t, d, pgwire.Relation(tc.id, tc.ns, tc.tbl, outboxCols()...))
			if res.Relation.Outbox != (tc.wantKind == KindEvent) {
				t.Errorf("Relation.Outbox = %v", res.Relation.Outbox)
			}
			if res := mustDecode(t, d, row(tc.id)); res.Kind != tc.wantKind {
				t.Errorf("insert kind %v, want %v", res.Kind, tc.wantKind)
			}
		})
	}
	// A rename seen in the stream is no error when the OID is known: the
	// pipeline's publication check decides.
	d := NewDecoder(m)
	mustDecode(t, d, outboxRelation())
	if _, err := d.Decode(pgwire.Relation(outboxID, "public", "outbox_v2", outboxCols()...)); err != nil {
		t.Fatalf("rename with known oid: %v", err)
	}
}

func TestSchemaChangeRemaps(t *testing.T) {
	d := primed(t)
	// Reordered columns plus two new ones, one of them in front.
	rel := pgwire.Relation(outboxID, "public", "outbox",
		pgwire.Col{Name: "version", OID: pgwire.OIDInt8}, pgwire.Col{Name: "payload", OID: pgwire.OIDJSON}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText},
		pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "extra", OID: pgwire.OIDText}, pgwire.Col{Name: "trace_id", OID: pgwire.OIDText},
		pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText})
	res := mustDecode(t, d, rel,
		pgwire.Insert(outboxID, pgwire.Txt("3"), pgwire.Txt(`{"v":2}`), pgwire.Txt("acme"), pgwire.Txt("E2"), pgwire.Txt("uuid-2"), pgwire.Txt("agg-2"), pgwire.Txt("zzz"), pgwire.Txt("tr-2"), pgwire.Txt("type-2")))
	ev := res.Event
	checkValue(t, "ID", ev.ID, val("uuid-2"))
	checkValue(t, "AggregateType", ev.AggregateType, val("type-2"))
	checkValue(t, "AggregateID", ev.AggregateID, val("agg-2"))
	checkValue(t, "EventType", ev.EventType, val("E2"))
	checkValue(t, "Payload", ev.Payload, val(`{"v":2}`))
	checkValue(t, "trace_id", ev.Headers[0].Value, val("tr-2"))
	checkValue(t, "tenant", ev.Headers[1].Value, val("acme"))
	if ev.Invalid != "" {
		t.Errorf("Invalid %q", ev.Invalid)
	}

	// The old 8-column layout is gone: a tuple in it no longer fits.
	if _, err := d.Decode(pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null())); err == nil {
		t.Errorf("8-column tuple accepted for a 9-column relation")
	}

	// The payload column is dropped while running, then comes back.
	res = mustDecode(t, d, pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
		pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "trace_id", OID: pgwire.OIDText}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText}),
		pgwire.Insert(outboxID, pgwire.Txt("u"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("t"), pgwire.Txt("x")))
	if res.Event.Invalid != `column "payload" missing from table public.outbox` {
		t.Errorf("after drop: Invalid %q", res.Event.Invalid)
	}
	res = mustDecode(t, d, outboxRelation(),
		pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null()))
	if res.Event.Invalid != "" || string(res.Event.Payload.Bytes) != "{}" {
		t.Errorf("after re-add: %+v", res.Event)
	}
}

// validMessages returns one well-formed message of every kind, to be decoded
// in order by a fresh decoder.
func validMessages() []pgwire.Wire {
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	byteaRel := pgwire.Relation(outboxID+1, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
		pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: OIDBytea},
		pgwire.Col{Name: "trace_id", OID: pgwire.OIDText}, pgwire.Col{Name: "tenant", OID: OIDBytea})
	return []pgwire.Wire{
		outboxRelation(),
		byteaRel,
		pgwire.Relation(otherID, "public", "orders", pgwire.Col{Name: "id", OID: pgwire.OIDInt8}, pgwire.Col{Name: "note", OID: pgwire.OIDText}),
		pgwire.Begin(0x16_B374D848, at, 771),
		pgwire.Msg('O').U64(0x1_00000010).Str("node_a"),
		pgwire.Msg('Y').U32(16500).Str("public").Str("mood"),
		pgwire.Insert(outboxID, pgwire.Txt("0b8e2a52-3c1f-4f0e-9d59-5b7f3f0f6a11"), pgwire.Txt("order"), pgwire.Txt("42"), pgwire.Txt("OrderCreated"),
			pgwire.Txt(`{"total":10,"name":"Zoë"}`), pgwire.Txt("trace-1"), pgwire.Null(), pgwire.Txt("2024-05-06 07:08:09+00")),
		pgwire.Insert(outboxID+1, pgwire.Txt("u"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(`\xdeadbeef`), pgwire.Txt(""), pgwire.Txt(`a\\b\001`)),
		pgwire.Insert(otherID, pgwire.Txt("1"), pgwire.Null()),
		pgwire.Tuple(pgwire.Tuple(pgwire.Msg('U').U32(otherID).U8('O'), pgwire.Txt("1"), pgwire.Null()).U8('N'), pgwire.Txt("1"), pgwire.Toast()),
		pgwire.Tuple(pgwire.Msg('U').U32(outboxID).U8('N'), pgwire.Txt("x")),
		pgwire.Tuple(pgwire.Msg('D').U32(otherID).U8('K'), pgwire.Txt("1")),
		pgwire.Msg('T').I32(2).U8(1).U32(otherID).U32(outboxID),
		pgwire.Msg('M').U8(1).U64(0x2_0000_0001).Str("outbox-cdc").I32(5).Lit("hello"),
		pgwire.Commit(0x16_B374D848, 0x16_B374D878, at),
	}
}

func TestValidMessagesDecode(t *testing.T) {
	d := NewDecoder(testMapping())
	for _, m := range validMessages() {
		res, err := d.Decode(m)
		if err != nil || res == nil || res.Kind == 0 {
			t.Errorf("%q: %v, %v", m[0], res, err)
		}
	}
}

// TestTruncatedPrefixes cuts every valid message at every length: each
// prefix must fail with a *FormatError, and so must a trailing extra byte.
func TestTruncatedPrefixes(t *testing.T) {
	msgs := validMessages()
	d := NewDecoder(testMapping())
	for _, m := range msgs {
		if _, err := d.Decode(m); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range msgs {
		for n := 0; n < len(m); n++ {
			res, err := d.Decode(m[:n:n])
			var fe *FormatError
			if !errors.As(err, &fe) || res != nil {
				t.Fatalf("%q cut to %d of %d bytes: got %v, %v; want *FormatError", m[0], n, len(m), res, err)
			}
			if fe.Offset < 0 || fe.Offset > n {
				t.Fatalf("%q cut to %d: offset %d outside the message", m[0], n, fe.Offset)
			}
		}
		long := append(append(pgwire.Wire{}, m...), 0)
		if _, err := d.Decode(long); err == nil {
			t.Errorf("%q with a trailing byte accepted", m[0])
		}
		// The full message still decodes: failed calls left no bad state.
		if _, err := d.Decode(m); err != nil {
			t.Errorf("%q after failures: %v", m[0], err)
		}
	}
}

func TestFormatErrors(t *testing.T) {
	rows := func(vals ...pgwire.Value) pgwire.Wire { return pgwire.Insert(outboxID, vals...) }
	ok := []pgwire.Value{pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x")}
	with := func(last pgwire.Value) pgwire.Wire { return rows(append(ok[:len(ok):len(ok)], last)...) }
	byteaRel := pgwire.Relation(outboxID+1, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
		pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: OIDBytea},
		pgwire.Col{Name: "trace_id", OID: pgwire.OIDText}, pgwire.Col{Name: "tenant", OID: pgwire.OIDText})
	byteaRow := func(payload string) pgwire.Wire {
		return pgwire.Insert(outboxID+1, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(payload), pgwire.Txt("t"), pgwire.Txt("x"))
	}
	tests := []struct {
		name   string
		in     pgwire.Wire
		msg    byte
		reason string
	}{
		{"empty", pgwire.Wire{}, 0, "message type"},
		{"unknown type", pgwire.Msg('Z'), 'Z', "unknown message type"},
		{"stream start", pgwire.Msg('S').U32(1).U8(1), 'S', "streaming"},
		{"begin prepare", pgwire.Msg('b'), 'b', "two-phase"},
		{"binary value", with(pgwire.Bin("\x00\x01")), 'I', "binary"},
		{"binary value in other table", pgwire.Insert(otherID, pgwire.Bin("1"), pgwire.Null()), 'I', "binary"},
		{"binary value in update", pgwire.Tuple(pgwire.Msg('U').U32(otherID).U8('N'), pgwire.Bin("1"), pgwire.Null()), 'U', "binary"},
		{"unchanged toast in insert", with(pgwire.Toast()), 'I', "unchanged TOAST"},
		{"unknown column kind", with(func(w pgwire.Wire) pgwire.Wire { return w.U8('x') }), 'I', "unknown column kind"},
		{"negative column length", with(func(w pgwire.Wire) pgwire.Wire { return w.U8('t').I32(-1) }), 'I', "negative column length"},
		{"huge column length", with(func(w pgwire.Wire) pgwire.Wire { return w.U8('t').I32(0x7fffffff) }), 'I', "truncated"},
		{"too few columns", rows(ok...), 'I', "tuple has 7 columns"},
		{"too many columns", rows(append(ok[:len(ok):len(ok)], pgwire.Null(), pgwire.Null())...), 'I', "tuple has 9 columns"},
		{"negative column count", pgwire.Msg('I').U32(outboxID).U8('N').I16(-1), 'I', "negative tuple column count"},
		{"insert tag", pgwire.Tuple(pgwire.Msg('I').U32(outboxID).U8('K'), pgwire.Txt("x")), 'I', "tuple tag"},
		{"update tag", pgwire.Tuple(pgwire.Msg('U').U32(outboxID).U8('X'), pgwire.Txt("x")), 'U', "tuple tag"},
		{"update second tag", pgwire.Tuple(pgwire.Tuple(pgwire.Msg('U').U32(outboxID).U8('K'), pgwire.Txt("x")).U8('K'), pgwire.Txt("x")), 'U', "tuple tag"},
		{"delete tag", pgwire.Tuple(pgwire.Msg('D').U32(outboxID).U8('N'), pgwire.Txt("x")), 'D', "tuple tag"},
		{"relation negative columns", pgwire.Msg('R').U32(1).Str("s").Str("t").U8('d').I16(-3), 'R', "negative column count"},
		{"relation column count too big", pgwire.Msg('R').U32(1).Str("s").Str("t").U8('d').I16(2).U8(0).Str("a").U32(25).I32(-1),
			'R', "does not fit"},
		{"truncate negative count", pgwire.Msg('T').I32(-1).U8(0), 'T', "relation count"},
		{"truncate count too big", pgwire.Msg('T').I32(1 << 30).U8(0).U32(1), 'T', "relation count"},
		{"message negative length", pgwire.Msg('M').U8(0).U64(1).Str("p").I32(-5), 'M', "negative content length"},
		{"message length too big", pgwire.Msg('M').U8(0).U64(1).Str("p").I32(10).Lit("abc"), 'M', "truncated"},
		{"origin name unterminated", pgwire.Msg('O').U64(1).Lit("abc"), 'O', "NUL"},
		{"bytea odd hex", byteaRow(`\xabc`), 'I', "malformed bytea"},
		{"bytea bad hex digit", byteaRow(`\xzz`), 'I', "malformed bytea"},
		{"bytea bad escape", byteaRow(`a\b`), 'I', "malformed bytea"},
		{"bytea octal out of range", byteaRow(`\400`), 'I', "malformed bytea"},
		{"bytea short octal", byteaRow(`\01`), 'I', "malformed bytea"},
		{"bytea lone backslash", byteaRow(`\`), 'I', "malformed bytea"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := primed(t)
			mustDecode(t, d, byteaRel, pgwire.Relation(otherID, "public", "orders", pgwire.Col{Name: "id", OID: pgwire.OIDInt8}, pgwire.Col{Name: "note", OID: pgwire.OIDText}))
			res, err := d.Decode(tc.in)
			var fe *FormatError
			if !errors.As(err, &fe) || res != nil {
				t.Fatalf("got %v, %v; want *FormatError", res, err)
			}
			if fe.Msg != tc.msg || !strings.Contains(fe.Reason, tc.reason) {
				t.Errorf("got %v (msg %q), want msg %q and reason containing %q", fe, fe.Msg, tc.msg, tc.reason)
			}
			if fe.Offset < 0 || fe.Offset > len(tc.in) {
				t.Errorf("offset %d outside the %d-byte message", fe.Offset, len(tc.in))
			}
		})
	}
}

func TestFormatErrorOffset(t *testing.T) {
	d := primed(t)
	in := pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Bin("z"))
	_, err := d.Decode(in)
	var fe *FormatError
	if !errors.As(err, &fe) {
		t.Fatal(err)
	}
	if want := len(in) - 1 - 4 - 1; fe.Offset != want || in[fe.Offset] != 'b' {
		t.Errorf("offset %d, want %d (the 'b' kind byte)", fe.Offset, want)
	}
	if !strings.Contains(fe.Error(), `'I'`) || !strings.Contains(fe.Error(), "offset") {
		t.Errorf("message %q", fe.Error())
	}
}

// A malformed Relation message must not replace the cached one.
func TestBadRelationKeepsCache(t *testing.T) {
	d := primed(t)
	bad := pgwire.Relation(outboxID, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID})
	if _, err := d.Decode(bad[:len(bad)-1]); err == nil {
		t.Fatal("truncated relation accepted")
	}
	res := mustDecode(t, d, pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null()))
	if res.Kind != KindEvent || res.Event.Invalid != "" {
		t.Errorf("cache changed by a failed Relation: %+v", res.Event)
	}
}

func TestResultReset(t *testing.T) {
	d := primed(t)
	mustDecode(t, d, pgwire.Insert(outboxID, pgwire.Txt("id"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt("{}"), pgwire.Txt("t"), pgwire.Txt("x"), pgwire.Null()))
	res := mustDecode(t, d, pgwire.Commit(1, 2, time.Unix(0, 0)))
	if res.Event.Payload.Bytes != nil || res.Event.Headers != nil || res.Event.RelationID != 0 {
		t.Errorf("stale event in a commit result: %+v", res.Event)
	}
}

func TestZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	d := primed(t)
	byteaRel := pgwire.Relation(outboxID+1, "public", "outbox", pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDText},
		pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText}, pgwire.Col{Name: "event_type", OID: pgwire.OIDText}, pgwire.Col{Name: "payload", OID: OIDBytea},
		pgwire.Col{Name: "trace_id", OID: pgwire.OIDText}, pgwire.Col{Name: "tenant", OID: OIDBytea})
	mustDecode(t, d, byteaRel, pgwire.Relation(otherID, "public", "orders", pgwire.Col{Name: "id", OID: pgwire.OIDInt8}))
	for name, m := range map[string]pgwire.Wire{
		"insert": pgwire.Insert(outboxID, pgwire.Txt("0b8e2a52-3c1f-4f0e-9d59-5b7f3f0f6a11"), pgwire.Txt("order"), pgwire.Txt("42"),
			pgwire.Txt("OrderCreated"), pgwire.Txt(`{"total":10}`), pgwire.Txt("trace"), pgwire.Null(), pgwire.Txt("2024-05-06 07:08:09+00")),
		"insert bytea": pgwire.Insert(outboxID+1, pgwire.Txt("u"), pgwire.Txt("a"), pgwire.Txt("1"), pgwire.Txt("E"), pgwire.Txt(`\xdeadbeef`), pgwire.Txt(""), pgwire.Txt(`a\\b\001`)),
		"insert other": pgwire.Insert(otherID, pgwire.Txt("1")),
		"update":       pgwire.Tuple(pgwire.Msg('U').U32(otherID).U8('N'), pgwire.Txt("1")),
		"begin":        pgwire.Begin(1, at, 2),
		"commit":       pgwire.Commit(1, 2, at),
		"message":      pgwire.Msg('M').U8(1).U64(1).Str("outbox-cdc").I32(2).Lit("hi"),
		"origin":       pgwire.Msg('O').U64(1).Str("node_a"),
		"truncate":     pgwire.Msg('T').I32(2).U8(0).U32(otherID).U32(outboxID),
	} {
		if _, err := d.Decode(m); err != nil { // warm the buffers and interned strings
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = d.Decode(m) }); n != 0 {
			t.Errorf("%s: %v allocs per Decode, want 0", name, n)
		}
	}
}

func TestKindString(t *testing.T) {
	if KindEvent.String() != "event" || KindSkip.String() != "skip" || Kind(0).String() != "Kind(0)" {
		t.Errorf("%s %s %s", KindEvent, KindSkip, Kind(0))
	}
}

func TestMappingValidate(t *testing.T) {
	if err := testMapping().Validate(); err != nil {
		t.Errorf("valid mapping: %v", err)
	}
	m := testMapping()
	m.Payload = ""
	m.HeaderColumns = append(m.HeaderColumns, "")
	err := m.Validate()
	if err == nil || !strings.Contains(err.Error(), "payload") || !strings.Contains(err.Error(), "header column 2") {
		t.Errorf("got %v", err)
	}
}
