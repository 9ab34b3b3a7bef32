package decode

import (
	"fmt"
	"slices"
	"strings"
)

// Positions of the event fields in relation.idx; header columns, then the
// other extra columns (Mapping.Columns) follow.
const (
	fieldID = iota
	fieldAggregateType
	fieldAggregateID
	fieldEventType
	fieldPayload
	numFields
)

// column is one column of a Relation message.
type column struct {
	name string
	typ  uint32 // type OID
	// bytea marks a mapped bytea column: its text form is decoded to raw
	// bytes while the tuple is read.
	bytea bool
}

// relation is the cached form of one Relation message.
type relation struct {
	id              uint32
	namespace, name string
	cols            []column

	// The rest is set only for an outbox table, resolved once per Relation
	// message so that Inserts only index.
	outbox bool
	table  int // index of its mapping (Decoder.tables)
	// idx holds, for each event field (fieldID...) and then each header
	// column, its position in the tuple, or -1 when the table lacks it.
	idx []int
	// invalid names the missing mapped columns; copied into every Event.
	invalid string
	// hasBytea reports whether any mapped column is bytea, the only case
	// in which an Insert needs the Decoder's bytea buffer.
	hasBytea bool
	// payload is the format of the payload column's type.
	payload PayloadFormat
}

// relation decodes Relation (PG docs 55.9): Int32 id, String namespace, String
// name, Int8 replica identity, Int16 column count, then per column Int8 flags
// (1 = key), String name, Int32 type OID, Int32 type modifier. The message
// replaces the cached entry: PostgreSQL sends a fresh one before the first
// change after DDL (PG docs 55.5.3).
func (d *Decoder) relation(r *reader, res *Result) error {
	id := r.u32("relation id")
	ns := r.cstring("namespace")
	name := r.cstring("relation name")
	r.u8("replica identity") // not needed: Updates and Deletes are skipped
	// Smallest column: flags, empty name's NUL, type OID, type modifier.
	n := r.count16(1+1+4+4, "column count")
	if !r.ok() {
		return nil
	}
	cols := make([]column, n)
	for i := range cols {
		r.u8("column flags") // only marks key columns
		cname := r.cstring("column name")
		typ := r.u32("column type")
		r.i32("column type modifier")
		if !r.ok() {
			return nil
		}
		cols[i] = column{name: string(cname), typ: typ}
	}
	r.end()
	if !r.ok() {
		return nil
	}

	rel := &relation{
		id:        id,
		namespace: string(ns),
		name:      string(name),
		cols:      cols,
		table:     d.match(id, ns, name),
	}
	rel.outbox = rel.table >= 0
	// Without a known OID a rename can only be noticed here; with one, the
	// pipeline's publication check reports it and the rows stay outbox rows.
	if old := d.rels[id]; old != nil && old.outbox && (!rel.outbox || rel.table != old.table) {
		return &RenameError{
			RelationID: id,
			OldSchema:  old.namespace,
			OldName:    old.name,
			NewSchema:  rel.namespace,
			NewName:    rel.name,
		}
	}
	if rel.outbox {
		d.resolve(rel)
	}
	d.rels[id] = rel

	res.Kind = KindRelation
	res.Relation = RelationInfo{
		ID:        id,
		Namespace: rel.namespace,
		Name:      rel.name,
		Outbox:    rel.outbox,
		Table:     max(rel.table, 0),
		Invalid:   rel.invalid,
	}
	return nil
}

// resolve finds each mapped column in rel and precomputes the Invalid text.
func (d *Decoder) resolve(rel *relation) {
	m := &d.tables[rel.table].m
	names := make([]string, 0, numFields+len(m.HeaderColumns)+len(m.Columns))
	names = append(names, m.ID, m.AggregateType, m.AggregateID, m.EventType, m.Payload)
	names = append(names, m.HeaderColumns...)
	names = append(names, m.Columns...)

	rel.idx = make([]int, len(names))
	var missing []string
	for k, want := range names {
		rel.idx[k] = -1
		for i := range rel.cols {
			if rel.cols[i].name == want {
				rel.idx[k] = i
				if rel.cols[i].typ == OIDBytea {
					rel.cols[i].bytea = true
					rel.hasBytea = true
				}
				break
			}
		}
		if rel.idx[k] < 0 && !slices.Contains(missing, want) {
			missing = append(missing, want)
		}
	}
	if i := rel.idx[fieldPayload]; i >= 0 {
		rel.payload = PayloadFormatOf(rel.cols[i].typ)
	}
	if len(missing) > 0 {
		rel.invalid = MissingColumns(rel.namespace, rel.name, missing)
	}
}

// MissingColumns says that table schema.name lacks mapped columns: the one
// wording of the problem, whether a Relation message or a reading of the
// catalog found it.
func MissingColumns(schema, name string, missing []string) string {
	if len(missing) == 1 {
		return fmt.Sprintf("column %q missing from table %s.%s", missing[0], schema, name)
	}
	q := make([]string, len(missing))
	for i, m := range missing {
		q[i] = fmt.Sprintf("%q", m)
	}
	return fmt.Sprintf("columns %s missing from table %s.%s", strings.Join(q, ", "), schema, name)
}
