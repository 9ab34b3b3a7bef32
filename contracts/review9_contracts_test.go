package contracts

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// review9: each test has its own deadline (testCtx: 30 s).

// TestReview9AvroStepBudgetDeadLettersFittingEvent: the converter's step
// budget (maxSteps, 1<<20) counts the values visited by union trials too, so
// a payload of about 540 KB (under Kafka's default 1 MB limit) that fits its
// Avro schema is a *Violation ("a payload too complex to match"): the event
// is dead-lettered and its aggregate quarantined, and every redrive refuses
// it again (the budget is the same). JSON Schema accepts the same payload.
func TestReview9AvroStepBudgetDeadLettersFittingEvent(t *testing.T) {
	t.Parallel()
	branch := func(name string) string {
		return `{"type":"record","name":"` + name + `","fields":[` +
			`{"name":"vals","type":{"type":"array","items":"long"}},` +
			`{"name":"tag","type":{"type":"enum","name":"Tag` + name + `","symbols":["` + strings.ToLower(name) + `"]}}]}`
	}
	s := avroOf(t, `{"type":"array","items":[`+branch("A")+`,`+branch("B")+`,`+branch("C")+`,`+branch("D")+`]}`)
	const n = 270_000
	payload := []byte(`{"v":[{"vals":[` + strings.Repeat("1,", n-1) + `1],"tag":"d"}]}`)
	if len(payload) > 1<<20 {
		t.Fatalf("payload %d bytes: the test means one under 1 MiB", len(payload))
	}
	done := make(chan error, 1)
	go func() { done <- s.Validate(payload) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a %d-byte payload that fits its schema (branch D, %d longs): %v; want it to pass (it is dead-lettered and can never be redriven)", len(payload), n, err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Validate did not return within 60 s")
	}
}

// TestReview9RegistryWipedStaleID: a registry whose storage was lost and
// refilled (Apicurio in memory restarted, a registry restored from another
// backup) answers the same (subject, version) with another id and another
// text, and the old id now names another subject's schema. The cache keeps
// framing with the old id and checking against the old text: a consumer's
// deserializer fetches the frame's id and decodes the body with a schema
// that is not the one it was encoded with. Expected: the frame's id names, in
// the registry, the schema the payload was checked and encoded with (or the
// subject waits, ErrBadSchema); never an id the registry gives to other text.
func TestReview9RegistryWipedStaleID(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	fake.SeedSchema(subject, 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, clock := newTestContracts(t, fake.URL(), Config{Mode: ModeEncode})
	good := []byte(`{"id":"o1","qty":1}`)
	if _, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", good); err != nil {
		t.Fatal(err)
	}
	// The registry loses its storage; the schemas are registered again in
	// another order: id 7 is now another subject's.
	fake.Reset()
	other := `{"type":"object","properties":{"sku":{"type":"string"}},"required":["sku"]}`
	fake.SeedSchema("outbox.event.stock-StockMoved", 1, 7, sr.Schema{Schema: other, Type: sr.TypeJSON})
	fake.SeedSchema(subject, 1, 12, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	clock.advance(2 * DefaultRefresh)
	// The first event after the interval starts the refresh and keeps the
	// version in use (a cache's window); once the refresh answered, the
	// registry's id is used.
	_, _ = c.Apply(ctx, "outbox.event.order", "OrderCreated", good)
	c.Registry().waitRefreshes()
	res, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", good)
	if err != nil {
		return // waiting (or refusing) is acceptable
	}
	cl, cerr := sr.NewClient(sr.URLs(fake.URL()))
	if cerr != nil {
		t.Fatal(cerr)
	}
	id, _, perr := ParseHeader(res.Value)
	if perr != nil {
		t.Fatal(perr)
	}
	got, ferr := cl.SchemaByID(ctx, id)
	if ferr != nil {
		t.Fatalf("the frame's id %d is not in the registry: %v", id, ferr)
	}
	if got.Schema != c.Registry().versions[versionKey{subject, 1}].Text {
		t.Fatalf("the record is framed with id %d, which the registry now answers as %q (another subject's schema); "+
			"the payload was checked against %q", id, got.Schema, c.Registry().versions[versionKey{subject, 1}].Text)
	}
}

// TestReview9CachedSubjectAnswered404: a subject resolved and in use, whose
// refresh the registry answers "subject not found" (40401: a registry
// restarted empty, a node not caught up, a subject deleted by mistake), is
// at once ErrNoSubject for every event of the type: contracts.unknown_type
// quarantine dead-letters events of a type that has a contract in the cache
// and quarantines each of their aggregates (pass publishes them unchecked,
// fail stops), event after event, since nothing is cached for the answer.
// docs/contracts.md: "known subjects are cached and keep flowing".
func TestReview9CachedSubjectAnswered404(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	fake.SeedSchema(subject, 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, clock := newTestContracts(t, fake.URL(), Config{})
	good := []byte(`{"id":"o1","qty":1}`)
	if _, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", good); err != nil {
		t.Fatal(err)
	}
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if strings.Contains(r.URL.Path, "/subjects/") {
			w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code":40401,"message":"Subject '` + subject + `' not found."}`))
			return true
		}
		return false
	})
	clock.advance(2 * DefaultRefresh)
	_, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", good)
	if errors.Is(err, ErrNoSubject) {
		t.Fatalf("a cached subject answered 40401 on refresh: %v; its events become unknown_type (dead-lettered and "+
			"quarantined under unknown_type quarantine); want the cached version kept (or a wait)", err)
	}
}

// TestReview9AutoRegisteredThenLookup404: resolution auto registers the
// local schema, then looks it up for its version; a lookup answered 40403
// ("schema not found": a follower not caught up with the leader that took
// the registration, a registry that normalises the text on registration)
// is classified ErrNoSubject, so the event of a type whose schema was just
// registered is dead-lettered as an unknown type, and the answer is kept
// as "absent" for the refresh interval.
func TestReview9AutoRegisteredThenLookup404(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fake := srfake.New()
	t.Cleanup(fake.Close)
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/subjects/") && !strings.HasSuffix(r.URL.Path, "/versions") {
			w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
			return true
		}
		return false
	})
	local := func(s string) (string, bool) { return orderSchema, s == subject }
	c, _ := newTestContracts(t, fake.URL(), Config{Resolution: ResolutionAuto, Schemas: local})
	_, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", []byte(`{"id":"o1","qty":1}`))
	if !fake.SubjectExists(subject) {
		t.Fatalf("the registration did not happen: %v", err)
	}
	if errors.Is(err, ErrNoSubject) {
		t.Fatalf("registered, then the lookup answered 40403: %v; the event is routed as an unknown type "+
			"(dead-lettered under unknown_type quarantine) though its subject exists; want a wait (retryable)", err)
	}
}

// TestReview9SlowRegistryStallsKnownTypes: a registry that does not answer
// (a network partition that drops packets: every request runs to the
// timeout, 5 s by default) is asked, on the processor's goroutine, for each
// cached subject once per refresh interval. Each known type's first event
// after its interval then holds the whole stream for the full timeout: with
// S subjects that is S × timeout per interval (12 subjects × 5 s = the whole
// minute), so past a dozen event types nothing flows at all although every
// type is cached. docs: "known types keep flowing". Scaled down here:
// timeout 200 ms, 20 cached subjects.
func TestReview9SlowRegistryStallsKnownTypes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	const n = 20
	types := make([]string, n)
	for i := range types {
		types[i] = "T" + string(rune('A'+i))
		fake.SeedSchema(types[i], 1, 100+i, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	}
	c, clock := newTestContracts(t, fake.URL(), Config{Strategy: StrategyRecord,
		Registry: RegistryConfig{Timeout: 200 * time.Millisecond}})
	for _, et := range types {
		if _, err := c.Apply(ctx, "t", et, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	fake.Intercept(func(w http.ResponseWriter, r *http.Request) bool {
		select { // black hole: no answer until the client gives up
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return true
	})
	clock.advance(DefaultRefresh)
	start := time.Now()
	for _, et := range types { // one event of each cached type
		if _, err := c.Apply(ctx, "t", et, []byte(`{}`)); err != nil {
			t.Fatalf("%s: %v", et, err)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("%d events of %d cached types took %v with the registry unresponsive (%v per type, on the processor's goroutine); "+
			"at the default 5 s timeout that is %v per %v refresh interval: the stream stops although every type is cached",
			n, n, took.Round(time.Millisecond), (took / n).Round(time.Millisecond), time.Duration(n)*5*time.Second, DefaultRefresh)
	}
}
