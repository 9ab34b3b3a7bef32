package contracts

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// fakeClock is the Registry's clock in these tests: the refresh interval
// passes when the test says so.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestContracts(t *testing.T, url string, cfg Config) (*Contracts, *fakeClock) {
	t.Helper()
	cfg.Registry.URL = url
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	c.reg.now = clock.now
	return c, clock
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

const subject = "outbox.event.order-OrderCreated"

// TestKnownSubjectSurvivesOutage: a resolved subject keeps its version and
// id while the registry is down, across refresh intervals; a subject never
// resolved is a retryable error naming it, distinct from "no subject".
func TestKnownSubjectSurvivesOutage(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	fake.SeedSchema(subject, 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, clock := newTestContracts(t, fake.URL(), Config{Mode: ModeEncode})
	good := []byte(`{"id":"o1","qty":1}`)
	res, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", good)
	if err != nil || string(res.Value) != string(AppendHeader(nil, 7))+string(good) {
		t.Fatalf("Apply = %x, %v; want id 7 and the payload", res.Value, err)
	}
	_, err = c.Apply(ctx, "outbox.event.order", "OrderPaid", good)
	if !errors.Is(err, ErrNoSubject) || Retryable(err) || !strings.Contains(err.Error(), "outbox.event.order-OrderPaid") {
		t.Fatalf("unregistered subject: %v; want ErrNoSubject naming it, not retryable", err)
	}
	fake.Close()
	for range 3 {
		clock.advance(2 * DefaultRefresh)
		res, err = c.Apply(ctx, "outbox.event.order", "OrderCreated", good)
		if err != nil || res.Schema != (SchemaRef{Subject: subject, Version: 1, ID: 7}) {
			t.Fatalf("registry down: Apply = %v, %v; want the cached version 1 id 7", res.Schema, err)
		}
	}
	_, err = c.Apply(ctx, "outbox.event.order", "OrderShipped", good)
	var re *RegistryError
	if !Retryable(err) || errors.Is(err, ErrNoSubject) || !errors.As(err, &re) || re.Subject != "outbox.event.order-OrderShipped" {
		t.Fatalf("uncached subject with the registry down: %v; want a retryable RegistryError naming it", err)
	}
}

// TestVersionFollowsRegistry: after the refresh interval the latest version
// is used, once the background refresh (refreshInUse) has answered; the
// events meanwhile keep the version in use. A registry that answers a
// version with another id (its storage refilled, restored from another
// backup) is followed too: consumers decode by the frame's id (review9).
func TestVersionFollowsRegistry(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	fake.SeedSchema(subject, 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, clock := newTestContracts(t, fake.URL(), Config{})
	reg := c.Registry()
	resolve := func() SchemaRef {
		t.Helper()
		s, err := reg.Resolve(ctx, subject)
		if err != nil {
			t.Fatalf("Resolve: %v", err)
		}
		return s.Ref
	}
	if got := resolve(); got.Version != 1 || got.ID != 7 {
		t.Fatalf("first resolve: %v", got)
	}
	fake.SeedSchema(subject, 2, 8, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	if got := resolve(); got.Version != 1 {
		t.Fatalf("within the refresh interval: %v, want version 1 still", got)
	}
	clock.advance(DefaultRefresh)
	if got := resolve(); got.Version != 1 {
		t.Fatalf("as the refresh starts: %v, want version 1 still (the refresh runs in the background)", got)
	}
	reg.waitRefreshes()
	if got := resolve(); got.Version != 2 || got.ID != 8 {
		t.Fatalf("after the refresh: %v, want version 2 id 8", got)
	}
	fake.Reset()
	fake.SeedSchema(subject, 2, 99, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	clock.advance(DefaultRefresh)
	resolve()
	reg.waitRefreshes()
	if got := resolve(); got.Version != 2 || got.ID != 99 {
		t.Fatalf("same version, new id from the registry: %v, want id 99", got)
	}
}

// waitRefreshes waits for the background refreshes started so far.
func (r *Registry) waitRefreshes() { r.refreshes.Wait() }

// TestAutoRegisters: resolution auto registers the local schema on first
// use and uses its version; a subject without a local schema is looked up.
func TestAutoRegisters(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	local := func(s string) (string, bool) { return orderSchema, s == subject }
	c, _ := newTestContracts(t, fake.URL(), Config{Resolution: ResolutionAuto, Schemas: local})
	res, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", []byte(`{"id":"o1","qty":1}`))
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	got, ok := fake.GetSchema(subject, res.Schema.Version)
	if !ok || got.ID != res.Schema.ID || got.Schema.Schema != orderSchema {
		t.Fatalf("registered %v (found %v); want the local schema under %v", got, ok, res.Schema)
	}
	if _, err := c.Apply(ctx, "outbox.event.order", "Other", []byte(`{}`)); !errors.Is(err, ErrNoSubject) {
		t.Fatalf("no local schema and none registered: %v, want ErrNoSubject", err)
	}
}

// TestClassify: each registry answer becomes one decision.
func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status, code int
		kind         error
		inMessage    string
	}{
		{404, 40401, ErrNoSubject, ""},
		{404, 40402, ErrNoSubject, ""},
		{404, 0, ErrUnreachable, "/apis/ccompat/v7"},
		{409, 409, ErrIncompatible, ""},
		{422, 42201, ErrBadSchema, ""},
		{401, 0, ErrUnreachable, ""},
		{500, 50001, ErrUnreachable, ""},
		{503, 0, ErrUnreachable, ""},
	} {
		err := classify("s", &sr.ResponseError{StatusCode: tc.status, ErrorCode: tc.code, Message: "m"})
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.inMessage) || Retryable(err) != (tc.kind == ErrUnreachable) {
			t.Errorf("HTTP %d code %d: %v; want %v", tc.status, tc.code, err, tc.kind)
		}
	}
	if err := classify("s", context.DeadlineExceeded); !Retryable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timeout: %v, want retryable and still a deadline", err)
	}
}

// TestCredentialFiles: the token and the basic credentials are read from
// their files at each request.
func TestCredentialFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("reg:pw"))
	for _, tc := range []struct {
		auth string
		cfg  RegistryConfig
	}{
		{"Bearer tok", RegistryConfig{TokenFile: write("token", "tok")}},
		{basic, RegistryConfig{UsernameFile: write("user", "reg"), PasswordFile: write("pw", "pw")}},
	} {
		fake := srfake.New(srfake.WithAuth(tc.auth))
		fake.SeedSchema(subject, 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
		c, _ := newTestContracts(t, fake.URL(), Config{Registry: tc.cfg})
		_, err := c.Apply(testCtx(t), "outbox.event.order", "OrderCreated", []byte(`{"id":"o1","qty":1}`))
		fake.Close()
		if err != nil {
			t.Fatalf("with %q: %v", tc.auth, err)
		}
	}
}

// TestNewRefuses: a format this version does not know, and settings New cannot use.
func TestNewRefuses(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{Mode: "transcode", Registry: RegistryConfig{URL: "http://127.0.0.1:1"}},
		{Strategy: "TopicNameStrategy", Registry: RegistryConfig{URL: "http://127.0.0.1:1"}},
		{Resolution: "latest", Registry: RegistryConfig{URL: "http://127.0.0.1:1"}},
		{Registry: RegistryConfig{URL: "127.0.0.1:8080"}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted it", cfg)
		}
	}
	_, err := New(Config{Format: "thrift", Registry: RegistryConfig{URL: "http://127.0.0.1:1"}})
	if err == nil || !strings.Contains(err.Error(), "not yet supported") {
		t.Errorf("thrift: %v, want \"not yet supported\"", err)
	}
}

// TestAbsentSubjectCached: a subject the registry says has no version is
// not asked again before the refresh interval (an event type without a
// contract, under unknown_type pass or quarantine, costs no request per
// event: make demo's burst ran at 447 events/s end to end before); one
// registered meanwhile is found after it.
func TestAbsentSubjectCached(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	c, clock := newTestContracts(t, fake.URL(), Config{Strategy: StrategyRecord})
	if _, err := c.Apply(ctx, "t", "Late", []byte(`{}`)); !errors.Is(err, ErrNoSubject) {
		t.Fatalf("first apply: %v, want ErrNoSubject", err)
	}
	fake.SeedSchema("Late", 1, 3, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	clock.advance(DefaultRefresh / 2)
	if _, err := c.Apply(ctx, "t", "Late", []byte(`{}`)); !errors.Is(err, ErrNoSubject) {
		t.Fatalf("within the interval: %v, want the cached ErrNoSubject (no request)", err)
	}
	clock.advance(DefaultRefresh)
	res, err := c.Apply(ctx, "t", "Late", []byte(`{}`))
	if err != nil || res.Schema.ID != 3 {
		t.Fatalf("after the interval: %+v, %v; want the registered version (id 3)", res.Schema, err)
	}
}
