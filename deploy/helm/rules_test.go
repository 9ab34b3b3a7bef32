package helm

import (
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// checkRules loads the PrometheusRule's groups as Prometheus loads a rule
// file (expressions parsed, annotation templates checked, unknown fields
// refused) and checks every series they select: a metric the binary
// exports, of this release (job and namespace).
func checkRules(t *testing.T, pr *monv1.PrometheusRule) {
	t.Helper()
	b, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	p := parser.NewParser(parser.Options{})
	if _, errs := rulefmt.Parse(b, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler)); len(errs) > 0 {
		t.Fatalf("Prometheus refuses the rules: %v\n%s", errs, b)
	}
	have, err := metrics.New().SeriesNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("rule %q: only alerts are expected", r.Record)
				continue
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: want a severity label, a summary and a description", r.Alert)
			}
			expr, err := p.ParseExpr(r.Expr.String())
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
				continue
			}
			for _, sel := range parser.ExtractSelectors(expr) {
				checkSelector(t, r.Alert, sel, have)
			}
		}
	}
}

func checkSelector(t *testing.T, alert string, sel []*labels.Matcher, have map[string]bool) {
	t.Helper()
	want := map[string]string{"job": fullname, "namespace": namespace}
	for _, m := range sel {
		switch {
		case m.Name == labels.MetricName && m.Type == labels.MatchEqual:
			if !have[m.Value] {
				t.Errorf("alert %s uses %s, which outbox-cdc does not export", alert, m.Value)
			}
		case want[m.Name] != "" && m.Type == labels.MatchEqual && m.Value == want[m.Name]:
			delete(want, m.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("alert %s: selector %v lacks %v: it would select other releases' series", alert, sel, want)
	}
}

// checkMonitors checks that the ServiceMonitor or PodMonitor scrapes the
// chart's pods on the HTTP port and labels them job=<fullname>, which the
// rules select.
func checkMonitors(t *testing.T, m *manifests) {
	t.Helper()
	pod := m.deployment.Spec.Template
	port := pod.Spec.Containers[0].Ports[0].Name
	check := func(kind string, sel metav1.LabelSelector, target map[string]string, ns monv1.NamespaceSelector, epPort, path string, relabel []monv1.RelabelConfig) {
		s, err := metav1.LabelSelectorAsSelector(&sel)
		if err != nil || s.Empty() || !s.Matches(k8slabels.Set(target)) {
			t.Errorf("%s selector %v does not select %v (%v)", kind, sel, target, err)
		}
		if !slices.Equal(ns.MatchNames, []string{namespace}) {
			t.Errorf("%s namespaceSelector %+v, want the release's namespace only", kind, ns)
		}
		if epPort != port || path != "/metrics" {
			t.Errorf("%s scrapes port %q path %q, want %q /metrics", kind, epPort, path, port)
		}
		job := false
		for _, r := range relabel {
			if r.TargetLabel == "job" && r.Replacement != nil && *r.Replacement == fullname && len(r.SourceLabels) == 0 {
				job = true
			}
		}
		if !job {
			t.Errorf("%s does not set job=%s, which the alert rules select", kind, fullname)
		}
	}
	if sm := m.serviceMonitor; sm != nil {
		if len(sm.Spec.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor: %d endpoints", len(sm.Spec.Endpoints))
		}
		ep := sm.Spec.Endpoints[0]
		// The ServiceMonitor names the Service's port, which targets the pod's.
		if m.service.Spec.Ports[0].Name != ep.Port {
			t.Errorf("ServiceMonitor port %s is not the Service's %s", ep.Port, m.service.Spec.Ports[0].Name)
		}
		check("ServiceMonitor", sm.Spec.Selector, m.service.Labels, sm.Spec.NamespaceSelector, m.service.Spec.Ports[0].TargetPort.StrVal, ep.Path, ep.RelabelConfigs)
	}
	if pm := m.podMonitor; pm != nil {
		if len(pm.Spec.PodMetricsEndpoints) != 1 {
			t.Fatalf("PodMonitor: %d endpoints", len(pm.Spec.PodMetricsEndpoints))
		}
		ep := pm.Spec.PodMetricsEndpoints[0]
		epPort := ""
		if ep.Port != nil {
			epPort = *ep.Port
		}
		check("PodMonitor", pm.Spec.Selector, pod.Labels, pm.Spec.NamespaceSelector, epPort, ep.Path, ep.RelabelConfigs)
	}
}

// TestGuideListsTheAlerts keeps docs/guide.md's alert table and the chart's
// PrometheusRule, the alerts' one definition, naming the same alerts.
func TestGuideListsTheAlerts(t *testing.T) {
	m := mustRender(t, with("prometheusRule.enabled", true))
	var rules []string
	for _, g := range m.prometheusRule.Spec.Groups {
		for _, r := range g.Rules {
			rules = append(rules, r.Alert)
		}
	}
	b, err := os.ReadFile("../../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Alerts\n")
	if !ok {
		t.Fatal(`docs/guide.md has no section "### Alerts"`)
	}
	section, _, _ = strings.Cut(section, "\n#")
	var guide []string
	for _, row := range regexp.MustCompile("(?m)^\\| `(OutboxCDC\\w+)` \\|").FindAllStringSubmatch(section, -1) {
		guide = append(guide, row[1])
	}
	sort.Strings(rules)
	sort.Strings(guide)
	if len(rules) == 0 || !slices.Equal(rules, guide) {
		t.Errorf("docs/guide.md lists the alerts %v, the chart's PrometheusRule has %v", guide, rules)
	}
}
