package decode

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// reader walks one pgoutput message. The first failure is sticky: later reads
// return zero values, so decoding code checks r.err only where a value steers
// control flow (counts, lengths, tags) and once at the end. Every read checks
// the remaining length first, so no input can slice out of range.
type reader struct {
	buf []byte
	off int
	err *FormatError
}

func newReader(data []byte) reader { return reader{buf: data} }

// msg is the message type byte for error reports (0 for an empty message).
func (r *reader) msg() byte {
	if len(r.buf) == 0 {
		return 0
	}
	return r.buf[0]
}

// fail records the first error at the current offset.
func (r *reader) fail(reason string) {
	if r.err == nil {
		r.err = &FormatError{Msg: r.msg(), Offset: r.off, Reason: reason}
	}
}

// failf is fail with formatting; only reached on the error path.
func (r *reader) failf(format string, args ...any) {
	if r.err == nil {
		r.fail(fmt.Sprintf(format, args...))
	}
}

// ok reports whether no read has failed yet.
func (r *reader) ok() bool { return r.err == nil }

// error returns the sticky error as an error interface, nil when there is
// none (a nil *FormatError must not become a non-nil error).
func (r *reader) error() error {
	if r.err == nil {
		return nil
	}
	return r.err
}

func (r *reader) remaining() int { return len(r.buf) - r.off }

// need checks that n more bytes exist for field.
func (r *reader) need(n int, field string) bool {
	if r.err != nil {
		return false
	}
	if rem := r.remaining(); n < 0 || rem < n {
		r.failf("truncated: %s needs %d bytes, %d left", field, n, rem)
		return false
	}
	return true
}

func (r *reader) u8(field string) byte {
	if !r.need(1, field) {
		return 0
	}
	v := r.buf[r.off]
	r.off++
	return v
}

// i16 reads a signed Int16 (PG docs 55.6: all integers are big-endian).
func (r *reader) i16(field string) int16 {
	if !r.need(2, field) {
		return 0
	}
	v := int16(binary.BigEndian.Uint16(r.buf[r.off:]))
	r.off += 2
	return v
}

func (r *reader) u32(field string) uint32 {
	if !r.need(4, field) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.buf[r.off:])
	r.off += 4
	return v
}

func (r *reader) i32(field string) int32 { return int32(r.u32(field)) }

func (r *reader) u64(field string) uint64 {
	if !r.need(8, field) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf[r.off:])
	r.off += 8
	return v
}

// bytes returns the next n bytes, aliasing the message.
func (r *reader) bytes(n int, field string) []byte {
	if !r.need(n, field) {
		return nil
	}
	v := r.buf[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

// cstring reads a String (PG docs 55.6: NUL-terminated) without the NUL,
// aliasing the message.
func (r *reader) cstring(field string) []byte {
	if r.err != nil {
		return nil
	}
	i := bytes.IndexByte(r.buf[r.off:], 0)
	if i < 0 {
		r.failf("truncated: %s has no NUL terminator", field)
		return nil
	}
	v := r.buf[r.off : r.off+i : r.off+i]
	r.off += i + 1
	return v
}

// count16 reads an Int16 count, which must be non-negative and leave room for
// at least minEach bytes per element; checking before any allocation keeps a
// forged count from reserving memory the message cannot fill.
func (r *reader) count16(minEach int, field string) int {
	start := r.off
	n := int(r.i16(field))
	if r.err != nil {
		return 0
	}
	if n < 0 {
		r.off = start
		r.failf("negative %s %d", field, n)
		return 0
	}
	if rem := r.remaining(); n*minEach > rem {
		r.off = start
		r.failf("%s %d does not fit in the %d bytes left", field, n, rem)
		return 0
	}
	return n
}

// end fails if bytes remain: every v1 message has a fixed layout, so extra
// bytes mean the stream and this decoder disagree on the format.
func (r *reader) end() {
	if r.err == nil && r.remaining() != 0 {
		r.failf("%d unexpected trailing bytes", r.remaining())
	}
}
