package helm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "outbox-cdc"
	releaseName = "orders"
	namespace   = "shop"
	fullname    = "orders-outbox-cdc"
)

// manifests is one rendering of the chart, decoded into the API types.
type manifests struct {
	deployment     *appsv1.Deployment
	configMap      *corev1.ConfigMap
	service        *corev1.Service
	serviceAccount *corev1.ServiceAccount
	pdb            *policyv1.PodDisruptionBudget
	serviceMonitor *monv1.ServiceMonitor
	podMonitor     *monv1.PodMonitor
	prometheusRule *monv1.PrometheusRule
	networkPolicy  *networkingv1.NetworkPolicy
	notes          string
	seen           map[string]bool // kind/name
}

// render renders the chart with values (merged over values.yaml, as helm
// install --set does) and decodes every manifest strictly: an unknown or
// duplicate field, a kind the test does not know, or a wrong apiVersion fails.
func render(values map[string]any) (*manifests, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := apiKubeVersion()
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = kv
	// helm install checks this; the engine alone does not.
	if !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return nil, fmt.Errorf("Chart.yaml kubeVersion %s excludes Kubernetes %s", chrt.Metadata.KubeVersion, caps.KubeVersion)
	}
	vals, err := chartutil.ToRenderValues(chrt, values,
		chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	// Strict: a template that reads a value values.yaml does not define fails.
	files, err := engine.Engine{Strict: true}.Render(chrt, vals)
	if err != nil {
		return nil, err
	}
	m := &manifests{seen: map[string]bool{}}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			m.notes = files[name]
			continue
		case path.Ext(name) != ".yaml":
			continue
		}
		if err := m.decodeFile(name, files[name]); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *manifests) decodeFile(name, text string) error {
	r := k8syaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 || isComment(doc) {
			continue
		}
		if err := m.decode(doc); err != nil {
			return fmt.Errorf("%s: %w\n%s", name, err, doc)
		}
	}
}

func (m *manifests) decode(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	kinds := map[string]struct {
		apiVersion string
		alloc      func() any // sets m's field to a new object and returns it
	}{
		"Deployment":          {"apps/v1", func() any { return alloc(&m.deployment) }},
		"ConfigMap":           {"v1", func() any { return alloc(&m.configMap) }},
		"Service":             {"v1", func() any { return alloc(&m.service) }},
		"ServiceAccount":      {"v1", func() any { return alloc(&m.serviceAccount) }},
		"PodDisruptionBudget": {"policy/v1", func() any { return alloc(&m.pdb) }},
		"ServiceMonitor":      {"monitoring.coreos.com/v1", func() any { return alloc(&m.serviceMonitor) }},
		"PodMonitor":          {"monitoring.coreos.com/v1", func() any { return alloc(&m.podMonitor) }},
		"PrometheusRule":      {"monitoring.coreos.com/v1", func() any { return alloc(&m.prometheusRule) }},
		"NetworkPolicy":       {"networking.k8s.io/v1", func() any { return alloc(&m.networkPolicy) }},
	}
	k, ok := kinds[tm.Kind]
	if !ok {
		return fmt.Errorf("kind %q: the test does not know it; add its API type", tm.Kind)
	}
	want := k.apiVersion
	if tm.APIVersion != want {
		return fmt.Errorf("%s: apiVersion %q, want %q", tm.Kind, tm.APIVersion, want)
	}
	obj := k.alloc()
	// UnmarshalStrict refuses unknown and duplicate fields.
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	meta := obj.(metav1.Object)
	header := tm.Kind + "/" + meta.GetName()
	if m.seen[header] {
		return fmt.Errorf("%s rendered twice", header)
	}
	m.seen[header] = true
	return checkMeta(tm.Kind, meta)
}

// apiKubeVersion is the Kubernetes release of the k8s.io/api types the
// manifests are decoded into (k8s.io/api v0.X.Y is Kubernetes 1.X.Y, read
// from go.mod): the chart is rendered for the version it is checked against.
func apiKubeVersion() (chartutil.KubeVersion, error) {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		return chartutil.KubeVersion{}, err
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/api v0\.(\d+)\.(\d+)`).FindStringSubmatch(string(b))
	if m == nil {
		return chartutil.KubeVersion{}, errors.New("go.mod does not require k8s.io/api v0.X.Y")
	}
	return chartutil.KubeVersion{Version: "v1." + m[1] + "." + m[2], Major: "1", Minor: m[1]}, nil
}

func alloc[T any](field **T) any {
	*field = new(T)
	return *field
}

// checkMeta checks what the API server would refuse in any object's
// metadata: the name, the namespace and the labels.
func checkMeta(kind string, o metav1.Object) error {
	var problems []string
	if errs := validation.IsDNS1123Subdomain(o.GetName()); len(errs) > 0 {
		problems = append(problems, fmt.Sprintf("name %q: %s", o.GetName(), strings.Join(errs, "; ")))
	}
	if o.GetNamespace() != namespace {
		problems = append(problems, fmt.Sprintf("namespace %q, want the release's %q", o.GetNamespace(), namespace))
	}
	for k, v := range o.GetLabels() {
		for _, e := range append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...) {
			problems = append(problems, fmt.Sprintf("label %s=%s: %s", k, v, e))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s %s: %s", kind, o.GetName(), strings.Join(problems, "; "))
	}
	return nil
}

func isComment(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}
