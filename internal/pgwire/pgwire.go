// Package pgwire builds pgoutput messages for tests: big-endian integers and
// NUL-terminated strings, as in PG docs 55.6 ("Logical Replication Message
// Formats"). The decoder's tests and the pipeline's tests share it, so both
// feed the same bytes a walsender would send.
package pgwire

import (
	"encoding/binary"
	"time"
)

// Wire is a message under construction; every method appends and returns it.
type Wire []byte

// Msg starts a message of type t ('B', 'I', 'R', ...).
func Msg(t byte) Wire { return Wire{t} }

func (w Wire) U8(v byte) Wire       { return append(w, v) }
func (w Wire) I16(v int16) Wire     { return binary.BigEndian.AppendUint16(w, uint16(v)) }
func (w Wire) U32(v uint32) Wire    { return binary.BigEndian.AppendUint32(w, v) }
func (w Wire) I32(v int32) Wire     { return w.U32(uint32(v)) }
func (w Wire) U64(v uint64) Wire    { return binary.BigEndian.AppendUint64(w, v) }
func (w Wire) Str(s string) Wire    { return append(append(w, s...), 0) }
func (w Wire) Raw(b ...byte) Wire   { return append(w, b...) }
func (w Wire) Lit(s string) Wire    { return append(w, s...) }
func (w Wire) TS(t time.Time) Wire  { return w.U64(uint64(PGMicros(t))) }
func (w Wire) Text(s string) Wire   { return w.U8('t').I32(int32(len(s))).Raw([]byte(s)...) }
func (w Wire) Null() Wire           { return w.U8('n') }
func (w Wire) Toast() Wire          { return w.U8('u') }
func (w Wire) Binary(s string) Wire { return w.U8('b').I32(int32(len(s))).Raw([]byte(s)...) }

// PGMicros is t as microseconds since 2000-01-01 UTC, PostgreSQL's epoch;
// computed independently of the decoder's conversion.
func PGMicros(t time.Time) int64 {
	return t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
}

// Col is one column of a Relation message.
type Col struct {
	Name string
	OID  uint32
}

// Type OIDs (pg_type.dat).
const (
	OIDBytea       = 17
	OIDInt8        = 20
	OIDText        = 25
	OIDJSON        = 114
	OIDVarchar     = 1043
	OIDTimestamptz = 1184
	OIDUUID        = 2950
	OIDJSONB       = 3802
)

// Relation is a Relation message; its first column is flagged as the key.
func Relation(id uint32, ns, name string, cols ...Col) Wire {
	w := Msg('R').U32(id).Str(ns).Str(name).U8('d').I16(int16(len(cols)))
	for i, c := range cols {
		flags := byte(0)
		if i == 0 {
			flags = 1
		}
		w = w.U8(flags).Str(c.Name).U32(c.OID).I32(-1)
	}
	return w
}

// Value is one TupleData column: appended by a function so that tests can
// mix kinds.
type Value func(Wire) Wire

func Txt(s string) Value { return func(w Wire) Wire { return w.Text(s) } }
func Null() Value        { return func(w Wire) Wire { return w.Null() } }
func Toast() Value       { return func(w Wire) Wire { return w.Toast() } }
func Bin(s string) Value { return func(w Wire) Wire { return w.Binary(s) } }

// Tuple appends TupleData: the column count, then each value.
func Tuple(w Wire, vals ...Value) Wire {
	w = w.I16(int16(len(vals)))
	for _, v := range vals {
		w = v(w)
	}
	return w
}

// Insert is an Insert message of a new tuple into relation id.
func Insert(id uint32, vals ...Value) Wire { return Tuple(Msg('I').U32(id).U8('N'), vals...) }

// Begin is a Begin message of transaction xid committing at final.
func Begin(final uint64, at time.Time, xid uint32) Wire {
	return Msg('B').U64(final).TS(at).U32(xid)
}

// Commit is a Commit message.
func Commit(commitLSN, endLSN uint64, at time.Time) Wire {
	return Msg('C').U8(0).U64(commitLSN).U64(endLSN).TS(at)
}

// Message is a logical decoding message (pg_logical_emit_message) at pos.
func Message(transactional bool, pos uint64, prefix string, content []byte) Wire {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	return Msg('M').U8(flags).U64(pos).Str(prefix).U32(uint32(len(content))).Raw(content...)
}
