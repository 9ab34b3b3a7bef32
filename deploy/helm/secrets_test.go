package helm

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// checkSecretsStayOut: credentials reach the pod from Secrets (as files,
// or AWS's variables from the Secret), never through the ConfigMap or a
// plain env value.
func checkSecretsStayOut(t *testing.T, m *manifests) {
	t.Helper()
	text := strings.Join(mapValues(m.configMap.Data), "\n")
	for _, key := range []string{"client_secret:", "password:", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"} {
		if strings.Contains(text, key) {
			t.Errorf("the ConfigMap carries %s:\n%s", key, text)
		}
	}
	c := m.deployment.Spec.Template.Spec.Containers[0]
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "AWS_") && e.Name != "AWS_WEB_IDENTITY_TOKEN_FILE" && e.Name != "AWS_ROLE_ARN" &&
			(e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("env %s is not from a Secret", e.Name)
		}
	}
	for _, file := range []string{"client_secret_file", "token_file"} {
		if _, path, ok := strings.Cut(text, file+": "); ok {
			path, _, _ = strings.Cut(path, "\n")
			if !mounted(c, path) {
				t.Errorf("%s %s is not in a mounted Secret (mounts %v)", file, path, c.VolumeMounts)
			}
		}
	}
	for _, e := range c.Env {
		if e.Name == "AWS_WEB_IDENTITY_TOKEN_FILE" && !mounted(c, e.Value) {
			t.Errorf("AWS_WEB_IDENTITY_TOKEN_FILE %s is not in a mounted Secret", e.Value)
		}
	}
}

func mounted(c corev1.Container, path string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
		return vm.Name != "config" && strings.HasPrefix(path, vm.MountPath+"/")
	})
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// checkNetworkPolicy: when enabled, it selects exactly the connector's
// pods and admits only the HTTP port, only from the peers listed.
func checkNetworkPolicy(t *testing.T, m *manifests) {
	t.Helper()
	np := m.networkPolicy
	if np == nil {
		return
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(m.deployment.Spec.Template.Labels)) || sel.Empty() {
		t.Errorf("NetworkPolicy selector %v does not select the pods %v", sel, m.deployment.Spec.Template.Labels)
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != "Ingress" {
		t.Errorf("policy types %v, want Ingress", np.Spec.PolicyTypes)
	}
	for _, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			t.Errorf("an ingress rule without from admits every pod: %+v", r)
		}
		if len(r.Ports) != 1 || r.Ports[0].Port == nil || r.Ports[0].Port.String() != "http" {
			t.Errorf("ingress ports %+v, want only the http port", r.Ports)
		}
	}
}

// TestNetworkPolicyOptIn: no NetworkPolicy unless asked.
func TestNetworkPolicyOptIn(t *testing.T) {
	if m := mustRender(t, required()); m.networkPolicy != nil {
		t.Errorf("a NetworkPolicy by default")
	}
	if m := mustRender(t, with("networkPolicy.enabled", true)); m.networkPolicy == nil || len(m.networkPolicy.Spec.Ingress) != 0 {
		t.Errorf("networkPolicy.enabled without ingressFrom: %+v, want one admitting nothing", m.networkPolicy)
	}
}
