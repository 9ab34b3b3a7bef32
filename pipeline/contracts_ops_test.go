package pipeline

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// observedApplier is a ContractApplier that takes an observer, as
// *contracts.Contracts does.
type observedApplier struct {
	applyFunc
	obs contracts.Observer
}

func (a *observedApplier) SetObserver(o contracts.Observer) { a.obs = o }

// TestContractMetrics: violations and unknown types are counted by type
// and reason, whatever their action; a fit is not; the gate hands the
// client the registry series' observer.
func TestContractMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var answer error
	a := &observedApplier{applyFunc: func(context.Context, string, string, []byte) (contracts.Result, error) {
		return contracts.Result{Schema: testRef}, answer
	}}
	g, m := testGate(t, Contracts{Apply: a, UnknownType: ContractPass})
	if a.obs == nil {
		t.Fatal("the gate set no observer on the client")
	}
	a.obs.CacheMiss()
	if got := testutil.ToFloat64(m.Contracts.CacheMisses); got != 1 {
		t.Fatalf("the observer does not write the cache misses: %v", got)
	}
	for _, err := range []error{nil, testViolation, testViolation, testNoSubject} {
		answer = err
		r, ev, rec := testEvent()
		if _, err := g.check(ctx, r, ev, time.Time{}, rec); err != nil {
			t.Fatal(err)
		}
	}
	for reason, want := range map[string]float64{metrics.ViolationReason: 2, metrics.UnknownTypeReason: 1} {
		if got := testutil.ToFloat64(m.Contracts.Violations.WithLabelValues("OrderPlaced", reason)); got != want {
			t.Errorf("violations{OrderPlaced,%s} = %v, want %v", reason, got, want)
		}
	}
}

// ceEvent routes testEvent's row with kafka.format format.
func ceEvent(t *testing.T, format string, payloadFormat decode.PayloadFormat) (*router.Router, *decode.Event, *router.Record) {
	t.Helper()
	r, err := router.New(router.Config{TopicTemplate: "t.{aggregate_type}", DLQTopic: "dlq", Format: format,
		CloudEvents: router.CloudEvents{Source: "/src"}})
	if err != nil {
		t.Fatal(err)
	}
	_, ev, _ := testEvent()
	ev.PayloadFormat = payloadFormat
	rec := &router.Record{}
	if reason := r.RouteFrom(ev, router.Source{}, rec); reason != "" {
		t.Fatal(reason)
	}
	return r, ev, rec
}

func headerValue(rec *router.Record, key string) (string, int) {
	v, n := "", 0
	for _, h := range rec.Headers {
		if h.Key == key {
			v, n = string(h.Value), n+1
		}
	}
	return v, n
}

// TestContractCloudEvents: a checked CloudEvent names its schema's URL in
// the registry (dataschema) and the media type of its data.
func TestContractCloudEvents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const base = "http://sr:8080/apis/ccompat/v7/"
	const schemaURL = "http://sr:8080/apis/ccompat/v7/schemas/ids/17"
	fits := applyFunc(func(context.Context, string, string, []byte) (contracts.Result, error) {
		return contracts.Result{Value: contracts.AppendHeader(nil, testRef.ID), Schema: testRef}, nil
	})
	for _, tc := range []struct {
		name          string
		format        string
		payload       decode.PayloadFormat
		encode        bool
		media         string
		wantType      string // content-type header
		wantSchemaHdr string
	}{
		{"binary validate json", router.FormatCEBinary, decode.PayloadJSON, false, "application/json", "application/json", schemaURL},
		{"binary validate text", router.FormatCEBinary, decode.PayloadText, false, "application/json", "application/json", schemaURL},
		{"binary encode avro", router.FormatCEBinary, decode.PayloadJSON, true, "application/avro", "application/avro", schemaURL},
		{"plain", router.FormatPlain, decode.PayloadJSON, true, "application/avro", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, _ := testGate(t, Contracts{Apply: fits, Encode: tc.encode, RegistryURL: base, MediaType: tc.media})
			r, ev, rec := ceEvent(t, tc.format, tc.payload)
			if _, err := g.check(ctx, r, ev, time.Time{}, rec); err != nil {
				t.Fatal(err)
			}
			ct, n := headerValue(rec, wire.HeaderContentType)
			if ct != tc.wantType || (tc.wantType != "" && n != 1) {
				t.Errorf("content-type %q (%d headers), want %q once", ct, n, tc.wantType)
			}
			if ds, _ := headerValue(rec, "ce_dataschema"); ds != tc.wantSchemaHdr {
				t.Errorf("ce_dataschema %q, want %q", ds, tc.wantSchemaHdr)
			}
		})
	}
	t.Run("structured", func(t *testing.T) {
		g, _ := testGate(t, Contracts{Apply: fits, RegistryURL: base, MediaType: "application/json"})
		r, ev, rec := ceEvent(t, router.FormatCEStructured, decode.PayloadJSON)
		if _, err := g.check(ctx, r, ev, time.Time{}, rec); err != nil {
			t.Fatal(err)
		}
		var env map[string]any
		if err := json.Unmarshal(rec.Value, &env); err != nil {
			t.Fatalf("envelope %s: %v", rec.Value, err)
		}
		if env["dataschema"] != schemaURL || env["datacontenttype"] != "application/json" || env["type"] != "OrderPlaced" {
			t.Errorf("envelope %s: want dataschema %s beside the router's attributes", rec.Value, schemaURL)
		}
	})
	t.Run("off without a registry URL", func(t *testing.T) {
		g, _ := testGate(t, Contracts{Apply: fits})
		r, ev, rec := ceEvent(t, router.FormatCEBinary, decode.PayloadJSON)
		if _, err := g.check(ctx, r, ev, time.Time{}, rec); err != nil {
			t.Fatal(err)
		}
		if _, n := headerValue(rec, "ce_dataschema"); n != 0 {
			t.Error("dataschema set without a registry URL")
		}
	})
}
