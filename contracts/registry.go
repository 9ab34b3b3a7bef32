package contracts

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/twmb/franz-go/pkg/sr"
)

// DefaultRefresh is how long a subject's resolved version is used before
// the registry is asked for its latest again: a new version reaches the
// connector within it, and a registry outage costs at most one failed
// request per subject per interval.
const DefaultRefresh = time.Minute

// RegistryConfig is how to reach the registry (contracts.registry.*).
type RegistryConfig struct {
	// URL is the base of the Confluent API, such as
	// http://registry:8080/apis/ccompat/v7.
	URL string
	// UsernameFile and PasswordFile (HTTP basic), or TokenFile (bearer),
	// are read at every request, so a rotated secret is used at once.
	UsernameFile, PasswordFile, TokenFile string
	TLS                                   *tls.Config // nil: the system's roots
	Timeout                               time.Duration
	Refresh                               time.Duration
}

// Registry resolves subjects to compiled schemas and keeps every version it
// resolved: by (subject, version), written once, so one pair always yields
// one id; and per subject the version in use, which is served from memory
// while the registry is down. Safe for concurrent use.
type Registry struct {
	cl         *sr.Client
	codec      codec
	schemaType sr.SchemaType // the registered texts' schemaType, codec's format
	resolution Resolution
	schemas    func(subject string) (string, bool)
	refresh    time.Duration
	now        func() time.Time
	obs        atomic.Pointer[Observer] // SetObserver (observe.go)

	mu       sync.Mutex
	versions map[versionKey]*Schema
	inUse    map[string]*use
	// absent is when the registry last said a subject has no version: it
	// is not asked again before the refresh interval, so an event type
	// without a contract (contracts.unknown_type pass or quarantine) costs
	// no request per event.
	absent map[string]absence
	// refreshes counts the refreshInUse goroutines (tests wait for them).
	refreshes sync.WaitGroup
}

// absence is the registry's answer that a subject has no version, and when.
type absence struct {
	err *RegistryError
	at  time.Time
}

type versionKey struct {
	subject string
	version int
}

// use is the version a subject resolves to and when the registry last said
// so (or was last asked, when it did not answer).
type use struct {
	schema     *Schema
	checked    time.Time
	refreshing bool // a refreshInUse runs
}

// NewRegistry builds the client; it sends nothing.
func NewRegistry(cfg RegistryConfig, res Resolution, schemas func(string) (string, bool)) (*Registry, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("contracts: registry URL %q: want http(s)://host[:port]/path", cfg.URL)
	}
	switch res {
	case ResolutionLookup, ResolutionAuto:
	default:
		return nil, fmt.Errorf("contracts: resolution %q: use one of %v", res, Resolutions())
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg.TLS
	r := &Registry{codec: jsonSchemaCodec{}, schemaType: sr.TypeJSON, resolution: res, schemas: schemas,
		refresh: cmpOrDuration(cfg.Refresh, DefaultRefresh), now: time.Now,
		versions: map[versionKey]*Schema{}, inUse: map[string]*use{}, absent: map[string]absence{}}
	hc := &http.Client{Transport: timedTransport{base: tr, obs: &r.obs}, Timeout: cmpOrDuration(cfg.Timeout, defaultTimeout)}
	cl, err := sr.NewClient(sr.URLs(cfg.URL), sr.HTTPClient(hc), sr.UserAgent("outbox-cdc"), sr.PreReq(cfg.authorize))
	if err != nil {
		return nil, fmt.Errorf("contracts: %w", err)
	}
	r.cl = cl
	return r, nil
}

func cmpOrDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// authorize adds the credentials, read now from their files.
func (cfg RegistryConfig) authorize(req *http.Request) error {
	if cfg.TokenFile != "" {
		tok, err := kafkaopt.ReadSecretFile(cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("token file %s: %w", cfg.TokenFile, err)
		}
		req.Header.Set("Authorization", "Bearer "+string(tok))
	}
	if cfg.UsernameFile != "" || cfg.PasswordFile != "" {
		user, err := kafkaopt.ReadSecretFile(cfg.UsernameFile)
		if err != nil {
			return fmt.Errorf("username file %s: %w", cfg.UsernameFile, err)
		}
		pw, err := kafkaopt.ReadSecretFile(cfg.PasswordFile)
		if err != nil {
			return fmt.Errorf("password file %s: %w", cfg.PasswordFile, err)
		}
		req.SetBasicAuth(string(user), string(pw))
	}
	return nil
}

// Client is the underlying Confluent API client, for administrative calls
// (compatibility levels, listing) that the hot path does not make.
func (r *Registry) Client() *sr.Client { return r.cl }

// Resolve returns the schema subject's events are checked against: the
// version in use (asked again in the background once the refresh interval
// is over: refreshInUse), else the registry's answer (lookup: the latest
// version; auto: the local schema's version, registered if new). A subject
// never resolved is a *RegistryError with ErrUnreachable (retry) or, when
// the registry says the subject does not exist, ErrNoSubject (kept for the
// refresh interval).
func (r *Registry) Resolve(ctx context.Context, subject string) (*Schema, error) {
	r.mu.Lock()
	if cur := r.inUse[subject]; cur != nil {
		if r.now().Sub(cur.checked) >= r.refresh && !cur.refreshing {
			cur.refreshing = true
			r.refreshes.Add(1)
			go r.refreshInUse(subject, cur)
		}
		r.mu.Unlock()
		return cur.schema, nil
	}
	if a, ok := r.absent[subject]; ok && r.now().Sub(a.at) < r.refresh {
		r.mu.Unlock()
		return nil, a.err
	}
	r.mu.Unlock()
	r.observer().CacheMiss()
	ss, err := r.fetch(ctx, subject)
	if err != nil {
		rerr := r.failed(classify(subject, err))
		if errors.Is(rerr, ErrNoSubject) {
			r.mu.Lock()
			r.absent[subject] = absence{rerr, r.now()}
			r.mu.Unlock()
		}
		return nil, rerr
	}
	s, err := r.store(subject, ss)
	if err != nil {
		var rerr *RegistryError
		if errors.As(err, &rerr) {
			r.failed(rerr)
		}
		return nil, err
	}
	return s, nil
}

// refreshInUse asks the registry again for a subject in use, off the
// caller's goroutine: a registry that does not answer never holds up the
// events of known types (review9: 20 cached types behind a black-holed
// registry took 4 s per round of events at a 200 ms timeout). An answer
// replaces the version in use; an error keeps it for another interval,
// also "no such subject" (a registry restarted empty must not turn known
// types into unknown ones). It ends within the registry client's timeout.
func (r *Registry) refreshInUse(subject string, cur *use) {
	defer r.refreshes.Done()
	ss, err := r.fetch(context.Background(), subject)
	if err == nil {
		_, err = r.store(subject, ss)
	} else {
		err = classify(subject, err)
	}
	r.mu.Lock()
	cur.refreshing = false
	if err != nil {
		cur.checked = r.now()
	}
	r.mu.Unlock()
	var rerr *RegistryError
	if errors.As(err, &rerr) {
		r.failed(rerr)
	}
}

// Latest asks the registry now for the subject's version to use (lookup:
// its latest; auto: the local schema's) and makes it the one in use, as
// Resolve does once its refresh interval is over. Unlike Resolve it never
// answers from the cache: a registry that does not answer is a
// *RegistryError with ErrUnreachable even for a subject resolved before.
func (r *Registry) Latest(ctx context.Context, subject string) (*Schema, error) {
	ss, err := r.fetch(ctx, subject)
	if err != nil {
		return nil, r.failed(classify(subject, err))
	}
	return r.store(subject, ss)
}

// fetch asks the registry for the subject's version to use.
func (r *Registry) fetch(ctx context.Context, subject string) (sr.SubjectSchema, error) {
	if r.resolution == ResolutionAuto && r.schemas != nil {
		if text, ok := r.schemas(subject); ok {
			if _, err := r.cl.RegisterSchema(ctx, subject, r.srSchema(text), -1, -1); err != nil {
				return sr.SubjectSchema{}, err
			}
			// Registering answers the id only; the lookup adds the version.
			// Its "not found" (a follower behind the leader) is not "no
			// such subject": the subject was just registered, so it is
			// retried, never routed as an unknown type (review9).
			ss, err := r.cl.LookupSchema(ctx, subject, r.srSchema(text))
			if err != nil {
				return sr.SubjectSchema{}, fmt.Errorf("look up the schema just registered: %v", err)
			}
			return ss, nil
		}
	}
	return r.cl.SchemaByVersion(ctx, subject, -1)
}

func (r *Registry) srSchema(text string) sr.Schema {
	return sr.Schema{Schema: text, Type: r.schemaType}
}

// store compiles a version seen for the first time and makes it the one in
// use. A (subject, version) already stored keeps its schema and id whatever
// the registry answers now: the bytes of an event never change.
func (r *Registry) store(subject string, ss sr.SubjectSchema) (*Schema, error) {
	key := versionKey{subject, ss.Version}
	r.mu.Lock()
	s := r.versions[key]
	r.mu.Unlock()
	if s == nil || s.Ref.ID != ss.ID || s.Text != ss.Schema.Schema {
		// New, or the registry now answers this version with another id or
		// text (its storage lost and refilled, restored from another
		// backup): the registry's answer wins, since consumers decode by the
		// frame's id (review9: the old id named another subject's schema).
		var err error
		if s, err = r.compile(subject, ss); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev := r.versions[key]; prev != nil && prev.Ref.ID == s.Ref.ID && prev.Text == s.Text {
		s = prev // a concurrent Resolve stored it first
	}
	r.versions[key] = s
	r.inUse[subject] = &use{schema: s, checked: r.now()}
	delete(r.absent, subject)
	return s, nil
}

// compile checks and compiles the registry's answer for subject.
func (r *Registry) compile(subject string, ss sr.SubjectSchema) (*Schema, error) {
	if !validID(ss.ID) || ss.Version < 1 {
		return nil, &RegistryError{Subject: subject, Kind: ErrBadSchema,
			Err: fmt.Errorf("the registry answered id %d version %d", ss.ID, ss.Version)}
	}
	// An answer without schemaType decodes as Avro (the API's default;
	// Apicurio's lookup leaves it out), so Avro is not told apart
	// here; an Avro text fails to compile as another format.
	if ss.Type != sr.TypeAvro && ss.Type != r.schemaType {
		return nil, &RegistryError{Subject: subject, Kind: ErrBadSchema,
			Err: fmt.Errorf("version %d is a %s schema, not %s (contracts.format)", ss.Version, ss.Type, r.schemaType)}
	}
	c, err := r.codec.compile(ss.Schema.Schema)
	if err != nil {
		return nil, &RegistryError{Subject: subject, Kind: ErrBadSchema, Err: fmt.Errorf("version %d: %w", ss.Version, err)}
	}
	return &Schema{Ref: SchemaRef{Subject: subject, Version: ss.Version, ID: ss.ID}, Text: ss.Schema.Schema, c: c}, nil
}

// Register registers text under subject (after the registry's own
// compatibility check) and returns its version and id; an already
// registered text returns the existing ones. Refusals are a
// *RegistryError: ErrIncompatible (409) with the registry's reason,
// ErrBadSchema (422).
func (r *Registry) Register(ctx context.Context, subject, text string) (SchemaRef, error) {
	if _, err := r.cl.RegisterSchema(ctx, subject, r.srSchema(text), -1, -1); err != nil {
		return SchemaRef{}, r.failed(classify(subject, err))
	}
	ss, err := r.cl.LookupSchema(ctx, subject, r.srSchema(text))
	if err != nil {
		return SchemaRef{}, r.failed(classify(subject, err))
	}
	return SchemaRef{Subject: subject, Version: ss.Version, ID: ss.ID}, nil
}

// classify is the one place a registry answer becomes a decision.
func classify(subject string, err error) *RegistryError {
	var re *sr.ResponseError
	if !errors.As(err, &re) { // no answer: network, timeout, canceled, a credentials file
		return &RegistryError{Subject: subject, Kind: ErrUnreachable, Err: err}
	}
	kind := ErrUnreachable // 5xx, auth (a rotated secret may fix it), anything unexpected: retry
	switch {
	case re.StatusCode == http.StatusNotFound && (re.ErrorCode == sr.ErrSubjectNotFound.Code ||
		re.ErrorCode == sr.ErrVersionNotFound.Code || re.ErrorCode == sr.ErrSchemaNotFound.Code):
		kind = ErrNoSubject
	case re.StatusCode == http.StatusNotFound:
		// A 404 without a registry code is a wrong path, not a missing
		// subject: never route events as unknown because of a typo.
		err = fmt.Errorf("%w (HTTP 404 without a registry error code: does contracts.registry.url end with the Confluent API's base path, such as /apis/ccompat/v7?)", err)
	case re.StatusCode == http.StatusConflict:
		kind = ErrIncompatible
	case re.StatusCode == http.StatusUnprocessableEntity:
		kind = ErrBadSchema
	}
	return &RegistryError{Subject: subject, Kind: kind, Err: err}
}
