package helm

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestChartRefuses checks that values which cannot work fail the render
// with a message naming the value to change.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"no DSN", with("config.postgres.dsn", ""), "config.postgres.dsn is required"},
		{"no brokers", with("config.kafka.brokers", []any{}), "config.kafka.brokers is required"},
		{"file store", with("replicaCount", 1, "config.checkpoint.store", "file", "config.checkpoint.file", "/tmp/c"), "config.checkpoint.store file"},
		{"http.listen elsewhere", with("config.http.listen", "127.0.0.1:9187"), "config.http.listen is set by the chart"},
		{"http.listen from env", with("env", []any{map[string]any{"name": "OUTBOX_CDC_HTTP_LISTEN", "value": ":1"}}), "env OUTBOX_CDC_HTTP_LISTEN"},
		{"two monitors", with("metrics.serviceMonitor.enabled", true, "metrics.podMonitor.enabled", true), "enable one"},
		{"anti-affinity typo", with("podAntiAffinity", "strict"), "podAntiAffinity: want soft, hard"},
		{"pprof without a NetworkPolicy", with("config.http.pprof", true, "config.http.pprof_any_address", true), "config.http.pprof: the chart listens on 0.0.0.0"},
		{"pprof not asked for explicitly", with("config.http.pprof", true, "networkPolicy.enabled", true), "config.http.pprof_any_address: true"},
		{"web identity without a role", with("secrets.awsWebIdentity.existingSecret", "aws-token"), "secrets.awsWebIdentity.roleARN is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// The same listen address the chart sets is accepted.
	if _, err := render(with("config.http.listen", "0.0.0.0:9187")); err != nil {
		t.Errorf("http.listen 0.0.0.0:9187 (the chart's own): %v", err)
	}
}

// TestRolloutWithSlotLock checks the defaults that let two replicas, of
// which only one can stream, roll and drain: see README.md "Rollouts".
func TestRolloutWithSlotLock(t *testing.T) {
	m := mustRender(t, required())
	d := m.deployment
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2 (one streams, one stands by)", d.Spec.Replicas)
	}
	s := d.Spec.Strategy
	if s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil {
		t.Fatalf("strategy %+v, want RollingUpdate", s)
	}
	// No surge: a third pod could only wait for the slot. One unavailable:
	// the other keeps streaming or standing by while one is replaced.
	if got := s.RollingUpdate.MaxSurge; got == nil || *got != intstr.FromInt32(0) {
		t.Errorf("maxSurge %v, want 0", got)
	}
	if got := s.RollingUpdate.MaxUnavailable; got == nil || *got != intstr.FromInt32(1) {
		t.Errorf("maxUnavailable %v, want 1", got)
	}
	// With /readyz as readiness only the streaming pod would be available:
	// maxUnavailable 1 would then wait for ever for a new pod to become
	// ready while the old one holds the slot, and the PDB would never let
	// the streaming pod be evicted.
	c := d.Spec.Template.Spec.Containers[0]
	if c.ReadinessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("default readiness path %s, want /healthz", c.ReadinessProbe.HTTPGet.Path)
	}
	if m.pdb == nil || m.pdb.Spec.MaxUnavailable == nil || *m.pdb.Spec.MaxUnavailable != intstr.FromInt32(1) {
		t.Errorf("PodDisruptionBudget %+v, want maxUnavailable 1", m.pdb)
	}
	if aff := d.Spec.Template.Spec.Affinity; aff == nil || aff.PodAntiAffinity == nil ||
		len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Errorf("affinity %+v, want a preferred pod anti-affinity", aff)
	}
	if m.serviceMonitor != nil || m.podMonitor != nil || m.prometheusRule != nil {
		t.Error("monitoring objects rendered by default: they need the prometheus-operator CRDs")
	}
}
