package decode

import (
	"encoding/hex"
	"fmt"
	"slices"
)

// insert decodes Insert (PG docs 55.9): Int32 relation id, Byte1('N'), then a
// TupleData with the new row.
func (d *Decoder) insert(r *reader, res *Result) error {
	id := r.u32("relation id")
	d.tupleTag(r, "N")
	if !r.ok() {
		return nil
	}
	rel := d.rels[id]
	if rel == nil {
		return fmt.Errorf("%w: Insert into relation id %d", ErrUnknownRelation, id)
	}
	if !rel.outbox {
		// Still walk the tuple: a malformed message must not pass as a skip.
		d.tuple(r, rel.cols, nil, false)
		r.end()
		res.Kind = KindSkip
		return nil
	}

	if cap(d.vals) < len(rel.cols) {
		d.vals = make([]Value, len(rel.cols))
	}
	vals := d.vals[:len(rel.cols)]
	// Decoded bytea is never longer than its text form, so reserving the rest
	// of the message up front means the buffer never moves under the values
	// already decoded into it.
	if rel.hasBytea && cap(d.bytea) < r.remaining() {
		d.bytea = make([]byte, 0, r.remaining())
	}
	d.bytea = d.bytea[:0]
	d.tuple(r, rel.cols, vals, false)
	r.end()
	if !r.ok() {
		return nil
	}

	ev := &res.Event
	ev.RelationID = rel.id
	ev.Invalid = rel.invalid
	ev.ID = pick(vals, rel.idx[fieldID])
	ev.AggregateType = pick(vals, rel.idx[fieldAggregateType])
	ev.AggregateID = pick(vals, rel.idx[fieldAggregateID])
	ev.EventType = pick(vals, rel.idx[fieldEventType])
	ev.Payload = pick(vals, rel.idx[fieldPayload])
	ev.PayloadFormat = rel.payload
	ev.Table = rel.table
	t := &d.tables[rel.table]
	for i := range t.headers {
		// Name is rewritten too, in case a caller edited the aliased slice.
		t.headers[i] = Header{Name: t.m.HeaderColumns[i], Value: pick(vals, rel.idx[numFields+i])}
	}
	if len(t.headers) > 0 {
		ev.Headers = t.headers
	}
	base := numFields + len(t.headers)
	for i := range t.columns {
		at := rel.idx[base+i]
		t.columns[i] = Column{Name: t.m.Columns[i], Value: pick(vals, at)}
		if at >= 0 {
			t.columns[i].Type = rel.cols[at].typ
		}
	}
	if len(t.columns) > 0 {
		ev.Columns = t.columns
	}
	res.Kind = KindEvent
	return nil
}

// pick returns the value at tuple position i, or the zero Value for a column
// the table lacks (i < 0).
func pick(vals []Value, i int) Value {
	if i < 0 {
		return Value{}
	}
	return vals[i]
}

// update validates Update (PG docs 55.9): Int32 relation id, optionally
// Byte1('K') or Byte1('O') and the old key or row, then Byte1('N') and the new
// row. outbox-cdc publishes only Inserts, so the result is a skip; as nothing
// is read through the relation cache, the relation id is not looked up.
func (d *Decoder) update(r *reader, res *Result) {
	r.u32("relation id")
	tag := d.tupleTag(r, "KON")
	if tag == 'K' || tag == 'O' {
		d.tuple(r, nil, nil, true)
		d.tupleTag(r, "N")
	}
	// Unchanged TOAST values are legal here: they are how an Update says a
	// large column kept its value.
	d.tuple(r, nil, nil, true)
	r.end()
	res.Kind = KindSkip
}

// delete validates Delete (PG docs 55.9): Int32 relation id, Byte1('K') or
// Byte1('O'), then the old key or row. Deletes are never published, so like
// update this only checks the format.
func (d *Decoder) delete(r *reader, res *Result) {
	r.u32("relation id")
	d.tupleTag(r, "KO")
	d.tuple(r, nil, nil, true)
	r.end()
	res.Kind = KindSkip
}

// tupleTag reads the Byte1 that introduces a TupleData and checks it is one of
// allowed.
func (d *Decoder) tupleTag(r *reader, allowed string) byte {
	tag := r.u8("tuple tag")
	if !r.ok() {
		return 0
	}
	for i := 0; i < len(allowed); i++ {
		if tag == allowed[i] {
			return tag
		}
	}
	r.off--
	r.failf("tuple tag %q, want one of %q", tag, allowed)
	return 0
}

// tuple reads a TupleData (PG docs 55.9): Int16 column count, then per column
// Byte1 kind: 'n' NULL, 'u' unchanged TOAST value, 't' Int32 length and the
// text form, 'b' Int32 length and the binary form.
//
// When cols is non-nil the count must match it (the Relation message and the
// tuple describe the same published columns). When vals is non-nil it
// receives each value, with bytea columns marked in cols already decoded into
// d.bytea. unchanged says whether 'u' is legal.
func (d *Decoder) tuple(r *reader, cols []column, vals []Value, unchanged bool) {
	start := r.off
	n := r.count16(1, "tuple column count")
	if !r.ok() {
		return
	}
	if cols != nil && n != len(cols) {
		r.off = start
		r.failf("tuple has %d columns, its Relation message %d", n, len(cols))
		return
	}
	for i := range n {
		kindOff := r.off
		switch kind := r.u8("column kind"); kind {
		case 'n':
			if vals != nil {
				vals[i] = Value{Null: true}
			}
		case 'u':
			if !unchanged {
				r.off = kindOff
				r.fail("unchanged TOAST value in an Insert")
				return
			}
			if vals != nil {
				vals[i] = Value{}
			}
		case 't':
			lenOff := r.off
			l := r.i32("column length")
			if r.ok() && l < 0 {
				r.off = lenOff
				r.failf("negative column length %d", l)
			}
			b := r.bytes(int(l), "column value")
			if !r.ok() {
				return
			}
			if vals == nil {
				continue
			}
			if cols != nil && cols[i].bytea {
				var ok bool
				if b, ok = d.decodeBytea(b); !ok {
					r.off = lenOff
					r.failf("column %q: malformed bytea text", cols[i].name)
					return
				}
			}
			vals[i] = Value{Bytes: b}
		case 'b':
			// Binary values appear only with the binary option (PG docs
			// 55.5.1), which outbox-cdc does not request; its layout is
			// type-specific, so it cannot be passed on as text.
			r.off = kindOff
			r.fail("binary column value, but binary mode was not requested")
			return
		default:
			if r.ok() {
				r.off = kindOff
				r.failf("unknown column kind %q", kind)
			}
			return
		}
	}
}

// decodeBytea converts the text form of a bytea value (PG docs 8.4) into raw
// bytes appended to d.bytea, whose capacity the caller reserved. It accepts the
// hex format ("\x" then two hex digits per byte, the default output since 9.0)
// and the legacy escape format (bytea_output = escape).
func (d *Decoder) decodeBytea(src []byte) ([]byte, bool) {
	start := len(d.bytea)
	if len(src) >= 2 && src[0] == '\\' && src[1] == 'x' {
		h := src[2:]
		if len(h)%2 != 0 {
			return nil, false
		}
		// The caller's reservation makes Grow a no-op; it is here so that a
		// wrong reservation costs an allocation, not a panic.
		d.bytea = slices.Grow(d.bytea, len(h)/2)
		dst := d.bytea[start : start+len(h)/2]
		if _, err := hex.Decode(dst, h); err != nil {
			return nil, false
		}
		d.bytea = d.bytea[:start+len(dst)]
		return dst[:len(dst):len(dst)], true
	}
	// Escape format: "\\" is a backslash, "\ooo" an octal byte, anything else
	// stands for itself.
	out := d.bytea
	for i := 0; i < len(src); {
		c := src[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch {
		case i+1 < len(src) && src[i+1] == '\\':
			out = append(out, '\\')
			i += 2
		case i+3 < len(src) && isOctal(src[i+1]) && src[i+1] <= '3' && isOctal(src[i+2]) && isOctal(src[i+3]):
			out = append(out, (src[i+1]-'0')<<6|(src[i+2]-'0')<<3|(src[i+3]-'0'))
			i += 4
		default:
			return nil, false
		}
	}
	d.bytea = out
	return out[start:len(out):len(out)], true
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
