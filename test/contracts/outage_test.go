package contracts_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
)

// TestRegistryOutage: after the registry process is stopped, a subject
// resolved before keeps validating and encoding with the same id, and one
// never resolved is a retryable error naming its subject (the pipeline
// waits on it; it never skips the event). It stops a registry of its own,
// so the other tests' registry stays up whatever order the tests run in.
func TestRegistryOutage(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	own, err := testenv.StartRegistry(ctx)
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(func() { _ = own.Close() })
	topic := uniqueTopic("outage")
	c := newContracts(t, own.URL(), contracts.Config{Mode: contracts.ModeEncode,
		Registry: contracts.RegistryConfig{Timeout: 2 * time.Second, Refresh: time.Nanosecond}})
	for _, typ := range []string{"OrderCreated", "OrderShipped"} {
		if _, err := c.Registry().Register(ctx, topic+"-"+typ, orderV1); err != nil {
			t.Fatalf("register %s: %v", typ, err)
		}
	}
	good := []byte(`{"id":"o1","qty":1}`)
	before, err := c.Apply(ctx, topic, "OrderCreated", good)
	if err != nil {
		t.Fatalf("before the outage: %v", err)
	}

	if err := own.Stop(ctx); err != nil {
		t.Fatalf("stop registry: %v", err)
	}
	// Refresh is 1ns: every call below asks the dead registry first.
	for range 3 {
		after, err := c.Apply(ctx, topic, "OrderCreated", good)
		if err != nil || !bytes.Equal(after.Value, before.Value) || after.Schema != before.Schema {
			t.Fatalf("known subject, registry down: %x %v, %v; want %x %v", after.Value, after.Schema, err, before.Value, before.Schema)
		}
		var v *contracts.Violation
		if _, err := c.Apply(ctx, topic, "OrderCreated", []byte(`{"id":"o1"}`)); !errors.As(err, &v) {
			t.Fatalf("known subject, registry down, bad payload: %v; want a violation still", err)
		}
	}
	// Registered but never resolved by this client: it must wait, not be
	// reported as having no subject.
	_, err = c.Apply(ctx, topic, "OrderShipped", good)
	var re *contracts.RegistryError
	if !contracts.Retryable(err) || errors.Is(err, contracts.ErrNoSubject) || !errors.As(err, &re) || re.Subject != topic+"-OrderShipped" {
		t.Fatalf("uncached subject, registry down: %v; want a retryable error naming %s-OrderShipped", err, topic)
	}
	t.Logf("uncached subject while down: %v", err)
}
