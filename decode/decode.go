// Package decode turns pgoutput messages (logical replication protocol
// version 1, PG docs 55.9 "Logical Replication Message Formats") into the
// transaction markers and outbox events the rest of outbox-cdc works with.
//
// A Decoder is stateful: it caches the Relation messages of the stream, which
// later Insert messages refer to by id. Feed it every message of one
// replication stream, in order, from one goroutine. Keep the same Decoder
// across reconnects: PostgreSQL re-sends Relation messages in each session, and
// comparing them with the cached ones is how an outbox table renamed while
// outbox-cdc was down gets noticed.
//
// Decoding an Insert into the outbox table allocates nothing in steady state:
// results alias the input and buffers owned by the Decoder.
package decode

import (
	"errors"
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Mapping names the outbox table and the columns an Event is built from.
// Names are compared exactly with the catalog spelling, so an unquoted SQL
// identifier must be given in lower case.
type Mapping struct {
	// Schema and Table name the outbox table, e.g. "public", "outbox".
	Schema, Table string
	// Column names of the event fields.
	ID, AggregateType, AggregateID, EventType, Payload string
	// HeaderColumns are extra columns copied to Event.Headers, in order.
	HeaderColumns []string
	// Columns are further columns delivered in Event.Columns, in order, for
	// the router to place (outbox.fields, a timestamp column, topic
	// placeholders); unlike HeaderColumns they are not headers by themselves.
	Columns []string
	// RelationID, when set, is the outbox table's OID as resolved at start
	// (the partitioned root's for a partitioned outbox). Its rows are outbox
	// rows under whatever name the WAL carries, so rows written while the
	// table was renamed are still published when the stream is read again
	// after the rename was undone. Zero matches by name only.
	RelationID uint32
}

// Validate reports configuration mistakes that would make every row Invalid.
// NewDecoder does not call it, so configuration code can report it in context.
func (m Mapping) Validate() error {
	var errs []error
	req := func(what, v string) {
		if v == "" {
			errs = append(errs, fmt.Errorf("outbox mapping: %s is empty", what))
		}
	}
	req("schema", m.Schema)
	req("table", m.Table)
	req("id column", m.ID)
	req("aggregate type column", m.AggregateType)
	req("aggregate id column", m.AggregateID)
	req("event type column", m.EventType)
	req("payload column", m.Payload)
	for i, h := range m.HeaderColumns {
		req(fmt.Sprintf("header column %d", i), h)
	}
	for i, c := range m.Columns {
		req(fmt.Sprintf("column %d", i), c)
	}
	return errors.Join(errs...)
}

// Decoder decodes the pgoutput messages of one replication stream. It is not
// safe for concurrent use.
type Decoder struct {
	tables []table // one per outbox table, in the order given
	rels   map[uint32]*relation

	// Buffers reused by every call; Result slices alias them.
	res      Result
	vals     []Value // one per tuple column of the current Insert
	bytea    []byte  // decoded bytea values of the current Insert
	truncIDs []uint32

	// strs interns the few distinct strings that recur in Message, Origin and
	// Type messages so that decoding them does not allocate each time.
	strs map[string]string
}

// table is one outbox table's mapping and the buffers its Events alias.
type table struct {
	m       Mapping
	headers []Header // one per Mapping.HeaderColumns
	columns []Column // one per Mapping.Columns
}

// NewDecoder returns a Decoder that builds Events from Inserts into the table
// m names. m is copied.
func NewDecoder(m Mapping) *Decoder { return NewTablesDecoder([]Mapping{m}) }

// NewTablesDecoder returns a Decoder that builds Events from Inserts into
// any of the tables ms name, each with its own mapping; an Event's Table is
// the index of its table's mapping in ms. The mappings are copied.
func NewTablesDecoder(ms []Mapping) *Decoder {
	d := &Decoder{rels: make(map[uint32]*relation), strs: make(map[string]string)}
	for _, m := range ms {
		m.HeaderColumns = append([]string(nil), m.HeaderColumns...)
		m.Columns = append([]string(nil), m.Columns...)
		t := table{m: m, headers: make([]Header, len(m.HeaderColumns)), columns: make([]Column, len(m.Columns))}
		for i, h := range m.HeaderColumns {
			t.headers[i].Name = h
		}
		d.tables = append(d.tables, t)
	}
	return d
}

// match is the index of the outbox table a relation is, -1 for none.
func (d *Decoder) match(id uint32, ns, name []byte) int {
	for i := range d.tables {
		m := &d.tables[i].m
		if (m.RelationID != 0 && id == m.RelationID) || (string(ns) == m.Schema && string(name) == m.Table) {
			return i
		}
	}
	return -1
}

// Decode decodes one pgoutput message: the WAL data of one XLogData message,
// starting with the message type byte. The Result (and every slice in it)
// aliases data and the Decoder's internal buffers and is valid until the next
// call to Decode.
//
// Errors are a *FormatError for malformed input, ErrUnknownRelation (wrapped)
// for an Insert into a relation never described, and a *RenameError
// (errors.Is ErrTableRenamed) when the outbox table was renamed. On error the
// Result is nil and the relation cache is unchanged.
func (d *Decoder) Decode(data []byte) (*Result, error) {
	r := newReader(data)
	t := r.u8("message type")
	if !r.ok() {
		return nil, r.error()
	}
	res := &d.res
	*res = Result{}
	var err error
	switch t {
	case 'B':
		d.begin(&r, res)
	case 'C':
		d.commit(&r, res)
	case 'O':
		d.origin(&r, res)
	case 'R':
		err = d.relation(&r, res)
	case 'Y':
		d.typ(&r, res)
	case 'I':
		err = d.insert(&r, res)
	case 'U':
		d.update(&r, res)
	case 'D':
		d.delete(&r, res)
	case 'T':
		d.truncate(&r, res)
	case 'M':
		d.message(&r, res)
	case 'S', 'E', 'c', 'A':
		// PG docs 55.9: Stream Start/Stop/Commit/Abort exist only with
		// protocol version 2 and streaming=on, which outbox-cdc never asks for.
		r.off = 0
		r.failf("streaming message %q, but streaming was not requested", t)
	case 'b', 'P', 'K', 'r', 'p':
		// Two-phase commit messages need protocol version 3 and two_phase=on.
		r.off = 0
		r.failf("two-phase message %q, but two_phase was not requested", t)
	default:
		r.off = 0
		r.failf("unknown message type %q", t)
	}
	if err != nil {
		return nil, err
	}
	if !r.ok() {
		return nil, r.error()
	}
	return res, nil
}

// pgEpochUnix is 2000-01-01 00:00:00 UTC in Unix seconds: PostgreSQL counts
// timestamps in microseconds from there (PG docs 55.9, Begin).
const pgEpochUnix = 946684800

// pgTime converts a TimestampTz (µs since the PostgreSQL epoch) to time.Time,
// splitting seconds first so that no input can overflow.
func pgTime(us int64) time.Time {
	sec, rem := us/1e6, us%1e6
	if rem < 0 {
		sec--
		rem += 1e6
	}
	return time.Unix(sec+pgEpochUnix, rem*1e3).UTC()
}

// begin decodes Begin (PG docs 55.9): Int64 final LSN, Int64 commit
// timestamp, Int32 xid.
func (d *Decoder) begin(r *reader, res *Result) {
	final := r.u64("final LSN")
	ts := r.u64("commit timestamp")
	xid := r.u32("xid")
	r.end()
	res.Kind = KindBegin
	res.Begin = Begin{FinalLSN: lsn.LSN(final), CommitTime: pgTime(int64(ts)), Xid: xid}
}

// commit decodes Commit (PG docs 55.9): Int8 flags, Int64 commit LSN, Int64
// end LSN, Int64 commit timestamp.
func (d *Decoder) commit(r *reader, res *Result) {
	flags := r.u8("flags")
	commitLSN := r.u64("commit LSN")
	endLSN := r.u64("end LSN")
	ts := r.u64("commit timestamp")
	r.end()
	res.Kind = KindCommit
	res.Commit = Commit{
		Flags:      flags,
		CommitLSN:  lsn.LSN(commitLSN),
		EndLSN:     lsn.LSN(endLSN),
		CommitTime: pgTime(int64(ts)),
	}
}

// origin decodes Origin (PG docs 55.9): Int64 origin commit LSN, String name.
func (d *Decoder) origin(r *reader, res *Result) {
	at := r.u64("origin LSN")
	name := r.cstring("origin name")
	r.end()
	if !r.ok() {
		return
	}
	res.Kind = KindOrigin
	res.Origin = Origin{LSN: lsn.LSN(at), Name: d.intern(name)}
}

// typ decodes Type (PG docs 55.9): Int32 type OID, String namespace, String
// name.
func (d *Decoder) typ(r *reader, res *Result) {
	oid := r.u32("type OID")
	ns := r.cstring("type namespace")
	name := r.cstring("type name")
	r.end()
	if !r.ok() {
		return
	}
	res.Kind = KindType
	res.Type = TypeInfo{OID: oid, Namespace: d.intern(ns), Name: d.intern(name)}
}

// truncate decodes Truncate (PG docs 55.9): Int32 relation count, Int8
// options (1 CASCADE, 2 RESTART IDENTITY), then one Int32 id per relation.
func (d *Decoder) truncate(r *reader, res *Result) {
	start := r.off
	n := int(r.i32("relation count"))
	opts := r.u8("options")
	if !r.ok() {
		return
	}
	if rem := r.remaining(); n < 0 || n > rem/4 {
		r.off = start
		r.failf("relation count %d does not fit in the %d bytes left", n, rem)
		return
	}
	ids := d.truncIDs[:0]
	outbox := false
	for range n {
		id := r.u32("relation id")
		ids = append(ids, id)
		if rel := d.rels[id]; rel != nil && rel.outbox {
			outbox = true
		}
	}
	d.truncIDs = ids
	r.end()
	res.Kind = KindTruncate
	res.Truncate = Truncate{
		RelationIDs:     ids,
		Cascade:         opts&1 != 0,
		RestartIdentity: opts&2 != 0,
		Outbox:          outbox,
	}
}

// message decodes Message (PG docs 55.9, protocol version 1 layout without
// the streamed-transaction xid): Int8 flags (1 = transactional), Int64 LSN,
// String prefix, Int32 content length, content.
func (d *Decoder) message(r *reader, res *Result) {
	flags := r.u8("flags")
	at := r.u64("message LSN")
	prefix := r.cstring("prefix")
	start := r.off
	n := r.i32("content length")
	if r.ok() && n < 0 {
		r.off = start
		r.failf("negative content length %d", n)
	}
	content := r.bytes(int(n), "content")
	r.end()
	if !r.ok() {
		return
	}
	res.Kind = KindMessage
	res.Message = Message{
		Transactional: flags&1 != 0,
		LSN:           lsn.LSN(at),
		Prefix:        d.intern(prefix),
		Content:       content,
	}
}

// Interning bounds: a stream has a handful of distinct prefixes, origins and
// type names; the caps keep a hostile or buggy stream from growing the table
// without limit (past them, strings are simply allocated).
const (
	maxInterned    = 1024
	maxInternedLen = 256
)

// intern returns b as a string, allocating only the first time it is seen.
func (d *Decoder) intern(b []byte) string {
	if s, ok := d.strs[string(b)]; ok { // the compiler does not allocate for this lookup
		return s
	}
	s := string(b)
	if len(d.strs) < maxInterned && len(s) <= maxInternedLen {
		d.strs[s] = s
	}
	return s
}
