package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/outbox-cdc/outbox-cdc/contracts"
)

// TestDemoEventsAgainstContract: what the demo's contracts step prints
// depends on its events: the valid ones and pay-3 fit the contract, pay-1's
// second PaymentCaptured is the one violation, PaymentRefunded has no
// subject (published under unknown_type pass, parked here behind pay-1's
// dead letter); the Tick events of the burst and the steady stream fit
// theirs.
func TestDemoEventsAgainstContract(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fake := srfake.New()
	defer fake.Close()
	if _, _, err := fake.RegisterSchema(paymentSubject, sr.Schema{Schema: paymentSchema, Type: sr.TypeJSON}); err != nil {
		t.Fatal(err)
	}
	c, err := contracts.New(contracts.Config{Registry: contracts.RegistryConfig{URL: fake.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	var violations []string
	for _, e := range append(append([]demoEvent{}, validEvents...), laterEvents...) {
		_, err := c.Apply(ctx, paymentTopic, e.eventType, []byte(e.payload))
		var v *contracts.Violation
		switch {
		case errors.As(err, &v):
			violations = append(violations, e.aggID+" "+v.Pointer)
		case e.eventType == "PaymentRefunded" && errors.Is(err, contracts.ErrNoSubject):
		case err != nil:
			t.Fatalf("%s %s: %v", e.aggID, e.eventType, err)
		}
	}
	if len(violations) != 1 || violations[0] != "pay-1 /amount_cents" {
		t.Fatalf("violations %q, want pay-1's at /amount_cents only", violations)
	}

	// The burst's and the steady stream's payloads (as jsonb prints them)
	// fit their Tick contracts: none of them is dead-lettered.
	for subject, schema := range tickSchemas {
		if _, _, err := fake.RegisterSchema(subject, sr.Schema{Schema: schema, Type: sr.TypeJSON}); err != nil {
			t.Fatal(err)
		}
	}
	for topic, payload := range map[string]string{"outbox.event.burst": `{"i": 2499}`, "outbox.event.steady": `{}`} {
		if _, err := c.Apply(ctx, topic, "Tick", []byte(payload)); err != nil {
			t.Fatalf("%s Tick %s: %v", topic, payload, err)
		}
	}
}
