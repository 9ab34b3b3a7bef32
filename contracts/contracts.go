// Package contracts checks outbox events against schemas registered in a
// schema registry that serves the Confluent API (Confluent, Apicurio's
// /apis/ccompat/v7, Redpanda, Karapace), and frames them in the Confluent
// wire format (docs/configuration.md, contracts.*).
//
// One event is one call of Contracts.Apply: the event type and the topic
// name a subject (Strategy), the subject resolves to a schema version and its
// global id (Registry), and the payload is checked against that schema; in
// ModeEncode the value becomes 0x00, the 4-byte big-endian id, then the body
// the format encodes (for JSON Schema the payload bytes unchanged).
//
// The invariants the pipeline relies on:
//   - a (subject, version) pair yields one id for the life of the process,
//     and the same payload yields the same bytes, so replays, verify's repair
//     and exactly_once retries re-encode identically;
//   - a subject resolved once keeps resolving while the registry is down;
//   - nothing is skipped here: a subject that cannot be resolved is an error
//     the caller waits on (Retryable) or routes (ErrNoSubject), and a payload
//     that does not fit is a *Violation, never a silently passed record.
//
// Formats are behind the codec interface (codecOf): JSON Schema, Avro
// (avro.go) and Protobuf (protobuf.go), each a compiled schema that checks a
// JSON payload and appends the body.
package contracts

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"
)

// Format is the schema language of contracts.format.
type Format string

// Formats.
const (
	FormatJSONSchema Format = "json-schema"
	FormatAvro       Format = "avro"
	FormatProtobuf   Format = "protobuf"
)

// Formats lists every contracts.format value, the supported ones first.
func Formats() []string {
	return []string{string(FormatJSONSchema), string(FormatAvro), string(FormatProtobuf)}
}

// Supported reports whether this version can check and encode f.
func (f Format) Supported() bool {
	_, _, ok := codecOf(f)
	return ok
}

// Mode is contracts.mode: what the record value becomes.
type Mode string

// Modes.
const (
	// ModeValidate keeps the payload as the value; it is only checked.
	ModeValidate Mode = "validate"
	// ModeEncode makes the value the Confluent wire format.
	ModeEncode Mode = "encode"
)

// Modes lists every contracts.mode value.
func Modes() []string { return []string{string(ModeValidate), string(ModeEncode)} }

// Resolution is contracts.resolution: where a subject's schema comes from.
type Resolution string

// Resolutions.
const (
	// ResolutionLookup uses the latest version already registered.
	ResolutionLookup Resolution = "lookup"
	// ResolutionAuto registers the local schema of a subject on first use
	// (Config.Schemas), for development.
	ResolutionAuto Resolution = "auto"
)

// Resolutions lists every contracts.resolution value.
func Resolutions() []string { return []string{string(ResolutionLookup), string(ResolutionAuto)} }

// Config is what New needs. The zero values of Strategy, Resolution, Mode
// and Format are the configuration's defaults.
type Config struct {
	Registry   RegistryConfig
	Format     Format
	Mode       Mode
	Strategy   Strategy
	Resolution Resolution
	// Schemas returns the local schema text of a subject, for
	// ResolutionAuto; a subject it does not know is looked up instead.
	Schemas func(subject string) (string, bool)
}

// Contracts applies the contracts of one configuration. Safe for
// concurrent use.
type Contracts struct {
	reg      *Registry
	mode     Mode
	strategy Strategy
}

// Result is an event's record value under its contract.
type Result struct {
	// Value is the payload (ModeValidate) or the framed value (ModeEncode).
	Value []byte
	// Schema is the version the payload was checked against.
	Schema SchemaRef
}

// New builds the registry client; it does not contact the registry (the
// first Apply does), so a connector starts while the registry is down.
func New(cfg Config) (*Contracts, error) {
	cfg.Format = cmp.Or(cfg.Format, FormatJSONSchema)
	cfg.Mode = cmp.Or(cfg.Mode, ModeValidate)
	cfg.Strategy = cmp.Or(cfg.Strategy, StrategyTopicRecord)
	cfg.Resolution = cmp.Or(cfg.Resolution, ResolutionLookup)
	if !cfg.Format.Supported() {
		return nil, fmt.Errorf("contracts: format %s is not yet supported in this version", cfg.Format)
	}
	if _, err := cfg.Strategy.Subject("t", "e"); err != nil {
		return nil, err
	}
	switch cfg.Mode {
	case ModeValidate, ModeEncode:
	default:
		return nil, fmt.Errorf("contracts: mode %q: use one of %v", cfg.Mode, Modes())
	}
	reg, err := NewRegistry(cfg.Registry, cfg.Resolution, cfg.Schemas)
	if err != nil {
		return nil, err
	}
	reg.codec, reg.schemaType, _ = codecOf(cfg.Format)
	return &Contracts{reg: reg, mode: cfg.Mode, strategy: cfg.Strategy}, nil
}

// Registry is the registry client and id cache Apply uses.
func (c *Contracts) Registry() *Registry { return c.reg }

// Apply checks payload, an event of eventType bound for topic, against its
// subject's schema and returns the record value. Its errors are a
// *Violation (the payload does not fit), or a *RegistryError: ErrNoSubject
// (the caller's contracts.unknown_type decides), ErrUnreachable (Retryable:
// wait with backoff and call again, never skip), ErrBadSchema.
func (c *Contracts) Apply(ctx context.Context, topic, eventType string, payload []byte) (Result, error) {
	return c.apply(ctx, topic, eventType, payload, c.reg.Resolve)
}

// ApplyLatest is Apply against the subject's version the registry names
// now (Registry.Latest), for a redrive after a schema fix: the cached one
// may be the version the payload violated. A registry that does not answer
// is an ErrUnreachable error, not the cached version.
func (c *Contracts) ApplyLatest(ctx context.Context, topic, eventType string, payload []byte) (Result, error) {
	return c.apply(ctx, topic, eventType, payload, c.reg.Latest)
}

func (c *Contracts) apply(ctx context.Context, topic, eventType string, payload []byte,
	resolve func(context.Context, string) (*Schema, error)) (Result, error) {
	subject, err := c.strategy.Subject(topic, eventType)
	if err != nil {
		return Result{}, &RegistryError{Subject: subject, Kind: ErrNoSubject, Err: err}
	}
	s, err := resolve(ctx, subject)
	if err != nil {
		return Result{}, err
	}
	if c.mode == ModeValidate {
		if err := s.Validate(payload); err != nil {
			return Result{}, err
		}
		return Result{Value: payload, Schema: s.Ref}, nil
	}
	v, err := s.Encode(nil, payload)
	if err != nil {
		return Result{}, err
	}
	return Result{Value: v, Schema: s.Ref}, nil
}

// Retryable reports whether err means "the registry could not answer now":
// the event waits and Apply is called again. Every other error of this
// package is final for the event.
func Retryable(err error) bool { return errors.Is(err, ErrUnreachable) }

// defaultTimeout bounds one registry request when RegistryConfig.Timeout is
// zero: long enough for a loaded registry, short enough that a dead one is
// seen before the stream's status interval piles up.
const defaultTimeout = 5 * time.Second

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
