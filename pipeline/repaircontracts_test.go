package pipeline

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/contracts"
)

// TestRepairContracts: verify --repair checks a row as the stream does (a
// violation dead-lettered with the topic and contract headers, a fitting
// row framed); contracts off checks nothing; fail is an error.
func TestRepairContracts(t *testing.T) {
	ctx, log := context.Background(), slog.New(slog.DiscardHandler)
	if c := NewRepairContracts(Config{}, log); c != nil || c.Check(ctx, nil, nil, time.Time{}, nil) != nil {
		t.Fatal("contracts off: want a nil check that passes everything")
	}
	answer := func(err error) applyFunc {
		return func(_ context.Context, _, _ string, p []byte) (contracts.Result, error) {
			return contracts.Result{Value: append(contracts.AppendHeader(nil, 17), p...), Schema: testRef}, err
		}
	}
	c := NewRepairContracts(Config{Contracts: &Contracts{Apply: answer(nil), Encode: true}}, log)
	r, ev, rec := testEvent()
	if err := c.Check(ctx, r, ev, time.Time{}, rec); err != nil || rec.Topic != "t.orders" || rec.Value[0] != 0 {
		t.Fatalf("fits: %v, %s %x; want framed for t.orders", err, rec.Topic, rec.Value)
	}
	c = NewRepairContracts(Config{Contracts: &Contracts{Apply: answer(testViolation)}}, log)
	r, ev, rec = testEvent()
	if err := c.Check(ctx, r, ev, time.Time{}, rec); err != nil || rec.Topic != "dlq" || strings.Join(headerKeys(rec)[:3], ",") != "error,topic,contract_subject" {
		t.Fatalf("violation: %v, %s %v; want a contract dead letter", err, rec.Topic, headerKeys(rec))
	}
	c = NewRepairContracts(Config{Contracts: &Contracts{Apply: answer(testViolation), OnViolation: ContractFail}}, log)
	r, ev, rec = testEvent()
	if err := c.Check(ctx, r, ev, time.Time{}, rec); err == nil || !strings.Contains(err.Error(), "/qty") {
		t.Fatalf("fail: %v, want an error with the reason", err)
	}
}
