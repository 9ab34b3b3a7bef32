package decode

import (
	"errors"
	"fmt"
)

// FormatError reports a pgoutput message that does not follow the wire format
// of PG docs 55.9 (or one that is legal on the wire but never sent with the
// options outbox-cdc requests, such as a binary column value).
type FormatError struct {
	// Msg is the message type byte ('I', 'R', ...), or 0 for an empty message.
	Msg byte
	// Offset is the byte offset into the message at which decoding failed.
	Offset int
	// Reason says what was wrong.
	Reason string
}

func (e *FormatError) Error() string {
	if e.Msg == 0 {
		return fmt.Sprintf("pgoutput: malformed message at offset %d: %s", e.Offset, e.Reason)
	}
	return fmt.Sprintf("pgoutput: malformed %q message at offset %d: %s", e.Msg, e.Offset, e.Reason)
}

// ErrUnknownRelation is returned (wrapped with the relation id) for a change on
// a relation id no Relation message has described: pgoutput always sends the
// Relation message first (PG docs 55.5.3), so this is a protocol violation.
var ErrUnknownRelation = errors.New("pgoutput: change for a relation with no preceding Relation message")

// ErrTableRenamed is returned (wrapped in a *RenameError) when the outbox
// table's relation id reappears under another schema or name. The configured
// table no longer exists under that name, so continuing would silently stop
// publishing; callers treat it as fatal.
var ErrTableRenamed = errors.New("outbox table renamed")

// RenameError carries the old and new names of a renamed outbox table. It
// unwraps to ErrTableRenamed.
type RenameError struct {
	RelationID         uint32
	OldSchema, OldName string
	NewSchema, NewName string
}

func (e *RenameError) Error() string {
	return fmt.Sprintf("%v: relation %d was %s.%s, is now %s.%s",
		ErrTableRenamed, e.RelationID, e.OldSchema, e.OldName, e.NewSchema, e.NewName)
}

// Unwrap lets errors.Is(err, ErrTableRenamed) match.
func (e *RenameError) Unwrap() error { return ErrTableRenamed }
