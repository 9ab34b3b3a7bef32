package decode

import (
	"encoding/binary"
	"time"
)

// wire builds pgoutput messages for tests: big-endian integers and
// NUL-terminated strings, as in PG docs 55.6.
type wire []byte

func msg(t byte) wire               { return wire{t} }
func (w wire) u8(v byte) wire       { return append(w, v) }
func (w wire) i16(v int16) wire     { return binary.BigEndian.AppendUint16(w, uint16(v)) }
func (w wire) u32(v uint32) wire    { return binary.BigEndian.AppendUint32(w, v) }
func (w wire) i32(v int32) wire     { return w.u32(uint32(v)) }
func (w wire) u64(v uint64) wire    { return binary.BigEndian.AppendUint64(w, v) }
func (w wire) str(s string) wire    { return append(append(w, s...), 0) }
func (w wire) raw(b ...byte) wire   { return append(w, b...) }
func (w wire) lit(s string) wire    { return append(w, s...) }
func (w wire) ts(t time.Time) wire  { return w.u64(uint64(pgMicros(t))) }
func (w wire) text(s string) wire   { return w.u8('t').i32(int32(len(s))).raw([]byte(s)...) }
func (w wire) null() wire           { return w.u8('n') }
func (w wire) toast() wire          { return w.u8('u') }
func (w wire) binary(s string) wire { return w.u8('b').i32(int32(len(s))).raw([]byte(s)...) }

// pgMicros is the inverse of pgTime, computed independently of it.
func pgMicros(t time.Time) int64 {
	return t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
}

// col is one column of a test Relation message.
type col struct {
	name string
	oid  uint32
}

// Type OIDs used by the tests (pg_type.dat).
const (
	oidText        = 25
	oidVarchar     = 1043
	oidJSON        = 114
	oidJSONB       = 3802
	oidUUID        = 2950
	oidTimestamptz = 1184
	oidInt8        = 20
)

func relationMsg(id uint32, ns, name string, cols ...col) wire {
	w := msg('R').u32(id).str(ns).str(name).u8('d').i16(int16(len(cols)))
	for i, c := range cols {
		flags := byte(0)
		if i == 0 {
			flags = 1 // the first column is the key in these tests
		}
		w = w.u8(flags).str(c.name).u32(c.oid).i32(-1)
	}
	return w
}

// tv is one TupleData column: appended by a function so tests can mix kinds.
type tv func(wire) wire

func txt(s string) tv { return func(w wire) wire { return w.text(s) } }
func null() tv        { return func(w wire) wire { return w.null() } }
func toast() tv       { return func(w wire) wire { return w.toast() } }
func bin(s string) tv { return func(w wire) wire { return w.binary(s) } }
func tuple(w wire, vals ...tv) wire {
	w = w.i16(int16(len(vals)))
	for _, v := range vals {
		w = v(w)
	}
	return w
}

func insertMsg(id uint32, vals ...tv) wire { return tuple(msg('I').u32(id).u8('N'), vals...) }

func beginMsg(final uint64, at time.Time, xid uint32) wire {
	return msg('B').u64(final).ts(at).u32(xid)
}

func commitMsg(commitLSN, endLSN uint64, at time.Time) wire {
	return msg('C').u8(0).u64(commitLSN).u64(endLSN).ts(at)
}

// The outbox table used throughout the tests.
const (
	outboxID = 16390
	otherID  = 16400
)

func testMapping() Mapping {
	return Mapping{
		Schema: "public", Table: "outbox",
		ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
		EventType: "event_type", Payload: "payload",
		HeaderColumns: []string{"trace_id", "tenant"},
	}
}

func outboxCols() []col {
	return []col{
		{"id", oidUUID},
		{"aggregate_type", oidVarchar},
		{"aggregate_id", oidText},
		{"event_type", oidText},
		{"payload", oidJSONB},
		{"trace_id", oidText},
		{"tenant", oidText},
		{"created_at", oidTimestamptz},
	}
}

func outboxRelation() wire { return relationMsg(outboxID, "public", "outbox", outboxCols()...) }
