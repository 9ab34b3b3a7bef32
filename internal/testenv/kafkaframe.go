package testenv

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The Kafka protocol, as far as the fault injectors read it: a frame is an
// int32 size and the message; a request starts with its api key, api
// version and correlation id, then the client id and, in flexible versions,
// tagged fields; an answer starts with the correlation id, then, in
// flexible versions, tagged fields (Kafka protocol guide, "Common Request
// and Response Structure").

// maxKafkaFrame bounds a frame read, against a stream that is not Kafka.
const maxKafkaFrame = 256 << 20

// ReadKafkaFrame reads one whole frame, its size included.
func ReadKafkaFrame(r io.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(size[:])
	if n > maxKafkaFrame {
		return nil, fmt.Errorf("kafka frame of %d bytes", n)
	}
	frame := make([]byte, 4+n)
	copy(frame, size[:])
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		return nil, err
	}
	return frame, nil
}

// EndTxnRequest parses an EndTxn request frame (api key 26, flexible from
// v3): its correlation id, whether its version is flexible, and whether it
// commits. ok is false for any other request.
func EndTxnRequest(b []byte) (corr int32, flexible, commit, ok bool) {
	if len(b) < 14 || binary.BigEndian.Uint16(b[4:6]) != 26 {
		return 0, false, false, false
	}
	ver := int16(binary.BigEndian.Uint16(b[6:8]))
	corr = int32(binary.BigEndian.Uint32(b[8:12]))
	off := 14
	if n := int16(binary.BigEndian.Uint16(b[12:14])); n > 0 {
		off += int(n)
	}
	flexible = ver >= 3
	var idLen int
	if flexible {
		if off >= len(b) {
			return 0, false, false, false
		}
		off++ // the header's tagged fields: none
		n, w := binary.Uvarint(b[off:])
		if w <= 0 || n == 0 {
			return 0, false, false, false
		}
		idLen, off = int(n)-1, off+w
	} else {
		if off+2 > len(b) {
			return 0, false, false, false
		}
		idLen, off = int(binary.BigEndian.Uint16(b[off:])), off+2
	}
	off += idLen + 8 + 2 // transactional id, producer id, producer epoch
	if off >= len(b) {
		return 0, false, false, false
	}
	return corr, flexible, b[off] == 1, true
}

// AnswerErrorAt is where the error code of an answer to a request like
// EndTxn sits (correlation id, the header's tagged fields when flexible,
// the throttle time), in a frame with its size.
func AnswerErrorAt(flexible bool) int {
	if flexible {
		return 4 + 4 + 1 + 4
	}
	return 4 + 4 + 4
}
