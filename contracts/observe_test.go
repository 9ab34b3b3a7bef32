package contracts

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu       sync.Mutex
	requests int
	kinds    []string
	misses   int
}

func (r *recorder) RegistryRequest(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d >= 0 {
		r.requests++
	}
}

func (r *recorder) RegistryError(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, kind)
}

func (r *recorder) CacheMiss() { r.mu.Lock(); defer r.mu.Unlock(); r.misses++ }

func (r *recorder) snapshot() (int, []string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, slices.Clone(r.kinds), r.misses
}

// TestObserver: every request is timed, a subject not in memory is a cache
// miss (once: then it is served from memory), an unknown subject and an
// outage are errors of their kind, and nothing is told before SetObserver.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	fake.SeedSchema(subject, 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, clock := newTestContracts(t, fake.URL(), Config{})
	good := []byte(`{"id":"o1","qty":1}`)
	if _, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", good); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	c.SetObserver(rec)
	for range 3 { // from memory: no request, no miss
		if _, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", good); err != nil {
			t.Fatal(err)
		}
	}
	if n, kinds, misses := rec.snapshot(); n != 0 || len(kinds) != 0 || misses != 0 {
		t.Fatalf("cached subject: %d requests, kinds %v, %d misses; want none", n, kinds, misses)
	}
	_, _ = c.Apply(ctx, "outbox.event.order", "OrderPaid", good)
	clock.advance(2 * DefaultRefresh) // the known subject is asked again: a refresh, not a miss
	fake.Close()
	_, _ = c.Apply(ctx, "outbox.event.order", "OrderCreated", good)
	c.Registry().waitRefreshes()
	_, _ = c.Apply(ctx, "outbox.event.order", "OrderShipped", good)
	n, kinds, misses := rec.snapshot()
	if want := []string{KindNoSubject, KindUnreachable, KindUnreachable}; !slices.Equal(kinds, want) {
		t.Errorf("error kinds %v, want %v", kinds, want)
	}
	if misses != 2 || n < 1 {
		t.Errorf("%d misses and %d timed requests; want 2 misses (OrderPaid, OrderShipped) and the answered request timed", misses, n)
	}
	c.SetObserver(nil)
	_, _ = c.Apply(ctx, "outbox.event.order", "OrderShipped", good)
	if _, k2, _ := rec.snapshot(); len(k2) != len(kinds) {
		t.Errorf("after SetObserver(nil) the observer is still told: %v", k2)
	}
}

func TestKindName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&RegistryError{Kind: ErrUnreachable}, KindUnreachable},
		{&RegistryError{Kind: ErrNoSubject}, KindNoSubject},
		{&RegistryError{Kind: ErrIncompatible}, KindIncompatible},
		{&RegistryError{Kind: ErrBadSchema}, KindBadSchema},
		{&Violation{}, ""},
		{nil, ""},
	} {
		if got := KindName(tc.err); got != tc.want {
			t.Errorf("KindName(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestMediaTypeAndSchemaURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f    Format
		m    Mode
		want string
	}{
		{FormatJSONSchema, ModeValidate, "application/json"},
		{FormatAvro, ModeValidate, "application/json"},
		{FormatJSONSchema, ModeEncode, "application/json"},
		{FormatAvro, ModeEncode, "application/avro"},
		{FormatProtobuf, ModeEncode, "application/protobuf"},
	} {
		if got := MediaType(tc.f, tc.m); got != tc.want {
			t.Errorf("MediaType(%s, %s) = %s, want %s", tc.f, tc.m, got, tc.want)
		}
	}
	if got := SchemaURL("http://sr/apis/ccompat/v7/", 42); got != "http://sr/apis/ccompat/v7/schemas/ids/42" {
		t.Errorf("SchemaURL = %s", got)
	}
}
