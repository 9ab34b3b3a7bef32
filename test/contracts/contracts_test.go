package contracts_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/twmb/franz-go/pkg/sr"
)

// TestLookupValidatesAndEncodes: a schema registered under the subject is
// found by lookup; a good payload passes (validate) or is framed with the
// id Apicurio gave it (encode), a bad one is a violation naming the JSON
// pointer; a type without a subject is ErrNoSubject, not a violation nor
// an outage.
func TestLookupValidatesAndEncodes(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	topic := uniqueTopic("orders")
	subject := topic + "-OrderCreated"
	admin := newContracts(t, registry.URL(), contracts.Config{}).Registry()
	ref, err := admin.Register(ctx, subject, orderV1)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	if ref.Version != 1 || ref.ID < 0 {
		t.Fatalf("registered %v, want version 1", ref)
	}

	good := []byte(`{"id":"o1","qty":2}`)
	val := newContracts(t, registry.URL(), contracts.Config{Mode: contracts.ModeValidate})
	res, err := val.Apply(ctx, topic, "OrderCreated", good)
	if err != nil || !bytes.Equal(res.Value, good) || res.Schema != ref {
		t.Fatalf("validate good: %q %v, %v; want the payload under %v", res.Value, res.Schema, err, ref)
	}
	_, err = val.Apply(ctx, topic, "OrderCreated", []byte(`{"id":"o1","qty":"two"}`))
	var v *contracts.Violation
	if !errors.As(err, &v) || v.Pointer != "/qty" || !strings.Contains(v.Reason, "want integer") || v.Schema != ref {
		t.Fatalf("validate bad: %v; want a violation at /qty under %v", err, ref)
	}
	if _, err = val.Apply(ctx, topic, "OrderCreated", []byte(`{"id":"o1"}`)); !errors.As(err, &v) || v.Pointer != "/qty" {
		t.Fatalf("missing required: %v; want a violation at /qty", err)
	}

	enc := newContracts(t, registry.URL(), contracts.Config{Mode: contracts.ModeEncode})
	res, err = enc.Apply(ctx, topic, "OrderCreated", good)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	id, body, err := contracts.ParseHeader(res.Value)
	if err != nil || id != ref.ID || !bytes.Equal(body, good) {
		t.Fatalf("encoded %x: id %d body %q (%v); want id %d and the payload", res.Value, id, body, err, ref.ID)
	}
	// A consumer finds the schema by the framed id.
	text, err := admin.Client().SchemaTextByID(ctx, id)
	if err != nil || !strings.Contains(text, `"qty"`) {
		t.Fatalf("schema by the framed id %d: %q, %v", id, text, err)
	}

	_, err = val.Apply(ctx, topic, "OrderLost", good)
	if !errors.Is(err, contracts.ErrNoSubject) || contracts.Retryable(err) || errors.As(err, &v) ||
		!strings.Contains(err.Error(), topic+"-OrderLost") {
		t.Fatalf("unregistered type: %v; want ErrNoSubject naming %s-OrderLost", err, topic)
	}
}

// TestAutoRegisters: resolution auto registers the local schema on first
// use, and Apicurio then serves it to a lookup client.
func TestAutoRegisters(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	topic := uniqueTopic("auto")
	subject := topic + "-OrderCreated"
	local := func(s string) (string, bool) { return orderV1, s == subject }
	auto := newContracts(t, registry.URL(), contracts.Config{Resolution: contracts.ResolutionAuto, Schemas: local})
	res, err := auto.Apply(ctx, topic, "OrderCreated", []byte(`{"id":"o1","qty":1}`))
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	got, err := auto.Registry().Client().SchemaByVersion(ctx, subject, -1)
	if err != nil || got.ID != res.Schema.ID || got.Version != res.Schema.Version {
		t.Fatalf("registry after auto: %+v, %v; want %v", got, err, res.Schema)
	}
	lookup := newContracts(t, registry.URL(), contracts.Config{})
	if res2, err := lookup.Apply(ctx, topic, "OrderCreated", []byte(`{"id":"o1","qty":1}`)); err != nil || res2.Schema != res.Schema {
		t.Fatalf("lookup after auto: %v, %v; want %v", res2.Schema, err, res.Schema)
	}
}

// TestIncompatibleVersionRefused: under BACKWARD, a new version adding a
// required field is refused by Apicurio (409) and reported as
// ErrIncompatible with the registry's reason; the subject keeps version 1.
func TestIncompatibleVersionRefused(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	subject := uniqueTopic("compat") + "-OrderCreated"
	reg := newContracts(t, registry.URL(), contracts.Config{}).Registry()
	if _, err := reg.Register(ctx, subject, orderV1); err != nil {
		t.Fatalf("register v1: %v", err)
	}
	for _, r := range reg.Client().SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, subject) {
		if r.Err != nil {
			t.Fatalf("set BACKWARD: %v", r.Err)
		}
	}
	_, err := reg.Register(ctx, subject, orderV2)
	var re *contracts.RegistryError
	if !errors.Is(err, contracts.ErrIncompatible) || contracts.Retryable(err) || !errors.As(err, &re) || re.Subject != subject {
		t.Fatalf("incompatible v2: %v; want ErrIncompatible naming %s", err, subject)
	}
	var resp *sr.ResponseError
	if !errors.As(err, &resp) || resp.StatusCode != 409 || !strings.Contains(err.Error(), "REQUIRED_PROPERTIES") {
		t.Fatalf("incompatible v2: %v; want the registry's 409 and its reason", err)
	}
	t.Logf("refused as expected: %v", err)
	s, err := reg.Resolve(ctx, subject)
	if err != nil || s.Ref.Version != 1 {
		t.Fatalf("after the refusal: %v, %v; want version 1", s, err)
	}
}
