package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// TestRecheckOf is recheckOf's truth table: what a redrive checks, keeps
// or refuses, by kafka.format, contracts.mode and the value's origin.
func TestRecheckOf(t *testing.T) {
	payload, frame := []byte(`{"qty":1}`), contracts.AppendHeader(nil, 17)
	for _, tc := range []struct {
		format            string
		encode, published bool
		value             []byte
		want              recheck
	}{
		{"", false, false, payload, recheckApply},                                 // a contract dead letter
		{router.FormatPlain, true, false, payload, recheckApply},                  // encode: framed with the latest id
		{router.FormatPlain, false, true, payload, recheckApply},                  // parked, validate: checked again
		{router.FormatPlain, true, true, frame, recheckKeep},                      // parked, framed when let through
		{router.FormatPlain, true, true, payload, recheckApply},                   // parked unframed (unknown_type pass)
		{router.FormatCEStructured, false, false, payload, recheckRefuse},         // no CloudEvent to republish
		{router.FormatCEBinary, true, false, payload, recheckRefuse},              //
		{router.FormatCEStructured, false, true, []byte(`{"id":1}`), recheckKeep}, // an envelope
		{router.FormatCEBinary, false, true, payload, recheckApply},               // binary: the value is the data
		{router.FormatCEBinary, true, true, frame, recheckKeep},                   //
	} {
		if got := recheckOf(tc.format, tc.encode, tc.published, tc.value); got != tc.want {
			t.Errorf("recheckOf(%q, encode %v, published %v, %q) = %d, want %d", tc.format, tc.encode, tc.published, tc.value, got, tc.want)
		}
	}
}

// TestRedriven: the value a redrive republishes for each answer of the
// latest version, or the refusal's reason.
func TestRedriven(t *testing.T) {
	payload, framed := []byte(`{"qty":1}`), append(contracts.AppendHeader(nil, 18), `{"qty":1}`...)
	res := contracts.Result{Value: framed, Schema: contracts.SchemaRef{Subject: "s", Version: 4, ID: 18}}
	for _, tc := range []struct {
		name    string
		err     error
		c       Contracts
		want    string // the value, or the refusal's text
		refused bool
	}{
		{"fits, validate", nil, Contracts{}, string(payload), false},
		{"fits, encode", nil, Contracts{Encode: true}, string(framed), false},
		{"violation", testViolation, Contracts{}, "still violates its contract: contracts: subject", true},
		{"violation, on_violation fail", testViolation, Contracts{OnViolation: ContractFail}, "still violates", true},
		{"no subject, quarantine", testNoSubject, Contracts{}, "still has no contract", true},
		{"no subject, pass", testNoSubject, Contracts{UnknownType: ContractPass, Encode: true}, string(payload), false},
		{"registry down", testDown, Contracts{}, "redrive again once the schema registry answers", true},
		{"bad schema", testBad, Contracts{}, "cannot be checked now", true},
		{"stopped", context.Canceled, Contracts{}, "context canceled", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := res
			if tc.err != nil {
				r = contracts.Result{}
			}
			v, err := redriven(payload, r, tc.err, &tc.c)
			switch {
			case tc.refused && (err == nil || !strings.Contains(err.Error(), tc.want) || v != nil):
				t.Fatalf("redriven = %q, %v; want refused with %q", v, err, tc.want)
			case !tc.refused && (err != nil || string(v) != tc.want):
				t.Fatalf("redriven = %q, %v; want %q", v, err, tc.want)
			}
		})
	}
}

// latestFunc is a ContractApplier with ApplyLatest, which alone answers.
type latestFunc func(ctx context.Context, topic, eventType string, payload []byte) (contracts.Result, error)

func (f latestFunc) Apply(context.Context, string, string, []byte) (contracts.Result, error) {
	return contracts.Result{}, errors.New("Apply called: the cached version may be the violated one")
}

func (f latestFunc) ApplyLatest(ctx context.Context, topic, eventType string, payload []byte) (contracts.Result, error) {
	return f(ctx, topic, eventType, payload)
}

// TestRevalidate: the redrive asks for the latest version with the
// record's topic and event type; a framed parked record is not asked
// about; a CloudEvents dead letter is refused.
func TestRevalidate(t *testing.T) {
	ctx := context.Background()
	var asked []string
	apply := latestFunc(func(_ context.Context, topic, et string, p []byte) (contracts.Result, error) {
		asked = append(asked, fmt.Sprintf("%s %s %s", topic, et, p))
		return contracts.Result{Value: append(contracts.AppendHeader(nil, 18), p...)}, nil
	})
	rv := revalidator(&Contracts{Apply: apply, Encode: true}, "")
	v, err := rv.Revalidate(ctx, "t.orders", "OrderPlaced", []byte(`{"qty":1}`), false)
	if id, body, perr := contracts.ParseHeader(v); err != nil || perr != nil || id != 18 || string(body) != `{"qty":1}` {
		t.Fatalf("dead letter: %x, %v; want framed with id 18", v, err)
	}
	old := contracts.AppendHeader(nil, 17)
	if v, err := rv.Revalidate(ctx, "t.orders", "OrderPlaced", old, true); err != nil || string(v) != string(old) {
		t.Fatalf("framed parked record: %x, %v; want it unchanged", v, err)
	}
	if strings.Join(asked, ";") != `t.orders OrderPlaced {"qty":1}` {
		t.Fatalf("asked %q, want the dead letter only", asked)
	}
	rv = revalidator(&Contracts{Apply: apply}, router.FormatCEBinary)
	if _, err := rv.Revalidate(ctx, "t.orders", "OrderPlaced", []byte(`{}`), false); !errors.Is(err, errNotPlain) {
		t.Fatalf("CloudEvents dead letter: %v, want errNotPlain", err)
	}
	if revalidator(nil, "") != nil {
		t.Fatal("revalidator without contracts is not nil")
	}
}
