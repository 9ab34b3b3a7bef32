package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/router"
)

var (
	testRef       = contracts.SchemaRef{Subject: "orders-OrderPlaced", Version: 3, ID: 17}
	testViolation = &contracts.Violation{Schema: testRef, Pointer: "/qty", Reason: "got string, want integer"}
	testNoSubject = &contracts.RegistryError{Subject: "orders-Lost", Kind: contracts.ErrNoSubject}
	testDown      = &contracts.RegistryError{Subject: "orders-New", Kind: contracts.ErrUnreachable, Err: errors.New("connection refused")}
	testBad       = &contracts.RegistryError{Subject: "orders-New", Kind: contracts.ErrBadSchema, Err: errors.New("not JSON")}
)

// TestDecideContract is decideContract's truth table: each answer of Apply
// under each configured action.
func TestDecideContract(t *testing.T) {
	all := []ContractAction{ContractDeadLetter, ContractPass, ContractFail}
	for _, tc := range []struct {
		name   string
		err    error
		onViol ContractAction
		unk    ContractAction
		want   contractVerdict
	}{
		{"fits", nil, ContractFail, ContractFail, contractPublish},
		{"violation quarantine/dlq", testViolation, ContractDeadLetter, ContractFail, contractDeadLetter},
		{"violation fail", testViolation, ContractFail, ContractDeadLetter, contractFail},
		{"wrapped violation", fmt.Errorf("x: %w", testViolation), ContractDeadLetter, ContractFail, contractDeadLetter},
		{"unknown quarantine", testNoSubject, ContractFail, ContractDeadLetter, contractDeadLetter},
		{"unknown pass", testNoSubject, ContractFail, ContractPass, contractUnchecked},
		{"unknown fail", testNoSubject, ContractDeadLetter, ContractFail, contractFail},
		{"unreachable", testDown, ContractFail, ContractFail, contractWait},
		{"bad schema", testBad, ContractFail, ContractFail, contractWait},
		{"incompatible", &contracts.RegistryError{Subject: "s", Kind: contracts.ErrIncompatible}, ContractFail, ContractFail, contractWait},
		{"context", context.Canceled, ContractDeadLetter, ContractPass, contractStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideContract(tc.err, &Contracts{OnViolation: tc.onViol, UnknownType: tc.unk}); got != tc.want {
				t.Fatalf("decideContract(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
	// An unreachable registry waits whatever the actions: never skipped.
	for _, v := range all {
		for _, u := range all {
			if got := decideContract(testDown, &Contracts{OnViolation: v, UnknownType: u}); got != contractWait {
				t.Fatalf("unreachable under %d/%d: %d, want wait", v, u, got)
			}
		}
	}
}

// applyFunc is a ContractApplier.
type applyFunc func(ctx context.Context, topic, eventType string, payload []byte) (contracts.Result, error)

func (f applyFunc) Apply(ctx context.Context, topic, eventType string, payload []byte) (contracts.Result, error) {
	return f(ctx, topic, eventType, payload)
}

func testGate(t *testing.T, c Contracts) (*contractGate, *metrics.Metrics) {
	t.Helper()
	m := metrics.New()
	g := newContractGate(&c, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.first, g.most = time.Millisecond, 5*time.Millisecond
	return g, m
}

func testEvent() (*router.Router, *decode.Event, *router.Record) {
	r, err := router.New(router.Config{TopicTemplate: "t.{aggregate_type}", DLQTopic: "dlq"})
	if err != nil {
		panic(err)
	}
	v := func(s string) decode.Value { return decode.Value{Bytes: []byte(s)} }
	ev := &decode.Event{ID: v("e1"), AggregateType: v("orders"), AggregateID: v("o-1"), EventType: v("OrderPlaced"),
		Payload: v(`{"qty":"x"}`)}
	rec := &router.Record{}
	if reason := r.RouteFrom(ev, router.Source{}, rec); reason != "" {
		panic(reason)
	}
	return r, ev, rec
}

// TestContractCheck: what check leaves in the record for each verdict.
func TestContractCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	framed := contracts.AppendHeader(nil, testRef.ID)
	answer := func(v []byte, err error) applyFunc {
		return func(_ context.Context, topic, et string, p []byte) (contracts.Result, error) {
			if topic != "t.orders" || et != "OrderPlaced" || string(p) != `{"qty":"x"}` {
				return contracts.Result{}, fmt.Errorf("applied to %s %s %s", topic, et, p)
			}
			return contracts.Result{Value: v, Schema: testRef}, err
		}
	}

	g, _ := testGate(t, Contracts{Apply: answer(framed, nil), Encode: true})
	r, ev, rec := testEvent()
	if reason, err := g.check(ctx, r, ev, time.Time{}, rec); err != nil || reason != "" || !bytes.Equal(rec.Value, framed) || string(rec.Key) != "o-1" {
		t.Fatalf("encode: %q %v, value %x key %q; want the framed value and the key unchanged", reason, err, rec.Value, rec.Key)
	}
	g, _ = testGate(t, Contracts{Apply: answer([]byte("other"), nil)})
	r, ev, rec = testEvent()
	if _, err := g.check(ctx, r, ev, time.Time{}, rec); err != nil || string(rec.Value) != `{"qty":"x"}` {
		t.Fatalf("validate: %v, value %q; want the payload", err, rec.Value)
	}

	g, _ = testGate(t, Contracts{Apply: answer(nil, testViolation)})
	r, ev, rec = testEvent()
	reason, err := g.check(ctx, r, ev, time.Time{}, rec)
	if err != nil || rec.Topic != "dlq" || !strings.Contains(reason, "/qty") || !strings.Contains(reason, "version 3") {
		t.Fatalf("violation: %q %v, topic %s; want a dead letter naming /qty and version 3", reason, err, rec.Topic)
	}
	want := []string{"error", "topic", "contract_subject", "contract_version", "id", "event_type", "aggregate_type", "aggregate_id"}
	if got := headerKeys(rec); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("dead letter headers %v, want %v", got, want)
	}
	if string(rec.Headers[1].Value) != "t.orders" || string(rec.Headers[2].Value) != testRef.Subject || string(rec.Headers[3].Value) != "3" {
		t.Fatalf("contract headers %q %q %q", rec.Headers[1].Value, rec.Headers[2].Value, rec.Headers[3].Value)
	}

	g, _ = testGate(t, Contracts{Apply: answer(nil, testNoSubject), UnknownType: ContractPass})
	r, ev, rec = testEvent()
	if _, err := g.check(ctx, r, ev, time.Time{}, rec); err != nil || rec.Topic != "t.orders" {
		t.Fatalf("unknown pass: %v, topic %s", err, rec.Topic)
	}

	g, _ = testGate(t, Contracts{Apply: answer(nil, testViolation), OnViolation: ContractFail})
	r, ev, rec = testEvent()
	_, err = g.check(ctx, r, ev, time.Time{}, rec)
	var fe *fault.FatalError
	if !errors.As(err, &fe) || fe.Reason != "contract" || !strings.Contains(err.Error(), "contracts.on_violation is fail") ||
		!strings.Contains(err.Error(), `subject "orders-OrderPlaced" version 3`) || !strings.Contains(err.Error(), "got string") {
		t.Fatalf("fail: %v; want a fatal error naming the key, the subject, the version and the reason", err)
	}
}

func headerKeys(rec *router.Record) []string {
	var out []string
	for _, h := range rec.Headers {
		out = append(out, h.Key)
	}
	return out
}

// TestContractWait: an unreachable registry holds the event (visible in
// waitingFor and the gauge) until it answers; a stop ends the wait.
func TestContractWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var calls atomic.Int32
	up := make(chan struct{})
	g, m := testGate(t, Contracts{Apply: applyFunc(func(context.Context, string, string, []byte) (contracts.Result, error) {
		calls.Add(1)
		select {
		case <-up:
			return contracts.Result{Schema: testRef}, nil
		default:
			return contracts.Result{}, testDown
		}
	})})
	type result struct {
		reason string
		err    error
	}
	done := make(chan result, 1)
	r, ev, rec := testEvent()
	go func() {
		reason, err := g.check(ctx, r, ev, time.Time{}, rec)
		done <- result{reason, err}
	}()
	for g.waitingFor() == "" || calls.Load() < 3 {
		select {
		case res := <-done:
			t.Fatalf("check returned while the registry is down: %+v", res)
		case <-ctx.Done():
			t.Fatal("no wait seen")
		case <-time.After(time.Millisecond):
		}
	}
	if s := g.waitingFor(); s != "orders-New" || testutil.ToFloat64(m.ContractsWaiting) != 1 {
		t.Fatalf("waiting for %q, gauge %v; want orders-New and 1", s, testutil.ToFloat64(m.ContractsWaiting))
	}
	close(up)
	select {
	case res := <-done:
		if res.err != nil || res.reason != "" || rec.Topic != "t.orders" {
			t.Fatalf("after the registry answered: %+v, topic %s", res, rec.Topic)
		}
	case <-ctx.Done():
		t.Fatal("check did not return once the registry answered")
	}
	if g.waitingFor() != "" || testutil.ToFloat64(m.ContractsWaiting) != 0 {
		t.Fatal("still waiting after the answer")
	}

	// A stop while waiting returns the context's error, nothing published.
	g, m = testGate(t, Contracts{Apply: applyFunc(func(context.Context, string, string, []byte) (contracts.Result, error) {
		return contracts.Result{}, testDown
	})})
	stop, stopNow := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stopNow()
	r, ev, rec = testEvent()
	if _, err := g.check(stop, r, ev, time.Time{}, rec); !errors.Is(err, context.DeadlineExceeded) || g.waitingFor() != "" ||
		testutil.ToFloat64(m.ContractsWaiting) != 0 {
		t.Fatalf("stopped wait: %v, waiting %q", err, g.waitingFor())
	}
}
