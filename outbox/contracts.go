package outbox

import (
	"errors"
	"fmt"
)

// Checker checks an event's payload against its contract before the Writer
// writes it (Config.Contracts). Write and Emit call it inside the caller's
// transaction, after the payload is encoded and before the INSERT or the
// logical message: it must answer from memory, with no network I/O, so that
// a slow schema registry never holds a business transaction open. The
// package github.com/outbox-cdc/outbox-cdc/outbox/contracts is a Checker
// backed by a schema registry (JSON Schema), loaded and refreshed outside
// every transaction.
//
// Check gets the event's aggregate type (which selects its topic), its
// event type and the payload bytes as the connector will see them; it is
// not called for a tombstone (nil payload), which the connector does not
// check either. It returns nil when the payload fits, a *ContractViolation
// when it does not, an error wrapping ErrNoContract when the checker has no
// contract for the event type and refuses it, or another error (such as an
// unusable registered schema). Every error stops the write.
type Checker interface {
	Check(aggregateType, eventType string, payload []byte) error
}

// ErrNoContract is wrapped by a Checker's refusal of an event type it has no
// contract for (no subject registered, or not loaded yet).
var ErrNoContract = errors.New("outbox: no contract for the event type")

// ContractViolation is a payload that does not fit the schema registered
// for its event type. errors.Is(err, ErrInvalidEvent) holds for it.
type ContractViolation struct {
	// Subject and Version name the schema the payload was checked against;
	// SchemaID is the registry's global id of that version.
	Subject  string
	Version  int
	SchemaID int
	// EventType is the event's type.
	EventType string
	// Pointer is the RFC 6901 JSON pointer of the offending value in the
	// payload ("" for the whole payload; for a missing required property,
	// where it should have been).
	Pointer string
	// Keyword is the schema location of the rule that failed, such as
	// /properties/qty/type; "" when the payload is not JSON at all.
	Keyword string
	// Reason says what was found and what was expected ("got string, want
	// integer"), worded as in the connector's dead letters.
	Reason string
	// More counts the other failures; Reason describes the first in
	// pointer order.
	More int
}

func (v *ContractViolation) Error() string {
	at := v.Pointer
	if at == "" {
		at = "(root)"
	}
	s := fmt.Sprintf("outbox: event type %s violates subject %q version %d (id %d): at %s: %s",
		v.EventType, v.Subject, v.Version, v.SchemaID, at, v.Reason)
	if v.Keyword != "" {
		s += " (schema " + v.Keyword + ")"
	}
	if v.More > 0 {
		s += fmt.Sprintf(" and %d more", v.More)
	}
	return s
}

// Is makes a violation an ErrInvalidEvent, like every error about an
// event's content.
func (v *ContractViolation) Is(target error) bool { return target == ErrInvalidEvent }

// checkContract runs the Writer's Checker, if any, on an encoded payload.
func (w *Writer) checkContract(e *Event, payload []byte) error {
	if w.contracts == nil || payload == nil {
		return nil
	}
	return w.contracts.Check(e.AggregateType, e.EventType, payload)
}
