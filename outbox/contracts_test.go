package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// stubChecker refuses payloads holding "bad" and records what it was asked.
type stubChecker struct{ calls []string }

func (s *stubChecker) Check(aggType, eventType string, payload []byte) error {
	s.calls = append(s.calls, aggType+"/"+eventType+" "+string(payload))
	if json.Valid(payload) && string(payload) == `{"qty":"bad"}` {
		return &ContractViolation{Subject: "outbox.event." + aggType + "-" + eventType, Version: 3, SchemaID: 9,
			EventType: eventType, Pointer: "/qty", Keyword: "/properties/qty/type", Reason: "got string, want integer"}
	}
	if eventType == "Unknown" {
		return fmt.Errorf("%w: subject %q is not registered", ErrNoContract, "outbox.event.order-Unknown")
	}
	return nil
}

// TestContractsCheckBeforeWriting: with Config.Contracts, Write and Emit
// hand the encoded payload to the checker and write nothing it refuses;
// a tombstone is not checked (the connector does not check one either).
func TestContractsCheckBeforeWriting(t *testing.T) {
	bad := json.RawMessage(`{"qty":"bad"}`)
	for _, tc := range []struct {
		name      string
		payload   any
		eventType string
		wantErr   error // nil: written
		wantCall  string
	}{
		{"fits", map[string]int{"qty": 2}, "OrderPlaced", nil, `order/OrderPlaced {"qty":2}`},
		{"raw JSON that fits", json.RawMessage(`{"qty":1}`), "OrderPlaced", nil, `order/OrderPlaced {"qty":1}`},
		{"bytes are checked as they are", []byte(`{"qty":"bad"}`), "OrderPlaced", ErrInvalidEvent, `order/OrderPlaced {"qty":"bad"}`},
		{"violation", bad, "OrderPlaced", ErrInvalidEvent, `order/OrderPlaced {"qty":"bad"}`},
		{"unknown type refused", map[string]int{"qty": 2}, "Unknown", ErrNoContract, `order/Unknown {"qty":2}`},
		{"tombstone not checked", nil, "OrderDeleted", nil, ""},
	} {
		for _, emit := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/emit=%v", tc.name, emit), func(t *testing.T) {
				chk := &stubChecker{}
				w, err := New(Config{Contracts: chk})
				if err != nil {
					t.Fatal(err)
				}
				tx := &fakeTx{}
				e := Event{AggregateType: "order", AggregateID: "o-1", EventType: tc.eventType, Payload: tc.payload}
				if emit {
					err = w.Emit(context.Background(), tx, e)
				} else {
					err = w.Write(context.Background(), tx, e)
				}
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
				if written := len(tx.sql) == 1; written != (err == nil) {
					t.Fatalf("statements %q with err %v: a refused event must not reach the transaction", tx.sql, err)
				}
				var wantCalls []string
				if tc.wantCall != "" {
					wantCalls = []string{tc.wantCall}
				}
				if !slices.Equal(chk.calls, wantCalls) {
					t.Fatalf("checker calls %q, want %q", chk.calls, wantCalls)
				}
			})
		}
	}
}

// TestContractViolationError: the error names the subject, the version and
// the pointer, and is an ErrInvalidEvent.
func TestContractViolationError(t *testing.T) {
	var err error = &ContractViolation{Subject: "outbox.event.order-OrderPlaced", Version: 3, SchemaID: 9,
		EventType: "OrderPlaced", Pointer: "/qty", Keyword: "/properties/qty/type", Reason: "got string, want integer", More: 1}
	want := `outbox: event type OrderPlaced violates subject "outbox.event.order-OrderPlaced" version 3 (id 9): at /qty: got string, want integer (schema /properties/qty/type) and 1 more`
	if err.Error() != want || !errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("%v (is ErrInvalidEvent: %v), want %s", err, errors.Is(err, ErrInvalidEvent), want)
	}
	var v *ContractViolation
	if !errors.As(fmt.Errorf("wrapped: %w", err), &v) || v.Pointer != "/qty" {
		t.Fatalf("errors.As through a wrap: %v", v)
	}
}
