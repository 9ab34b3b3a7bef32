package contracts_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/outbox"
	writer "github.com/outbox-cdc/outbox-cdc/outbox/contracts"
)

// TestWriterCheckerAgreesWithConnector: the writer's checker (outbox/contracts,
// its own module's code) loads from Apicurio the subject the connector
// names, and refuses exactly the payloads the connector's contracts
// package calls violations, with the same subject, version, pointer and
// reason; a version registered later is used after the next load.
func TestWriterCheckerAgreesWithConnector(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	topic := uniqueTopic("writer")
	subject := topic + "-OrderCreated"
	admin := newContracts(t, registry.URL(), contracts.Config{}).Registry()
	ref, err := admin.Register(ctx, subject, orderV1)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	chk, err := writer.New(writer.Config{URL: registry.URL(), Topics: map[string]string{"order": topic}})
	if err != nil {
		t.Fatal(err)
	}
	if err := chk.Start(ctx); err != nil {
		t.Logf("first load (subjects of other tests may fail to compile): %v", err)
	}
	defer chk.Stop()

	conn := newContracts(t, registry.URL(), contracts.Config{Mode: contracts.ModeValidate})
	for _, p := range []string{`{"id":"o1","qty":2}`, `{"id":"o1","qty":"two"}`, `{"id":"o1"}`, `{"id":7,"qty":0}`, `[]`, `not json`} {
		_, cerr := conn.Apply(ctx, topic, "OrderCreated", []byte(p))
		werr := chk.Check("order", "OrderCreated", []byte(p))
		var cv *contracts.Violation
		var wv *outbox.ContractViolation
		if errors.As(cerr, &cv) != errors.As(werr, &wv) || (cerr == nil) != (werr == nil) {
			t.Fatalf("payload %s: connector %v, writer %v; want the same verdict", p, cerr, werr)
		}
		if cv != nil && (wv.Subject != cv.Schema.Subject || wv.Version != cv.Schema.Version || wv.SchemaID != cv.Schema.ID ||
			wv.Pointer != cv.Pointer || wv.Reason != cv.Reason || wv.Keyword != cv.Keyword || wv.More != cv.More) {
			t.Fatalf("payload %s: writer %+v, connector %+v; want the same subject, version, pointer and reason", p, wv, cv)
		}
		if wv != nil && (wv.Subject != ref.Subject || wv.Version != 1) {
			t.Fatalf("payload %s: writer %+v, want %v", p, wv, ref)
		}
	}
	if err := chk.Check("order", "OrderLost", []byte(`{}`)); !errors.Is(err, outbox.ErrNoContract) || errors.Is(err, writer.ErrNotLoaded) {
		t.Fatalf("unregistered type: %v; want ErrNoContract", err)
	}

	// Version 2 accepts qty 0; the writer uses it after a load.
	looser := `{"type":"object","properties":{"id":{"type":"string"},"qty":{"type":"integer"}},"required":["id","qty"]}`
	ref2, err := admin.Register(ctx, subject, looser)
	if err != nil || ref2.Version != 2 {
		t.Fatalf("register v2: %v, %v", ref2, err)
	}
	zero := []byte(`{"id":"o1","qty":0}`)
	if err := chk.Check("order", "OrderCreated", zero); err == nil {
		t.Fatal("qty 0 accepted before the load that brings version 2")
	}
	_ = chk.Refresh(ctx)
	if err := chk.Check("order", "OrderCreated", zero); err != nil {
		t.Fatalf("after the load: %v, want version 2 to accept qty 0", err)
	}
}
