package metrics

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/contracts"
)

var _ contracts.Observer = ContractsObserver{}

// TestViolationsBounded: the first MaxEventTypes types keep their label,
// later ones share "other", and a type seen before the bound keeps its
// label after it.
func TestViolationsBounded(t *testing.T) {
	m := New()
	c := &m.Contracts
	for i := range MaxEventTypes + 50 {
		c.Violation(fmt.Sprintf("Type%d", i), ViolationReason)
	}
	c.Violation("Type0", UnknownTypeReason)
	c.Violation("Type0", ViolationReason)
	if n := testutil.CollectAndCount(c.Violations); n != MaxEventTypes+2 {
		t.Errorf("%d series, want %d (the bound, other, and Type0's unknown_type)", n, MaxEventTypes+2)
	}
	for _, tc := range []struct {
		typ, reason string
		want        float64
	}{
		{"Type0", ViolationReason, 2},
		{"Type0", UnknownTypeReason, 1},
		{fmt.Sprintf("Type%d", MaxEventTypes-1), ViolationReason, 1},
		{OtherEventType, ViolationReason, 50},
	} {
		if got := testutil.ToFloat64(c.Violations.WithLabelValues(tc.typ, tc.reason)); got != tc.want {
			t.Errorf("violations{%s,%s} = %v, want %v", tc.typ, tc.reason, got, tc.want)
		}
	}
}

// TestContractsMetrics: the registry kinds are contracts'; the observer
// writes the series; the names are exported.
func TestContractsMetrics(t *testing.T) {
	if !slices.Equal(registryKinds, contracts.Kinds()) {
		t.Errorf("registryKinds %v, contracts.Kinds() %v", registryKinds, contracts.Kinds())
	}
	m := New()
	o := m.ContractsObserver()
	o.RegistryRequest(30 * time.Millisecond)
	o.RegistryError(contracts.KindUnreachable)
	o.CacheMiss()
	c := &m.Contracts
	if got := testutil.ToFloat64(c.RegistryErrors.WithLabelValues(contracts.KindUnreachable)); got != 1 {
		t.Errorf("registry_errors_total{unreachable} = %v", got)
	}
	if got := testutil.ToFloat64(c.CacheMisses); got != 1 {
		t.Errorf("cache misses = %v", got)
	}
	if n := testutil.CollectAndCount(c.RegistryErrors); n != len(registryKinds) {
		t.Errorf("%d registry_errors_total series, want every kind at start", n)
	}
	names, err := m.SeriesNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"outbox_cdc_contract_violations_total", "outbox_cdc_registry_request_seconds_bucket",
		"outbox_cdc_registry_errors_total", "outbox_cdc_contract_cache_misses_total", "outbox_cdc_contracts_waiting"} {
		if !names[n] {
			t.Errorf("%s is not exported", n)
		}
	}
}
