package decode

import (
	"strconv"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Kind says which part of a Result a decoded message filled in.
type Kind uint8

// The zero Kind is deliberately unused so that a Result nobody filled in can
// never read as "skip this message".
const (
	// KindSkip: a well-formed message outbox-cdc ignores (Update, Delete, an
	// Insert into a table other than the outbox).
	KindSkip Kind = iota + 1
	// KindBegin: Result.Begin is set.
	KindBegin
	// KindCommit: Result.Commit is set.
	KindCommit
	// KindOrigin: Result.Origin is set.
	KindOrigin
	// KindRelation: Result.Relation is set; the relation cache was updated.
	KindRelation
	// KindType: Result.Type is set.
	KindType
	// KindEvent: Result.Event is set (an Insert into the outbox table).
	KindEvent
	// KindMessage: Result.Message is set (pg_logical_emit_message output).
	KindMessage
	// KindTruncate: Result.Truncate is set.
	KindTruncate
)

// String returns a lower-case name for logs and metrics labels.
func (k Kind) String() string {
	switch k {
	case KindSkip:
		return "skip"
	case KindBegin:
		return "begin"
	case KindCommit:
		return "commit"
	case KindOrigin:
		return "origin"
	case KindRelation:
		return "relation"
	case KindType:
		return "type"
	case KindEvent:
		return "event"
	case KindMessage:
		return "message"
	case KindTruncate:
		return "truncate"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Result is one decoded message. Only the member named by Kind is meaningful;
// the others are zero. A Result and every slice in it alias the input and the
// Decoder's buffers, and are valid only until the next call to Decode: copy
// whatever must outlive it.
type Result struct {
	Kind     Kind
	Begin    Begin
	Commit   Commit
	Origin   Origin
	Relation RelationInfo
	Type     TypeInfo
	Truncate Truncate
	Message  Message
	Event    Event
}

// Begin is a Begin message: the start of a decoded transaction.
type Begin struct {
	// FinalLSN is the LSN of the transaction's commit record.
	FinalLSN   lsn.LSN
	CommitTime time.Time
	Xid        uint32
}

// Commit is a Commit message: the end of the transaction begun by the last
// Begin.
type Commit struct {
	// Flags is unused by PostgreSQL so far; kept for diagnostics.
	Flags     uint8
	CommitLSN lsn.LSN
	// EndLSN is the position just past the commit record: the position to
	// confirm once the transaction's events are durably published.
	EndLSN     lsn.LSN
	CommitTime time.Time
}

// Origin is an Origin message: the changes that follow were replayed from
// another node under replication origin Name.
type Origin struct {
	// LSN is the commit LSN on the origin server.
	LSN  lsn.LSN
	Name string
}

// RelationInfo describes a Relation message after it was cached.
type RelationInfo struct {
	ID              uint32
	Namespace, Name string
	// Outbox reports whether this is a configured outbox table, and Table
	// which one (the index of its Mapping, NewTablesDecoder).
	Outbox bool
	Table  int
	// Invalid is non-empty when the outbox table lacks a mapped column; every
	// Insert will carry the same text in Event.Invalid. Logging it here warns
	// about the problem before the first row arrives.
	Invalid string
}

// TypeInfo is a Type message, sent for columns of non-built-in types.
type TypeInfo struct {
	OID             uint32
	Namespace, Name string
}

// Truncate is a Truncate message.
type Truncate struct {
	// RelationIDs aliases a Decoder buffer.
	RelationIDs     []uint32
	Cascade         bool
	RestartIdentity bool
	// Outbox reports whether the outbox table is among the truncated ones.
	Outbox bool
}

// Message is a logical decoding message written by pg_logical_emit_message;
// pgoutput sends them only when the "messages" option is on.
type Message struct {
	Transactional bool
	LSN           lsn.LSN
	Prefix        string
	// Content aliases the input.
	Content []byte
}

// Value is one column value. NULL and the empty string are different: Null is
// true and Bytes nil for SQL NULL. A mapped column missing from the table
// yields the zero Value (and Event.Invalid explains why).
type Value struct {
	Bytes []byte
	Null  bool
}

// Header is one extra column copied into a Kafka header.
type Header struct {
	Name  string
	Value Value
}

// Column is one extra column the router places (Mapping.Columns).
type Column struct {
	Name  string
	Value Value
	// Type is the column's type OID when known (0 otherwise): the router
	// writes booleans and numbers as such.
	Type uint32
}

// Event is an Insert into the outbox table, with the mapped columns picked
// out. Text values are as PostgreSQL sent them; bytea values are already
// decoded to raw bytes.
type Event struct {
	ID, AggregateType, AggregateID, EventType Value
	// Payload is json/jsonb/text as sent, bytea decoded to raw bytes, any
	// other type in its text form. Null means a tombstone for the router.
	Payload Value
	// PayloadFormat comes from the payload column's type (or the member of
	// an emitted message that held it).
	PayloadFormat PayloadFormat
	// Headers holds one entry per Mapping.HeaderColumns, in that order.
	Headers []Header
	// Columns holds one entry per Mapping.Columns, in that order.
	Columns []Column
	// Invalid is non-empty when the row can never be published because the
	// table lacks a mapped column; route the row to the dead-letter topic.
	// NULL values are not Invalid: the router decides what they mean.
	Invalid    string
	RelationID uint32
	// Table is the index of the outbox table's Mapping (NewTablesDecoder;
	// 0 with one table, and for emitted messages).
	Table int
}
