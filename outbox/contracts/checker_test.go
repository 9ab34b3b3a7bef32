package contracts

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/outbox-cdc/outbox-cdc/outbox"
)

const orderSchema = `{
  "type": "object",
  "properties": {"id": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
  "required": ["id", "qty"]
}`

const protoSchema = `syntax = "proto3"; message Order { string id = 1; }`

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fakeRegistry is srfake with the subjects these tests use, counting the
// requests it serves.
func fakeRegistry(t *testing.T) (*srfake.Registry, *atomic.Int64) {
	t.Helper()
	fake := srfake.New()
	t.Cleanup(fake.Close)
	fake.SeedSchema("outbox.event.order-OrderCreated", 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	fake.SeedSchema("crm.customers-CustomerRegistered", 2, 8, sr.Schema{Schema: `{"type":"object","required":["name"]}`, Type: sr.TypeJSON})
	fake.SeedSchema("OrderShipped", 1, 9, sr.Schema{Schema: `{"type":"object","properties":{"at":{"type":"string"}}}`, Type: sr.TypeJSON})
	fake.SeedSchema("outbox.event.order-value", 1, 10, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	fake.SeedSchema("outbox.event.order-OrderProto", 1, 11, sr.Schema{Schema: protoSchema, Type: sr.TypeProtobuf})
	fake.SeedSchema("someone.else-Thing", 1, 12, sr.Schema{Schema: `{}`, Type: sr.TypeJSON})
	var n atomic.Int64
	fake.Intercept(func(http.ResponseWriter, *http.Request) bool { n.Add(1); return false })
	return fake, &n
}

func newChecker(t *testing.T, url string, cfg Config) *Checker {
	t.Helper()
	cfg.URL = url
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// TestCheck: after a load, each event is judged by its subject's latest
// version as the connector names the subject; a violation carries the
// subject, the version, the id and the JSON pointer; a type without a
// subject follows UnknownType; a schema that is not JSON Schema is refused
// whatever UnknownType says.
func TestCheck(t *testing.T) {
	fake, _ := fakeRegistry(t)
	topics := map[string]string{"customer": "crm.customers"}
	for _, tc := range []struct {
		name                 string
		cfg                  Config
		aggType, eventType   string
		payload              string
		wantErr              error // nil: fits
		subject, pointer, in string
		version              int
	}{
		{name: "fits", aggType: "order", eventType: "OrderCreated", payload: `{"id":"o1","qty":2}`},
		{name: "wrong type", aggType: "order", eventType: "OrderCreated", payload: `{"id":"o1","qty":"two"}`,
			wantErr: outbox.ErrInvalidEvent, subject: "outbox.event.order-OrderCreated", version: 1, pointer: "/qty", in: "got string, want integer"},
		{name: "missing required", aggType: "order", eventType: "OrderCreated", payload: `{"id":"o1"}`,
			wantErr: outbox.ErrInvalidEvent, subject: "outbox.event.order-OrderCreated", version: 1, pointer: "/qty", in: "required property missing"},
		{name: "below minimum", aggType: "order", eventType: "OrderCreated", payload: `{"id":"o1","qty":0}`,
			wantErr: outbox.ErrInvalidEvent, subject: "outbox.event.order-OrderCreated", version: 1, pointer: "/qty", in: "minimum"},
		{name: "not JSON", aggType: "order", eventType: "OrderCreated", payload: `\x00raw`,
			wantErr: outbox.ErrInvalidEvent, subject: "outbox.event.order-OrderCreated", version: 1, pointer: "", in: "not JSON"},
		{name: "unknown type refused", aggType: "order", eventType: "OrderLost", payload: `{}`,
			wantErr: outbox.ErrNoContract, in: `"outbox.event.order-OrderLost" is not registered`},
		{name: "unknown type passed", cfg: Config{UnknownType: UnknownPass}, aggType: "order", eventType: "OrderLost", payload: `{}`},
		{name: "fixed topic wins over the template", cfg: Config{Topics: topics}, aggType: "customer", eventType: "CustomerRegistered",
			payload: `{}`, wantErr: outbox.ErrInvalidEvent, subject: "crm.customers-CustomerRegistered", version: 2, pointer: "/name"},
		{name: "without the fixed topic", aggType: "customer", eventType: "CustomerRegistered", payload: `{}`,
			wantErr: outbox.ErrNoContract, in: "outbox.event.customer-CustomerRegistered"},
		{name: "record strategy", cfg: Config{Strategy: StrategyRecord}, aggType: "order", eventType: "OrderShipped",
			payload: `{"at":1}`, wantErr: outbox.ErrInvalidEvent, subject: "OrderShipped", version: 1, pointer: "/at"},
		{name: "topic strategy", cfg: Config{Strategy: StrategyTopic}, aggType: "order", eventType: "Anything",
			payload: `[]`, wantErr: outbox.ErrInvalidEvent, subject: "outbox.event.order-value", version: 1, pointer: "", in: "want object"},
		{name: "another template", cfg: Config{TopicTemplate: "{aggregate_type}-events"}, aggType: "order", eventType: "OrderCreated",
			payload: `{}`, wantErr: outbox.ErrNoContract, in: "order-events-OrderCreated"},
		{name: "protobuf subject refused even with pass", cfg: Config{UnknownType: UnknownPass}, aggType: "order", eventType: "OrderProto",
			payload: `{}`, wantErr: ErrBadSchema, in: "JSON Schema only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker(t, fake.URL(), tc.cfg)
			_ = c.Refresh(testCtx(t)) // the protobuf subject is an error of the load; the rest loads
			err := c.Check(tc.aggType, tc.eventType, []byte(tc.payload))
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Check: %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.in) {
				t.Fatalf("Check: %v, want %v containing %q", err, tc.wantErr, tc.in)
			}
			var v *outbox.ContractViolation
			if errors.As(err, &v) != (tc.subject != "") {
				t.Fatalf("Check: %v; violation %v, want one: %v", err, v, tc.subject != "")
			}
			if v != nil && (v.Subject != tc.subject || v.Version != tc.version || v.Pointer != tc.pointer || v.EventType != tc.eventType || v.SchemaID == 0) {
				t.Fatalf("violation %+v, want subject %s version %d pointer %q", v, tc.subject, tc.version, tc.pointer)
			}
		})
	}
}

// TestNotLoaded: before a load succeeds every type is unknown: refused with
// ErrNoContract and ErrNotLoaded (naming the registry's error), or passed.
func TestNotLoaded(t *testing.T) {
	c := newChecker(t, "http://127.0.0.1:1/apis/ccompat/v7", Config{Timeout: time.Second})
	if err := c.Check("order", "OrderCreated", []byte(`{}`)); !errors.Is(err, outbox.ErrNoContract) || !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("before any load: %v, want ErrNoContract and ErrNotLoaded", err)
	}
	if err := c.Refresh(testCtx(t)); err == nil {
		t.Fatal("Refresh against a closed port succeeded")
	}
	err := c.Check("order", "OrderCreated", []byte(`{}`))
	if !errors.Is(err, ErrNotLoaded) || !strings.Contains(err.Error(), "list subjects") {
		t.Fatalf("after a failed load: %v, want ErrNotLoaded naming the failure", err)
	}
	pass := newChecker(t, "http://127.0.0.1:1/apis/ccompat/v7", Config{UnknownType: UnknownPass})
	if err := pass.Check("order", "OrderCreated", []byte(`{}`)); err != nil {
		t.Fatalf("pass before any load: %v", err)
	}
}

// TestCheckSendsNothing: Check answers from memory, however many events;
// a load fetches only the subjects the writer's events can name.
func TestCheckSendsNothing(t *testing.T) {
	fake, requests := fakeRegistry(t)
	c := newChecker(t, fake.URL(), Config{Topics: map[string]string{"customer": "crm.customers"}})
	_ = c.Refresh(testCtx(t))
	// The list, then outbox.event.order-{OrderCreated,value,OrderProto} and
	// crm.customers-CustomerRegistered; not OrderShipped nor someone.else-Thing.
	if n := requests.Load(); n != 5 {
		t.Fatalf("a load sent %d requests, want 5", n)
	}
	for range 1000 {
		_ = c.Check("order", "OrderCreated", []byte(`{"id":"o1","qty":2}`))
		_ = c.Check("order", "Unknown", []byte(`{}`))
	}
	if n := requests.Load(); n != 5 {
		t.Fatalf("Check sent %d requests", n-5)
	}
}

// TestRefresh: a new version is used after the next load; a subject deleted
// from the registry becomes unknown; while the registry fails, the versions
// of the last load stay in use.
func TestRefresh(t *testing.T) {
	ctx := testCtx(t)
	fake, _ := fakeRegistry(t)
	c := newChecker(t, fake.URL(), Config{})
	_ = c.Refresh(ctx)
	looser := `{"type":"object","properties":{"qty":{"type":"integer"}},"required":["qty"]}`
	if _, _, err := fake.RegisterSchema("outbox.event.order-OrderCreated", sr.Schema{Schema: looser, Type: sr.TypeJSON}); err != nil {
		t.Fatal(err)
	}
	noID := []byte(`{"qty":0}`)
	var v *outbox.ContractViolation
	if err := c.Check("order", "OrderCreated", noID); !errors.As(err, &v) || v.Version != 1 {
		t.Fatalf("before the load: %v, want a violation of version 1", err)
	}
	_ = c.Refresh(ctx)
	if err := c.Check("order", "OrderCreated", noID); err != nil {
		t.Fatalf("after the load: %v, want version 2 to accept it", err)
	}

	fail := atomic.Bool{}
	fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		if fail.Load() {
			http.Error(w, `{"error_code":50001,"message":"down"}`, http.StatusInternalServerError)
		}
		return fail.Load()
	})
	fail.Store(true)
	if err := c.Refresh(ctx); err == nil {
		t.Fatal("Refresh while the registry fails: nil error")
	}
	if err := c.Check("order", "OrderCreated", noID); err != nil {
		t.Fatalf("during the outage: %v, want version 2 still in use", err)
	}
	fail.Store(false)
	cl, err := sr.NewClient(sr.URLs(fake.URL()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.DeleteSubject(ctx, "outbox.event.order-OrderCreated", sr.SoftDelete); err != nil {
		t.Fatal(err)
	}
	_ = c.Refresh(ctx)
	if err := c.Check("order", "OrderCreated", noID); !errors.Is(err, outbox.ErrNoContract) || errors.Is(err, ErrNotLoaded) {
		t.Fatalf("after the subject's deletion: %v, want ErrNoContract (not registered)", err)
	}
}

// TestStartStop: Start loads before it returns, the goroutine loads again
// every Refresh and reports failures, Stop ends it.
func TestStartStop(t *testing.T) {
	fake, requests := fakeRegistry(t)
	errs := make(chan error, 10)
	c := newChecker(t, fake.URL(), Config{Refresh: 20 * time.Millisecond, OnRefreshError: func(err error) {
		select {
		case errs <- err:
		default:
		}
	}})
	if err := c.Start(testCtx(t)); err == nil || !errors.Is(err, ErrBadSchema) {
		t.Fatalf("Start: %v, want the protobuf subject's ErrBadSchema", err)
	}
	if err := c.Check("order", "OrderCreated", []byte(`{"id":"o1","qty":2}`)); err != nil {
		t.Fatalf("after Start: %v", err)
	}
	if err := c.Start(testCtx(t)); err == nil {
		t.Fatal("a second Start succeeded")
	}
	select {
	case err := <-errs:
		if !errors.Is(err, ErrBadSchema) {
			t.Fatalf("OnRefreshError: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no refresh within 10s")
	}
	c.Stop()
	n := requests.Load()
	time.Sleep(100 * time.Millisecond)
	if requests.Load() != n {
		t.Fatal("requests after Stop")
	}
	c.Stop() // a second Stop is a no-op
}

// TestNewRefuses: settings the writer cannot honour are refused at New.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "URL is required"},
		{Config{URL: "http://r", Strategy: "topic_name"}, "subject strategy"},
		{Config{URL: "http://r", TopicTemplate: "{column:tenant}.{aggregate_type}"}, "list the aggregate types in Topics"},
		{Config{URL: "http://r", UnknownType: "quarantine"}, "use refuse or pass"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// fakeTx records Exec calls; every other pgx.Tx method panics (nil embed).
type fakeTx struct {
	pgx.Tx
	sql []string
}

func (f *fakeTx) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	f.sql = append(f.sql, sql)
	return pgconn.NewCommandTag("INSERT 0 1"), nil
}

// TestWriterRefusesBeforeInsert: a Writer with the checker inserts a fitting
// event and nothing for a violating one.
func TestWriterRefusesBeforeInsert(t *testing.T) {
	fake, _ := fakeRegistry(t)
	c := newChecker(t, fake.URL(), Config{})
	_ = c.Refresh(testCtx(t))
	w, err := outbox.New(outbox.Config{Contracts: c})
	if err != nil {
		t.Fatal(err)
	}
	tx := &fakeTx{}
	ctx := context.Background()
	if err := w.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o1", EventType: "OrderCreated",
		Payload: map[string]any{"id": "o1", "qty": 1}}); err != nil || len(tx.sql) != 1 {
		t.Fatalf("fitting event: %v, %d statements", err, len(tx.sql))
	}
	err = w.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "o1", EventType: "OrderCreated",
		Payload: map[string]any{"id": "o1", "qty": "one"}})
	var v *outbox.ContractViolation
	if !errors.As(err, &v) || v.Subject != "outbox.event.order-OrderCreated" || v.Version != 1 || v.Pointer != "/qty" || len(tx.sql) != 1 {
		t.Fatalf("violating event: %v, %d statements; want a violation at /qty and no INSERT", err, len(tx.sql))
	}
}
