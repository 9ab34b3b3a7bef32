// Package contracts is an outbox.Checker backed by a schema registry that
// serves the Confluent API (Confluent, Apicurio's /apis/ccompat/v7,
// Redpanda, Karapace): the writer refuses, before the INSERT, a payload that
// the connector's contracts.* would dead-letter.
//
// It checks JSON Schema only (contracts.format: json-schema); for Avro and
// Protobuf contracts the connector's check is the only one.
//
// The write path does no network I/O. Start loads the latest version of
// every subject the writer's events can name (one request for the subject
// list, one per such subject), then a goroutine loads them again every
// Config.Refresh until Stop; Check answers from the last load. A failed load
// keeps what the previous one had, so a registry outage does not stop
// writes of known types. Subjects are named as the connector names them
// (Config.Strategy, TopicTemplate, Topics).
//
// It is a package of its own so that a service that does not opt in does
// not build franz-go's sr nor the JSON Schema library.
package contracts

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-cdc/outbox-cdc/outbox"
)

// Defaults.
const (
	// DefaultRefresh is the connector's: a new version or subject reaches
	// the writer within it.
	DefaultRefresh = time.Minute
	// DefaultTimeout bounds one registry request.
	DefaultTimeout = 5 * time.Second
)

// UnknownType is what Check does with an event type that has no schema:
// no subject in the registry, or none loaded yet.
type UnknownType string

// UnknownType values.
const (
	// UnknownRefuse refuses the event with an error wrapping
	// outbox.ErrNoContract (and ErrNotLoaded when no load has succeeded
	// yet, or the subject's schema could not be fetched).
	UnknownRefuse UnknownType = "refuse"
	// UnknownPass writes the event unchecked; the connector's
	// contracts.unknown_type then decides.
	UnknownPass UnknownType = "pass"
)

// ErrNotLoaded is wrapped, with outbox.ErrNoContract, by the refusal of an
// event type whose subject the checker has not been able to load yet.
var ErrNotLoaded = errors.New("outbox/contracts: the registry has not answered for this subject yet")

// ErrBadSchema is wrapped by the refusal of an event whose registered
// schema cannot be used here (not JSON Schema, or does not compile): the
// connector cannot check it either. Not subject to UnknownType.
var ErrBadSchema = errors.New("outbox/contracts: the registered schema cannot be used")

// Config configures a Checker. URL is required; the zero values of the
// others are the connector's defaults.
type Config struct {
	// URL is the Confluent API's base, as the connector's
	// contracts.registry.url.
	URL string
	// Username and Password (HTTP basic) or Token (bearer), if the
	// registry wants them.
	Username, Password, Token string
	// HTTPClient, if set, sends the requests (TLS, proxies); its Timeout
	// wins over Timeout.
	HTTPClient *http.Client
	// Timeout bounds one request. Default DefaultTimeout.
	Timeout time.Duration
	// Strategy is the connector's contracts.subject_strategy. Default
	// StrategyTopicRecord.
	Strategy Strategy
	// TopicTemplate is the connector's kafka.topic (only {aggregate_type}
	// can be filled in). Default DefaultTopicTemplate. Not used by
	// StrategyRecord.
	TopicTemplate string
	// Topics is the connector's kafka.topics: aggregate type → topic; an
	// entry wins over the template.
	Topics map[string]string
	// UnknownType: UnknownRefuse (default) or UnknownPass.
	UnknownType UnknownType
	// Refresh is how often the subjects are loaded again. Default
	// DefaultRefresh.
	Refresh time.Duration
	// OnRefreshError, if set, is called from the refresh goroutine with a
	// load's error (the previous load's schemas stay in use).
	OnRefreshError func(error)
}

// Checker checks payloads against the schemas of the last load. Safe for
// concurrent use; Check never blocks on the network.
type Checker struct {
	cl      *sr.Client
	names   subjects
	unknown UnknownType
	refresh time.Duration
	onError func(error)

	state atomic.Pointer[state] // what Check reads; replaced whole by a load

	mu       sync.Mutex // one load at a time; guards compiled
	compiled map[versionKey]*entry

	runMu  sync.Mutex
	cancel context.CancelFunc // Start's loop; nil when not running
	done   chan struct{}
}

type versionKey struct {
	subject string
	version int
}

// entry is one subject's schema in use, or why there is none.
type entry struct {
	subject         string
	version, id     int
	schema          *JSONSchema // nil: err says why
	err             error       // ErrNotLoaded or ErrBadSchema, wrapped
	alwaysRefusable bool        // err is ErrBadSchema: UnknownType does not apply
}

// state is the result of the last successful subject listing.
type state struct {
	subjects map[string]*entry
	loaded   bool  // a listing succeeded at least once
	lastErr  error // the last load's error, for ErrNotLoaded's message
}

// New checks cfg and builds the client; it sends nothing (Start or Refresh
// does). Until a load succeeds every event type is unknown.
func New(cfg Config) (*Checker, error) {
	if cfg.URL == "" {
		return nil, errors.New("outbox/contracts: Config.URL is required (the connector's contracts.registry.url)")
	}
	names, err := newSubjects(cmpOr(cfg.Strategy, StrategyTopicRecord), cfg.TopicTemplate, cfg.Topics)
	if err != nil {
		return nil, err
	}
	unknown := cmpOr(cfg.UnknownType, UnknownRefuse)
	if unknown != UnknownRefuse && unknown != UnknownPass {
		return nil, fmt.Errorf("outbox/contracts: unknown type action %q: use %s or %s", unknown, UnknownRefuse, UnknownPass)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: cmpOr(cfg.Timeout, DefaultTimeout)}
	}
	opts := []sr.ClientOpt{sr.URLs(cfg.URL), sr.HTTPClient(hc), sr.UserAgent("outbox-cdc-writer")}
	if cfg.Token != "" {
		opts = append(opts, sr.BearerToken(cfg.Token))
	}
	if cfg.Username != "" || cfg.Password != "" {
		opts = append(opts, sr.BasicAuth(cfg.Username, cfg.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("outbox/contracts: %w", err)
	}
	c := &Checker{cl: cl, names: names, unknown: unknown, refresh: cmpOr(cfg.Refresh, DefaultRefresh),
		onError: cfg.OnRefreshError, compiled: map[versionKey]*entry{}}
	c.state.Store(&state{subjects: map[string]*entry{}, lastErr: errors.New("no load has run (call Start)")})
	return c, nil
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Check implements outbox.Checker: nil when payload fits the schema of its
// subject, a *outbox.ContractViolation with the subject, the version and the
// JSON pointer when it does not; for a type without a schema, what
// Config.UnknownType says.
func (c *Checker) Check(aggregateType, eventType string, payload []byte) error {
	subject := c.names.subject(aggregateType, eventType)
	st := c.state.Load()
	e := st.subjects[subject]
	switch {
	case e == nil && !st.loaded:
		return c.unknownType(fmt.Errorf("%w: subject %q: %w (%v)", outbox.ErrNoContract, subject, ErrNotLoaded, st.lastErr))
	case e == nil:
		return c.unknownType(fmt.Errorf("%w: subject %q is not registered (event type %s)", outbox.ErrNoContract, subject, eventType))
	case e.schema == nil && e.alwaysRefusable:
		return e.err
	case e.schema == nil:
		return c.unknownType(e.err)
	}
	if v := e.schema.Check(payload); v != nil {
		v.Subject, v.Version, v.SchemaID, v.EventType = e.subject, e.version, e.id, eventType
		return v
	}
	return nil
}

func (c *Checker) unknownType(err error) error {
	if c.unknown == UnknownPass {
		return nil
	}
	return err
}

var _ outbox.Checker = (*Checker)(nil)
