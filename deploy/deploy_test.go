package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-cdc/outbox-cdc/inbox"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
)

// pendingConnectorMetrics are used by the dashboard before the binary
// exports them. A name is allowed here ONLY while it is not exported: the
// test fails once it is, so the entry gets removed. (It held
// outbox_cdc_slot_retained_wal_bytes until internal/metrics exported it.)
var pendingConnectorMetrics = []string{}

const repo = ".." // tests run in deploy/

// Paths inside the containers that several files must agree on.
const (
	imageConfigPath  = "/etc/outbox-cdc/outbox-cdc.yaml"
	grafanaDashboard = "/var/lib/grafana/dashboards"
)

type composeFile struct {
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
}

type service struct {
	Image       string    `yaml:"image"`
	Build       any       `yaml:"build"`
	Command     any       `yaml:"command"`
	Environment yaml.Node `yaml:"environment"`
	Ports       []string  `yaml:"ports"`
	Volumes     []string  `yaml:"volumes"`
	DependsOn   yaml.Node `yaml:"depends_on"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	readYAML(t, "docker-compose.yml", &c)
	for _, name := range []string{"postgres", "kafka", "outbox-cdc", "prometheus", "grafana"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("docker-compose.yml: no service %q", name)
		}
	}
	return c
}

// env returns a service's environment as KEY=VALUE entries; compose allows a
// map or a list.
func (s service) env(t *testing.T) []string {
	t.Helper()
	var out []string
	switch s.Environment.Kind {
	case 0:
	case yaml.MappingNode:
		var m map[string]*string
		if err := s.Environment.Decode(&m); err != nil {
			t.Fatalf("environment: %v", err)
		}
		for k, v := range m {
			if v != nil {
				out = append(out, k+"="+*v)
			}
		}
	case yaml.SequenceNode:
		if err := s.Environment.Decode(&out); err != nil {
			t.Fatalf("environment: %v", err)
		}
	default:
		t.Fatalf("environment: unexpected YAML kind %v", s.Environment.Kind)
	}
	sort.Strings(out)
	return out
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v
		}
	}
	return ""
}

func commandArgs(t *testing.T, s service) []string {
	t.Helper()
	switch c := s.Command.(type) {
	case nil:
		return nil
	case string:
		return strings.Fields(c)
	case []any:
		var out []string
		for _, a := range c {
			out = append(out, fmt.Sprint(a))
		}
		return out
	}
	t.Fatalf("command: unexpected %T", s.Command)
	return nil
}

func hostPort(t *testing.T, what, s string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		t.Fatalf("%s %q: %v", what, s, err)
	}
	return h, p
}

// TestComposeConnectorConfig checks the outbox-cdc service's environment
// against internal/config, alone and on top of the image's config file, and
// that the hosts it names are services listening where it connects.
func TestComposeConnectorConfig(t *testing.T) {
	c := loadCompose(t)
	svc := c.Services["outbox-cdc"]
	env := svc.env(t)
	var outboxEnv []string
	for _, kv := range env {
		if strings.HasPrefix(kv, config.EnvPrefix) {
			outboxEnv = append(outboxEnv, kv)
		}
	}
	if len(outboxEnv) == 0 {
		t.Fatal("outbox-cdc service has no OUTBOX_CDC_* environment")
	}
	cfg, err := config.Load("", outboxEnv)
	if err != nil {
		t.Fatalf("outbox-cdc environment rejected by config.Load: %v", err)
	}
	// The image runs with deploy/outbox-cdc.yaml; the same environment must
	// be valid on top of it, with the same effective endpoints.
	fileCfg, err := config.Load("outbox-cdc.yaml", outboxEnv)
	if err != nil {
		t.Fatalf("deploy/outbox-cdc.yaml + compose environment rejected by config.Load: %v", err)
	}
	if fileCfg.Postgres.DSN != cfg.Postgres.DSN || !slices.Equal(fileCfg.Kafka.Brokers, cfg.Kafka.Brokers) || fileCfg.HTTP.Listen != cfg.HTTP.Listen {
		t.Errorf("the image's config file changes the compose endpoints: %s %v %s", fileCfg.Postgres.DSN, fileCfg.Kafka.Brokers, fileCfg.HTTP.Listen)
	}
	if imageOnly, err := config.Load("outbox-cdc.yaml", nil); err == nil {
		t.Errorf("deploy/outbox-cdc.yaml alone is valid (dsn %q): it should leave postgres.dsn and kafka.brokers to the environment", imageOnly.Postgres.DSN)
	}

	// PostgreSQL: the DSN's host is the postgres service, on its port, with
	// logical decoding on.
	u, err := url.Parse(string(cfg.Postgres.DSN))
	if err != nil || u.Hostname() == "" {
		t.Fatalf("postgres.dsn %q: want the URL form with a host (%v)", cfg.Postgres.DSN, err)
	}
	pg, ok := c.Services[u.Hostname()]
	if !ok {
		t.Fatalf("postgres.dsn host %q is not a compose service", u.Hostname())
	}
	if p := u.Port(); p != "" && p != "5432" {
		t.Errorf("postgres.dsn port %s, the server listens on 5432", p)
	}
	args := strings.Join(commandArgs(t, pg), " ")
	if !strings.Contains(args, "wal_level=logical") {
		t.Errorf("service %s does not run with wal_level=logical: command %q", u.Hostname(), args)
	}
	pgEnv := pg.env(t)
	if user := u.User.Username(); user != envValue(pgEnv, "POSTGRES_USER") {
		t.Errorf("postgres.dsn user %q, the server creates %q", user, envValue(pgEnv, "POSTGRES_USER"))
	}
	if pw, _ := u.User.Password(); pw != envValue(pgEnv, "POSTGRES_PASSWORD") {
		t.Error("postgres.dsn password differs from POSTGRES_PASSWORD")
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != envValue(pgEnv, "POSTGRES_DB") {
		t.Errorf("postgres.dsn database %q, the server creates %q", db, envValue(pgEnv, "POSTGRES_DB"))
	}

	// Kafka: every broker is a service advertising exactly that address.
	for _, b := range cfg.Kafka.Brokers {
		host, _ := hostPort(t, "kafka.brokers entry", b)
		k, ok := c.Services[host]
		if !ok {
			t.Errorf("kafka.brokers host %q is not a compose service", host)
			continue
		}
		adv := envValue(k.env(t), "KAFKA_ADVERTISED_LISTENERS")
		if !strings.Contains(","+adv, "://"+b) {
			t.Errorf("broker %s is not among service %s's advertised listeners %q", b, host, adv)
		}
	}

	// The connector starts after the servers are healthy.
	for _, dep := range []string{u.Hostname(), strings.Split(cfg.Kafka.Brokers[0], ":")[0]} {
		var deps map[string]struct {
			Condition string `yaml:"condition"`
		}
		if err := svc.DependsOn.Decode(&deps); err != nil || deps[dep].Condition != "service_healthy" {
			t.Errorf("outbox-cdc should depend on %s with condition service_healthy (%v)", dep, err)
		}
	}

	// HTTP: reachable from the Prometheus container, scraped on that port.
	host, port := hostPort(t, "http.listen", cfg.HTTP.Listen)
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("http.listen %s: Prometheus in another container cannot reach %s; listen on 0.0.0.0", cfg.HTTP.Listen, host)
	}
	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "deploy/prometheus/prometheus.yml", &prom)
	scraped := false
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				h, p := hostPort(t, "scrape target", target)
				if h != "outbox-cdc" {
					continue
				}
				scraped = true
				if p != port {
					t.Errorf("Prometheus job %s scrapes %s, but http.listen is %s", sc.JobName, target, cfg.HTTP.Listen)
				}
				if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
					t.Errorf("Prometheus job %s scrapes %s, the connector serves /metrics", sc.JobName, sc.MetricsPath)
				}
			}
		}
	}
	if !scraped {
		t.Error("deploy/prometheus/prometheus.yml has no target outbox-cdc:<port>")
	}
	published := false
	for _, p := range svc.Ports {
		if strings.HasSuffix(p, ":"+port) {
			published = true
		}
	}
	if !published {
		t.Errorf("outbox-cdc service does not publish the metrics port %s (ports %v)", port, svc.Ports)
	}
}

// TestComposeFiles checks the files the services mount and the Grafana
// provisioning.
func TestComposeFiles(t *testing.T) {
	c := loadCompose(t)
	mounts := map[string]string{} // container path → host path
	for name, s := range c.Services {
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				t.Errorf("service %s volume %q: want source:target", name, v)
				continue
			}
			src, dst := parts[0], parts[1]
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				if _, err := os.Stat(filepath.Join(repo, src)); err != nil {
					t.Errorf("service %s mounts %s: %v", name, src, err)
				}
				mounts[dst] = src
			} else if _, ok := c.Volumes[src]; !ok {
				t.Errorf("service %s uses volume %q, not declared under volumes", name, src)
			}
		}
	}
	for _, path := range []string{"/docker-entrypoint-initdb.d/10-outbox.sql", "/etc/prometheus/prometheus.yml", "/etc/grafana/provisioning", grafanaDashboard} {
		if _, ok := mounts[path]; !ok {
			t.Errorf("nothing is mounted at %s", path)
		}
	}

	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, "deploy/grafana/provisioning/datasources/prometheus.yml", &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].UID != "prometheus" {
		t.Fatalf("datasources: %+v, want one prometheus datasource with uid prometheus (the dashboards use it)", ds.Datasources)
	}
	u, err := url.Parse(ds.Datasources[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Services[u.Hostname()]; !ok || u.Port() != "9090" {
		t.Errorf("datasource URL %s: want a compose service on Prometheus's port 9090", u)
	}

	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "deploy/grafana/provisioning/dashboards/outbox-cdc.yml", &prov)
	if len(prov.Providers) != 1 || prov.Providers[0].Options.Path != grafanaDashboard {
		t.Errorf("dashboard provider %+v, want path %s (where compose mounts deploy/grafana/dashboards)", prov.Providers, grafanaDashboard)
	}
	if home := envValue(c.Services["grafana"].env(t), "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"); home != "" {
		if _, err := os.Stat(filepath.Join(repo, "deploy/grafana/dashboards", strings.TrimPrefix(home, grafanaDashboard+"/"))); err != nil {
			t.Errorf("Grafana home dashboard %s: %v", home, err)
		}
	}
}

// TestDockerfile checks the image's entry point and config path, and that
// .dockerignore keeps what the build needs.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	for _, want := range []string{
		`CGO_ENABLED=0`,
		`./cmd/outbox-cdc`,
		`COPY deploy/outbox-cdc.yaml ` + imageConfigPath,
		`ENTRYPOINT ["/usr/local/bin/outbox-cdc"]`,
		`CMD ["run", "--config", "` + imageConfigPath + `"]`,
		`USER nonroot`,
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
	if n := len(regexp.MustCompile(`(?m)^FROM `).FindAllString(df, -1)); n < 2 {
		t.Errorf("Dockerfile has %d stages, want a multi-stage build", n)
	}
	if c := loadCompose(t).Services["outbox-cdc"]; c.Build == nil {
		t.Error("compose service outbox-cdc is not built from the Dockerfile")
	}

	ig, err := os.ReadFile(filepath.Join(repo, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	needed := []string{"go.mod", "go.sum", "cmd/outbox-cdc/main.go", "deploy/outbox-cdc.yaml", "internal/cli/cli.go", "sql/outbox.sql"}
	for line := range strings.SplitSeq(string(ig), "\n") {
		pat := strings.TrimSpace(line)
		if pat == "" || strings.HasPrefix(pat, "#") || strings.HasPrefix(pat, "!") {
			continue
		}
		pat = strings.TrimPrefix(strings.TrimPrefix(pat, "**/"), "/")
		for _, n := range needed {
			if ok, _ := filepath.Match(pat, n); ok || strings.HasPrefix(n, strings.TrimSuffix(pat, "/")+"/") {
				t.Errorf(".dockerignore pattern %q excludes %s", line, n)
			}
		}
	}
}

// dashboardMetrics returns every metric name used by a Grafana dashboard's
// PromQL expressions, and the expressions.
func dashboardMetrics(t *testing.T, path string) (map[string]bool, []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, path))
	if err != nil {
		t.Fatal(err)
	}
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "expr" {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(d)
	names := map[string]bool{}
	for _, e := range exprs {
		for _, n := range promqlMetrics(e) {
			names[n] = true
		}
	}
	return names, exprs
}

var (
	promStrings   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promVariables = regexp.MustCompile(`\$\{?\w+\}?`)
	promMatchers  = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promToken     = regexp.MustCompile(`[0-9][0-9a-zA-Z_.]*|[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true,
		"atan2": true, "Inf": true, "NaN": true}
)

// promqlMetrics extracts the metric names of a PromQL expression: the
// identifiers left after removing strings, variables, label matchers, ranges
// and grouping clauses that are not function calls, keywords or numbers.
func promqlMetrics(expr string) []string {
	s := promStrings.ReplaceAllString(expr, `""`)
	s = promVariables.ReplaceAllString(s, "")
	s = promMatchers.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range promToken.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		if tok[0] >= '0' && tok[0] <= '9' || promKeywords[tok] {
			continue
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function
		}
		names = append(names, tok)
	}
	return names
}

func TestPromQLExtraction(t *testing.T) {
	for expr, want := range map[string][]string{
		`histogram_quantile(0.99, sum by (le) (rate(outbox_cdc_commit_to_ack_seconds_bucket[$__rate_interval])))`: {"outbox_cdc_commit_to_ack_seconds_bucket"},
		`sum(rate(a_total{job="x", le=~"1|2"}[5m] offset 1h)) / on(instance) group_left(foo) b_total > bool 1e-9`: {"a_total", "b_total"},
		`max without (instance) (c) unless d{x='}'}`:                                                              {"c", "d"},
		`label_replace(up, "a", "$1", "b", "(.*)")`:                                                               {"up"},
	} {
		if got := promqlMetrics(expr); !slices.Equal(got, want) {
			t.Errorf("promqlMetrics(%s) = %v, want %v", expr, got, want)
		}
	}
}

// TestConnectorDashboardMetrics checks that every metric the outbox-cdc
// dashboard queries is exported by the binary.
func TestConnectorDashboardMetrics(t *testing.T) {
	used, exprs := dashboardMetrics(t, "deploy/grafana/dashboards/outbox-cdc.json")
	have, err := metrics.New().SeriesNames()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"outbox_cdc_events_published_total", "outbox_cdc_commit_to_ack_seconds_bucket",
		"outbox_cdc_replication_lag_bytes", "outbox_cdc_slot_retained_wal_bytes", "outbox_cdc_events_dead_lettered_total",
		"outbox_cdc_contracts_waiting", "outbox_cdc_contract_violations_total", "outbox_cdc_registry_request_seconds_bucket",
		"outbox_cdc_registry_errors_total", "outbox_cdc_contract_cache_misses_total"} {
		if !used[want] {
			t.Errorf("the dashboard has no panel using %s", want)
		}
	}
	for _, p := range pendingConnectorMetrics {
		if have[p] {
			t.Errorf("%s is exported now: remove it from pendingConnectorMetrics", p)
		}
		if !used[p] {
			t.Errorf("pendingConnectorMetrics lists %s, which the dashboard does not use", p)
		}
	}
	for n := range used {
		if !have[n] && !slices.Contains(pendingConnectorMetrics, n) {
			t.Errorf("dashboard metric %s is not exported by outbox-cdc (expressions: %q)", n, exprs)
		}
	}
}

// beginner is an inbox.DB the test never uses.
type beginner struct{}

func (beginner) Begin(context.Context) (pgx.Tx, error) { panic("not used") }

// TestInboxDashboardMetrics checks the inbox dashboard against the metrics
// the inbox package registers.
func TestInboxDashboardMetrics(t *testing.T) {
	used, _ := dashboardMetrics(t, "deploy/grafana/dashboards/inbox.json")
	reg := prometheus.NewRegistry()
	c, err := inbox.New(inbox.Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, Registerer: reg,
		DB: beginner{}, Handler: func(context.Context, pgx.Tx, *kgo.Record) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	have, err := metrics.SeriesNames(reg)
	if err != nil {
		t.Fatal(err)
	}
	if len(used) == 0 {
		t.Fatal("the inbox dashboard uses no metric")
	}
	for n := range used {
		if !have[n] {
			t.Errorf("inbox dashboard metric %s is not registered by the inbox package", n)
		}
	}
}
