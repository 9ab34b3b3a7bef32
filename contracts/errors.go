package contracts

import (
	"errors"
	"fmt"
	"strconv"
)

// The kinds of RegistryError, for errors.Is. Each asks the caller for a
// different decision, so they are never folded into one another.
var (
	// ErrNoSubject: no schema is registered under the event's subject (or
	// the event has no type to name one): contracts.unknown_type decides.
	ErrNoSubject = errors.New("no subject registered for this event type")
	// ErrUnreachable: the registry did not answer (network, timeout, 5xx,
	// authentication) and the subject is not cached: wait and retry.
	ErrUnreachable = errors.New("schema registry unreachable")
	// ErrIncompatible: the registry refused to register a schema because
	// the subject's compatibility level forbids it (HTTP 409).
	ErrIncompatible = errors.New("schema refused as incompatible by the registry")
	// ErrBadSchema: the registry refused the schema as invalid (HTTP 422),
	// or the registered schema does not compile here.
	ErrBadSchema = errors.New("invalid schema")
)

// RegistryError is a subject that could not be resolved or registered.
type RegistryError struct {
	Subject string
	Kind    error // ErrNoSubject, ErrUnreachable, ErrIncompatible or ErrBadSchema
	Err     error // the cause: the registry's answer or the transport error
}

func (e *RegistryError) Error() string {
	s := "contracts: subject " + strconv.Quote(e.Subject) + ": " + e.Kind.Error()
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches the kind, so errors.Is(err, ErrNoSubject) works on any wrap.
func (e *RegistryError) Is(target error) bool { return target == e.Kind }

func (e *RegistryError) Unwrap() error { return e.Err }

// SchemaRef names one registered schema version.
type SchemaRef struct {
	Subject string
	Version int
	ID      int // the registry's global id, the one the wire format carries
}

func (r SchemaRef) String() string {
	return fmt.Sprintf("subject %q version %d (id %d)", r.Subject, r.Version, r.ID)
}

// Violation is a payload that does not fit its schema. It is final for the
// event: contracts.on_violation routes it. Pointer and Reason are stable
// for a given payload and schema, so the headers of a re-delivered
// violation repeat the first.
type Violation struct {
	Schema SchemaRef
	// Pointer is the RFC 6901 JSON pointer of the offending value in the
	// payload ("" for the whole payload; for a missing required property,
	// where it should have been).
	Pointer string
	// Keyword is the schema location of the rule that failed, such as
	// /properties/qty/type; "" when the payload is not JSON at all.
	Keyword string
	// Reason says what was found and what was expected: "got string, want
	// integer", "missing property 'qty'".
	Reason string
	// More counts the other failures the schema found; Reason describes
	// the first in pointer order.
	More int
}

func (v *Violation) Error() string {
	at := v.Pointer
	if at == "" {
		at = "(root)"
	}
	s := fmt.Sprintf("contracts: %s: at %s: %s", v.Schema, at, v.Reason)
	if v.Keyword != "" {
		s += " (schema " + v.Keyword + ")"
	}
	if v.More > 0 {
		s += fmt.Sprintf(" and %d more", v.More)
	}
	return s
}
