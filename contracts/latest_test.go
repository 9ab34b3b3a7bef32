package contracts

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// TestApplyLatest: within the refresh interval Apply keeps the cached
// version a payload violates, ApplyLatest asks the registry and uses the
// version registered since (which Apply then uses too); with the registry
// down ApplyLatest is retryable, never the cached answer.
func TestApplyLatest(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := srfake.New()
	fake.SeedSchema(subject, 1, 7, sr.Schema{Schema: orderSchema, Type: sr.TypeJSON})
	c, _ := newTestContracts(t, fake.URL(), Config{Mode: ModeEncode})
	bad := []byte(`{"id":"o1","qty":"two"}`)
	var v *Violation
	if _, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", bad); !errors.As(err, &v) || v.Schema.Version != 1 {
		t.Fatalf("Apply against version 1: %v, want a violation of version 1", err)
	}
	fake.SeedSchema(subject, 2, 8, sr.Schema{Schema: `{"type":"object"}`, Type: sr.TypeJSON})
	if _, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", bad); !errors.As(err, &v) {
		t.Fatalf("Apply within the refresh interval: %v, want the cached version's violation", err)
	}
	res, err := c.ApplyLatest(ctx, "outbox.event.order", "OrderCreated", bad)
	if err != nil || res.Schema.Version != 2 || string(res.Value) != string(AppendHeader(nil, 8))+string(bad) {
		t.Fatalf("ApplyLatest = %x %v, %v; want version 2 framed with id 8", res.Value, res.Schema, err)
	}
	if res, err := c.Apply(ctx, "outbox.event.order", "OrderCreated", bad); err != nil || res.Schema.ID != 8 {
		t.Fatalf("Apply after ApplyLatest = %v, %v; want version 2 in use", res.Schema, err)
	}
	fake.Close()
	if _, err := c.ApplyLatest(ctx, "outbox.event.order", "OrderCreated", bad); !Retryable(err) {
		t.Fatalf("ApplyLatest with the registry down: %v, want retryable", err)
	}
}
