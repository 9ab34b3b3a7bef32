package helm

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// required are the values an install must give (the chart refuses to
// render without them).
func required() map[string]any {
	return map[string]any{"config": map[string]any{
		"postgres": map[string]any{"dsn": "postgres://outbox_cdc@db.shop.svc:5432/shop?sslmode=require"},
		"kafka":    map[string]any{"brokers": []any{"kafka-0.kafka:9093", "kafka-1.kafka:9093"}},
	}}
}

// with returns required() with the dotted keys set.
func with(kv ...any) map[string]any {
	v := required()
	for i := 0; i < len(kv); i += 2 {
		m := v
		parts := strings.Split(kv[i].(string), ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = kv[i+1]
	}
	return v
}

// allSecrets mounts every kind of secret the chart knows.
func allSecrets(kv ...any) map[string]any {
	return with(append([]any{
		"secrets.postgresPassword.existingSecret", "pg-password",
		"secrets.postgresTLS.existingSecret", "pg-tls",
		"config.postgres.dsn", "postgres://outbox_cdc@db.shop.svc:5432/shop?sslmode=verify-full&sslrootcert=/var/run/secrets/outbox-cdc/postgres-tls/ca.crt",
		"secrets.kafkaSASLPassword.existingSecret", "kafka-sasl",
		"secrets.kafkaTLS.existingSecret", "kafka-tls",
		"secrets.kafkaTLS.certKey", "tls.crt",
		"secrets.kafkaTLS.keyKey", "tls.key",
		"config.kafka.sasl.mechanism", "SCRAM-SHA-512",
		"config.kafka.sasl.username", "outbox-cdc",
	}, kv...)...)
}

// variants are the renderings every structural check runs on.
var variants = map[string]func() map[string]any{
	"required values": required,
	"all secrets, ServiceMonitor and rules": func() map[string]any {
		return allSecrets("metrics.serviceMonitor.enabled", true, "prometheusRule.enabled", true)
	},
	"PodMonitor, DSN from a Secret, hard anti-affinity": func() map[string]any {
		v := with("metrics.podMonitor.enabled", true, "prometheusRule.enabled", true,
			"secrets.postgresDSN.existingSecret", "pg-dsn", "podAntiAffinity", "hard",
			"env", []any{map[string]any{"name": "OUTBOX_CDC_LOG_LEVEL", "value": "debug"}})
		delete(v["config"].(map[string]any)["postgres"].(map[string]any), "dsn")
		return v
	},
	"OAuth client secret from a Secret, NetworkPolicy, pprof": func() map[string]any {
		return with("config.kafka.sasl.mechanism", "OAUTHBEARER", "config.kafka.sasl.oauth.token_url", "https://idp.example/token",
			"config.kafka.sasl.oauth.client_id", "outbox-cdc", "secrets.kafkaOAuthClientSecret.existingSecret", "kafka-oauth",
			"networkPolicy.enabled", true, "networkPolicy.ingressFrom", []any{map[string]any{
				"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}}}},
			"config.http.pprof", true, "config.http.pprof_any_address", true)
	},
	"OAuth token file from a Secret": func() map[string]any {
		return with("config.kafka.sasl.mechanism", "OAUTHBEARER", "secrets.kafkaOAuthToken.existingSecret", "kafka-token")
	},
	"AWS_MSK_IAM access keys from a Secret, NetworkPolicy from nowhere": func() map[string]any {
		return with("config.kafka.sasl.mechanism", "AWS_MSK_IAM", "config.kafka.tls.enabled", true,
			"secrets.awsCredentials.existingSecret", "aws", "secrets.awsCredentials.sessionTokenKey", "AWS_SESSION_TOKEN",
			"networkPolicy.enabled", true)
	},
	"AWS_MSK_IAM web identity token from a Secret": func() map[string]any {
		return with("config.kafka.sasl.mechanism", "AWS_MSK_IAM", "config.kafka.tls.enabled", true,
			"secrets.awsWebIdentity.existingSecret", "aws-token", "secrets.awsWebIdentity.roleARN", "arn:aws:iam::123456789012:role/outbox-cdc")
	},
	"one replica, no PDB, readiness on /readyz": func() map[string]any {
		return with("replicaCount", 1, "podDisruptionBudget.enabled", false, "probes.readinessPath", "/readyz", "podAntiAffinity", "")
	},
}

func mustRender(t *testing.T, values map[string]any) *manifests {
	t.Helper()
	m, err := render(values)
	if err != nil {
		t.Fatal(err)
	}
	if m.deployment == nil || m.configMap == nil || m.service == nil {
		t.Fatalf("rendered %v: want a Deployment, a ConfigMap and a Service", m.seen)
	}
	return m
}

// TestChartRenders checks each variant's manifests against each other and
// against what the connector accepts.
func TestChartRenders(t *testing.T) {
	for name, values := range variants {
		t.Run(name, func(t *testing.T) {
			m := mustRender(t, values())
			checkDeployment(t, m)
			checkConnectorConfig(t, m)
			checkMonitors(t, m)
			checkSecretsStayOut(t, m)
			checkNetworkPolicy(t, m)
			if m.prometheusRule != nil {
				checkRules(t, m.prometheusRule)
			}
			if !strings.Contains(m.notes, "/readyz") {
				t.Errorf("NOTES.txt does not say how to find the streaming replica:\n%s", m.notes)
			}
		})
	}
}

func checkDeployment(t *testing.T, m *manifests) {
	t.Helper()
	d := m.deployment
	pod := d.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("Deployment selector %v does not match its pod labels %v", d.Spec.Selector, pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if c.Name == "" || c.Image == "" || strings.HasSuffix(c.Image, ":") {
		t.Errorf("container name %q image %q", c.Name, c.Image)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	// Names the API server validates and the typed decoding does not.
	var invalid []string
	for _, n := range append([]string{c.Name}, volumeNames(pod.Spec.Volumes)...) {
		invalid = append(invalid, validation.IsDNS1123Label(n)...)
	}
	for n := range ports {
		invalid = append(invalid, validation.IsValidPortName(n)...)
	}
	for _, e := range c.Env {
		invalid = append(invalid, validation.IsEnvVarName(e.Name)...)
	}
	if len(invalid) > 0 {
		t.Errorf("invalid names in the Deployment: %v", invalid)
	}
	for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", what)
			continue
		}
		if _, ok := ports[p.HTTPGet.Port.StrVal]; !ok && p.HTTPGet.Port.Type == intstr.String {
			t.Errorf("%s probe on port %q, not a container port (%v)", what, p.HTTPGet.Port.StrVal, ports)
		}
		if !slices.Contains([]string{"/healthz", "/readyz"}, p.HTTPGet.Path) {
			t.Errorf("%s probe path %s: the connector serves /healthz and /readyz", what, p.HTTPGet.Path)
		}
	}
	// /readyz answers 503 on the standby: as liveness it would restart the
	// standby for ever.
	if p := c.LivenessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe on %s, want /healthz (the standby waiting for the slot must stay alive)", p.HTTPGet.Path)
	}

	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.Name] = vm
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
		if _, ok := mounts[v.Name]; !ok {
			t.Errorf("volume %s is not mounted", v.Name)
		}
	}
	for name := range mounts {
		if _, ok := vols[name]; !ok {
			t.Errorf("volumeMount %s has no volume", name)
		}
	}
	if cm := vols["config"].ConfigMap; cm == nil || cm.Name != m.configMap.Name {
		t.Errorf("volume config: %+v, want the ConfigMap %s", vols["config"], m.configMap.Name)
	}

	sc, psc := c.SecurityContext, pod.Spec.SecurityContext
	if sc == nil || psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil ||
		!*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("security context %+v / pod %+v: want non-root, read-only root filesystem, no privilege escalation", sc, psc)
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Error("the service account token is mounted; the connector calls no Kubernetes API")
	}

	// The Service reaches the pods on the HTTP port, the standby's too.
	svc := m.service
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, pod.Labels)
	}
	for _, p := range svc.Spec.Ports {
		if _, ok := ports[p.TargetPort.StrVal]; !ok {
			t.Errorf("Service port %s targets %q, not a container port", p.Name, p.TargetPort.String())
		}
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Error("Service does not publish not-ready addresses: with readiness on /readyz the standby would not be scraped")
	}
	if m.pdb != nil {
		s, err := metav1.LabelSelectorAsSelector(m.pdb.Spec.Selector)
		if err != nil || !s.Matches(labels.Set(pod.Labels)) {
			t.Errorf("PodDisruptionBudget selector %v does not select the pods (%v)", m.pdb.Spec.Selector, err)
		}
		if (m.pdb.Spec.MaxUnavailable == nil) == (m.pdb.Spec.MinAvailable == nil) {
			t.Error("PodDisruptionBudget: want exactly one of maxUnavailable and minAvailable")
		}
	}
	if m.serviceAccount != nil && m.serviceAccount.Name != pod.Spec.ServiceAccountName {
		t.Errorf("pods run as %s, the chart creates %s", pod.Spec.ServiceAccountName, m.serviceAccount.Name)
	}
}

// checkConnectorConfig loads the rendered configuration the way the
// container does (the file named by the args, the environment on top) and
// checks that the chart's wiring points where it mounts things.
func checkConnectorConfig(t *testing.T, m *manifests) {
	t.Helper()
	pod := m.deployment.Spec.Template.Spec
	c := pod.Containers[0]
	cfgPath := argAfter(c.Args, "--config")
	var configMount *corev1.VolumeMount
	for i, vm := range c.VolumeMounts {
		if vm.Name == "config" {
			configMount = &c.VolumeMounts[i]
		}
	}
	if c.Args[0] != "run" || configMount == nil || filepath.Dir(cfgPath) != configMount.MountPath {
		t.Fatalf("args %v, config mounted at %+v: want run --config <file in the mount>", c.Args, configMount)
	}
	text, ok := m.configMap.Data[filepath.Base(cfgPath)]
	if !ok {
		t.Fatalf("the ConfigMap has no key %s (keys %v)", filepath.Base(cfgPath), m.configMap.Data)
	}
	// The pod's view: every mounted Secret's keys as files under root.
	root := t.TempDir()
	text = mountSecrets(t, root, pod, c, text)
	file := filepath.Join(root, "outbox-cdc.yaml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			v = "postgres://outbox_cdc@db:5432/shop" // the Secret's content, here a stand-in
		}
		env = append(env, e.Name+"="+v)
		if strings.HasPrefix(e.Name, "AWS_") { // read from the process environment
			t.Setenv(e.Name, v)
		}
	}
	// Load also reads the *_file keys and the TLS files: each must be a key
	// of a Secret mounted there.
	cfg, err := config.Load(file, env)
	if err != nil {
		t.Fatalf("the connector refuses the rendered configuration: %v\n%s", err, text)
	}
	if _, after, ok := strings.Cut(string(cfg.Postgres.DSN), "sslrootcert="); ok {
		root, _, _ := strings.Cut(after, "&")
		if _, err := os.Stat(root); err != nil {
			t.Errorf("postgres.dsn sslrootcert: %v", err)
		}
	}

	_, port, _ := strings.Cut(cfg.HTTP.Listen, ":")
	if host, _, _ := strings.Cut(cfg.HTTP.Listen, ":"); host != "0.0.0.0" {
		t.Errorf("http.listen %s: the kubelet and Prometheus connect from outside the pod", cfg.HTTP.Listen)
	}
	if len(c.Ports) == 0 || strconv.Itoa(int(c.Ports[0].ContainerPort)) != port {
		t.Errorf("http.listen %s, container ports %v", cfg.HTTP.Listen, c.Ports)
	}
	if grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second; grace <= cfg.Kafka.DrainTimeout {
		t.Errorf("terminationGracePeriodSeconds %v <= kafka.drain_timeout %v: the kubelet kills the drain", grace, cfg.Kafka.DrainTimeout)
	}
	if cfg.Checkpoint.Store == "file" {
		t.Error("checkpoint.store file: not shared by the replicas, not kept with the pod")
	}
}

func volumeNames(vs []corev1.Volume) []string {
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	return names
}

func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// mountSecrets writes the keys of every Secret volume c mounts under root
// (the test CA, a client certificate and its key as PEM, the rest as a password; "ca.crt" for a
// Secret mounted whole) and returns text with the mount paths moved there.
func mountSecrets(t *testing.T, root string, pod corev1.PodSpec, c corev1.Container, text string) string {
	t.Helper()
	ca, err := testenv.NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.ClientCert("outbox-cdc")
	if err != nil {
		t.Fatal(err)
	}
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			if !vm.ReadOnly {
				t.Errorf("Secret %s is mounted writable", v.Secret.SecretName)
			}
			keys := []string{"ca.crt"}
			if len(v.Secret.Items) > 0 {
				keys = nil
				for _, it := range v.Secret.Items {
					keys = append(keys, it.Path)
				}
			}
			dir := filepath.Join(root, vm.MountPath)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				content := []byte("secret\n")
				switch {
				case k == "ca.crt":
					content = ca.CertPEM
				case filepath.Ext(k) == ".crt":
					content = cert
				case filepath.Ext(k) == ".key":
					content = key
				}
				if err := os.WriteFile(filepath.Join(dir, k), content, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			text = strings.ReplaceAll(text, vm.MountPath+"/", filepath.Join(root, vm.MountPath)+"/")
		}
	}
	return text
}
