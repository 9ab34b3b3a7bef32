package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/knadh/koanf/maps"
	"github.com/knadh/koanf/parsers/yaml"
)

// required holds the two keys without a default.
const requiredYAML = `
postgres:
  dsn: postgres://app@127.0.0.1:5432/app
kafka:
  brokers: [127.0.0.1:9092]
`

var requiredEnv = []string{
	"OUTBOX_CDC_POSTGRES_DSN=postgres://app@127.0.0.1:5432/app",
	"OUTBOX_CDC_KAFKA_BROKERS=127.0.0.1:9092",
}

// withRequired is Default plus the values of requiredYAML / requiredEnv.
func withRequired() Config {
	c := Default()
	c.Postgres.DSN = "postgres://app@127.0.0.1:5432/app"
	c.Kafka.Brokers = []string{"127.0.0.1:9092"}
	return c
}

// withRequiredYAML merges snippet over requiredYAML, so a test can set keys
// in the same sections.
func withRequiredYAML(t *testing.T, snippet string) string {
	t.Helper()
	base, err := yaml.Parser().Unmarshal([]byte(requiredYAML))
	if err != nil {
		t.Fatal(err)
	}
	over, err := yaml.Parser().Unmarshal([]byte(snippet))
	if err != nil {
		t.Fatalf("snippet %q: %v", snippet, err)
	}
	maps.IntfaceKeysToStrings(over)
	maps.Merge(over, base)
	b, err := yaml.Parser().Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "outbox-cdc.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// fieldErrors asserts err joins FieldErrors (errors.Join) and returns them.
func fieldErrors(t *testing.T, err error) []FieldError {
	t.Helper()
	if err == nil {
		t.Fatal("expected an error, got nil")
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("expected joined FieldErrors, got %T: %v", err, err)
	}
	var fields []FieldError
	for _, e := range joined.Unwrap() {
		fe, ok := e.(FieldError)
		if !ok {
			t.Fatalf("expected a FieldError, got %T: %v", e, e)
		}
		fields = append(fields, fe)
	}
	return fields
}

// hasKey asserts that one field error names key and its line contains every
// one of want.
func hasKey(t *testing.T, err error, key string, want ...string) {
	t.Helper()
	for _, f := range fieldErrors(t, err) {
		if f.Key != key {
			continue
		}
		line := f.Error()
		if !strings.HasPrefix(line, key) {
			t.Errorf("line %q does not start with the key %q", line, key)
		}
		for _, w := range want {
			if !strings.Contains(line, w) {
				t.Errorf("line %q does not contain %q", line, w)
			}
		}
		return
	}
	t.Errorf("no error for key %q in:\n%v", key, err)
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", requiredEnv)
	if err != nil {
		t.Fatal(err)
	}
	if want := withRequired(); !reflect.DeepEqual(*cfg, want) {
		t.Fatalf("defaults:\n got %#v\nwant %#v", *cfg, want)
	}
	checks := []struct {
		name string
		got  any
		want any
	}{
		{"postgres.slot", cfg.Postgres.Slot, "outbox_cdc"},
		{"postgres.publication", cfg.Postgres.Publication, "outbox_cdc"},
		{"postgres.status_interval", cfg.Postgres.StatusInterval, time.Second},
		{"postgres.reconnect_backoff_max", cfg.Postgres.ReconnectBackoffMax, 30 * time.Second},
		{"outbox.table", cfg.Outbox.Table, "public.outbox"},
		{"outbox.columns", cfg.Outbox.Columns, Columns{"id", "aggregate_type", "aggregate_id", "event_type", "payload"}},
		{"outbox.header_columns", cfg.Outbox.HeaderColumns, []string{}},
		{"kafka.topic", cfg.Kafka.Topic, "outbox.event.{aggregate_type}"},
		{"kafka.topics", cfg.Kafka.Topics, map[string]string{}},
		{"kafka.dlq_topic", cfg.Kafka.DLQTopic, "outbox.dlq"},
		{"kafka.client_id", cfg.Kafka.ClientID, "outbox-cdc"},
		{"kafka.max_buffered_records", cfg.Kafka.MaxBufferedRecords, 4000},
		{"kafka.max_buffered_bytes", cfg.Kafka.MaxBufferedBytes, int64(64 << 20)},
		{"kafka.linger", cfg.Kafka.ProducerLinger, time.Duration(0)},
		{"kafka.latency_budget", cfg.Kafka.LatencyBudget, 5 * time.Millisecond},
		{"kafka.request_timeout", cfg.Kafka.RequestTimeout, 30 * time.Second},
		{"kafka.compression", cfg.Kafka.Compression, "none"},
		{"kafka.auto_create_topics", cfg.Kafka.AutoCreateTopics, true},
		{"kafka.topic_partitions", cfg.Kafka.TopicPartitions, -1},
		{"kafka.topic_replication_factor", cfg.Kafka.TopicReplicationFactor, -1},
		{"kafka.unknown_topic_timeout", cfg.Kafka.UnknownTopicTimeout, 2 * time.Minute},
		{"kafka.quarantine_topic", cfg.Kafka.QuarantineTopic, "outbox.quarantine"},
		{"dlq.mode", cfg.DLQ.Mode, "quarantine"},
		{"http.listen", cfg.HTTP.Listen, "127.0.0.1:9187"},
		{"http.pprof", cfg.HTTP.PProf, false},
		{"log.level", cfg.Log.Level, "info"},
		{"log.format", cfg.Log.Format, "text"},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.name, c.got, c.want)
		}
	}
}

func TestRequired(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", nil)
	if cfg != nil {
		t.Errorf("Load returned a config with an error")
	}
	hasKey(t, err, "postgres.dsn", "required", "OUTBOX_CDC_POSTGRES_DSN")
	hasKey(t, err, "kafka.brokers", "required", "OUTBOX_CDC_KAFKA_BROKERS")
	want := "kafka.brokers: required; set it in the config file or OUTBOX_CDC_KAFKA_BROKERS"
	if !strings.Contains(err.Error(), want+"\n") && !strings.HasSuffix(err.Error(), want) {
		t.Errorf("error %q lacks the line %q", err, want)
	}
}

// TestDocsListEveryKey keeps the keys table of docs/configuration.md complete:
// one row per key, with its environment variable and the default Default
// gives it.
func TestDocsListEveryKey(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	def := reflect.ValueOf(Default())
	var keys []string
	for line := range strings.Lines(string(doc)) {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || leafByKey[strings.TrimSpace(cells[1])] == nil {
			continue
		}
		l, dflt := leafByKey[strings.TrimSpace(cells[1])], strings.TrimSpace(cells[2])
		keys = append(keys, l.key)
		if env, _, _ := strings.Cut(strings.TrimSpace(cells[3]), " "); env != l.env {
			t.Errorf("%s: documented variable %s, want %s", l.key, env, l.env)
		}
		if dflt == "required" {
			continue
		}
		raw, err := yaml.Parser().Unmarshal([]byte("v: " + dflt))
		if err != nil {
			t.Errorf("%s: default %q: %v", l.key, dflt, err)
			continue
		}
		got, fe := convert(l, raw["v"], "")
		if want := def.FieldByIndex(l.index).Interface(); fe != nil || !reflect.DeepEqual(got.Interface(), want) {
			t.Errorf("%s: documented default %s, Default has %#v (%v)", l.key, dflt, want, fe)
		}
	}
	var want []string
	for _, l := range leaves {
		want = append(want, l.key)
	}
	slices.Sort(keys)
	if slices.Sort(want); !slices.Equal(keys, want) || len(leafByKey) != len(leaves) || len(leafByEnv) != len(leaves) {
		t.Errorf("docs/configuration.md lists the keys\n%v\nwant each once\n%v", keys, want)
	}
}

func TestYAMLOverride(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		yaml  string
		check func(*Config) bool
	}{
		{"slot", "postgres: {slot: my_slot}", func(c *Config) bool { return c.Postgres.Slot == "my_slot" }},
		{"status_interval", "postgres: {status_interval: 250ms}", func(c *Config) bool { return c.Postgres.StatusInterval == 250*time.Millisecond }},
		{"failover_slot", "postgres: {failover_slot: on}", func(c *Config) bool { return c.Postgres.FailoverSlot == "on" }},
		{"table without schema", "outbox: {table: events}", func(c *Config) bool { return c.Outbox.Table == "events" }},
		{"debezium columns", "outbox: {columns: {aggregate_type: aggregatetype, aggregate_id: aggregateid, event_type: type}}", func(c *Config) bool {
			return c.Outbox.Columns == Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload"}
		}},
		{"header_columns", "outbox: {header_columns: [created_at, tenant_id]}", func(c *Config) bool {
			return reflect.DeepEqual(c.Outbox.HeaderColumns, []string{"created_at", "tenant_id"})
		}},
		{"brokers", "kafka: {brokers: ['a:9092', 'b:9093']}", func(c *Config) bool {
			return reflect.DeepEqual(c.Kafka.Brokers, []string{"a:9092", "b:9093"})
		}},
		{"topics with dotted aggregate type", "kafka: {topics: {com.acme.Order: orders.v1, user: users}}", func(c *Config) bool {
			return reflect.DeepEqual(c.Kafka.Topics, map[string]string{"com.acme.Order": "orders.v1", "user": "users"})
		}},
		{"int and quoted int", "kafka: {max_buffered_records: 5, max_buffered_bytes: '2097152'}", func(c *Config) bool {
			return c.Kafka.MaxBufferedRecords == 5 && c.Kafka.MaxBufferedBytes == 2<<20
		}},
		{"linger 0 without unit", "kafka: {linger: 0}", func(c *Config) bool { return c.Kafka.ProducerLinger == 0 && c.Kafka.LatencyBudget == 0 }},
		{"linger", "kafka: {linger: 5ms, compression: zstd}", func(c *Config) bool {
			return c.Kafka.ProducerLinger == 5*time.Millisecond && c.Kafka.Compression == "zstd" && c.Kafka.LatencyBudget == 0
		}},
		{"linger null keeps the budget", "kafka: {linger: }", func(c *Config) bool {
			return c.Kafka.ProducerLinger == 0 && c.Kafka.LatencyBudget == 5*time.Millisecond
		}},
		{"budget", "kafka: {latency_budget: 20ms}", func(c *Config) bool {
			return c.Kafka.ProducerLinger == 0 && c.Kafka.LatencyBudget == 20*time.Millisecond
		}},
		{"budget off with linger 0", "kafka: {linger: 0s, latency_budget: 0s}", func(c *Config) bool {
			return c.Kafka.ProducerLinger == 0 && c.Kafka.LatencyBudget == 0
		}},
		{"http disabled", `http: {listen: ""}`, func(c *Config) bool { return c.HTTP.Listen == "" }},
		{"http all interfaces", `http: {listen: ":9187"}`, func(c *Config) bool { return c.HTTP.Listen == ":9187" }},
		{"null keeps default", "log: {level: }\nkafka: {topics: }", func(c *Config) bool {
			return c.Log.Level == "info" && c.Kafka.Topics != nil
		}},
		{"flat dotted key", "log.format: json", func(c *Config) bool { return c.Log.Format == "json" }},
		{"number as string", "kafka: {client_id: 12345, topics: {order: 2024}}", func(c *Config) bool {
			return c.Kafka.ClientID == "12345" && c.Kafka.Topics["order"] == "2024"
		}},
		{"log", "log: {level: debug, format: json}", func(c *Config) bool { return c.Log.Level == "debug" && c.Log.Format == "json" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := Load(writeFile(t, withRequiredYAML(t, tt.yaml)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Errorf("unexpected config:\n%+v", cfg)
			}
		})
	}
}

func TestEnvOverride(t *testing.T) {
	t.Parallel()
	file := withRequiredYAML(t, `
outbox:
  columns: {aggregate_id: file_agg}
  header_columns: [a, b]
kafka:
  topics: {order: orders.file, invoice: invoices}
  linger: 1ms
http:
  listen: 127.0.0.1:1
`) + "log.format: json\n"
	tests := []struct {
		name  string
		env   []string
		check func(*Config) bool
	}{
		{"nothing set keeps the file", nil, func(c *Config) bool {
			return c.Kafka.ProducerLinger == time.Millisecond && c.Outbox.Columns.AggregateID == "file_agg" &&
				c.Log.Format == "json" && c.HTTP.Listen == "127.0.0.1:1"
		}},
		{"string", []string{"OUTBOX_CDC_POSTGRES_DSN=host=db user=app"}, func(c *Config) bool {
			return c.Postgres.DSN == "host=db user=app"
		}},
		{"nested key with underscores", []string{"OUTBOX_CDC_OUTBOX_COLUMNS_AGGREGATE_ID=aggregateid"}, func(c *Config) bool {
			return c.Outbox.Columns.AggregateID == "aggregateid"
		}},
		{"brokers comma list", []string{"OUTBOX_CDC_KAFKA_BROKERS=k1:9092, k2:9092 ,k3:9092"}, func(c *Config) bool {
			return reflect.DeepEqual(c.Kafka.Brokers, []string{"k1:9092", "k2:9092", "k3:9092"})
		}},
		{"header columns replace the file's", []string{"OUTBOX_CDC_OUTBOX_HEADER_COLUMNS=tenant"}, func(c *Config) bool {
			return reflect.DeepEqual(c.Outbox.HeaderColumns, []string{"tenant"})
		}},
		{"empty list", []string{"OUTBOX_CDC_OUTBOX_HEADER_COLUMNS="}, func(c *Config) bool {
			return len(c.Outbox.HeaderColumns) == 0
		}},
		{"map replaces the file's", []string{"OUTBOX_CDC_KAFKA_TOPICS=order=orders.v1,user=users"}, func(c *Config) bool {
			return reflect.DeepEqual(c.Kafka.Topics, map[string]string{"order": "orders.v1", "user": "users"})
		}},
		{"duration and int", []string{"OUTBOX_CDC_KAFKA_LINGER=20ms", "OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS=77"}, func(c *Config) bool {
			return c.Kafka.ProducerLinger == 20*time.Millisecond && c.Kafka.MaxBufferedRecords == 77
		}},
		{"empty string disables http", []string{"OUTBOX_CDC_HTTP_LISTEN="}, func(c *Config) bool { return c.HTTP.Listen == "" }},
		{"reserved and foreign variables are ignored", []string{
			"OUTBOX_CDC_CONFIG=/etc/outbox-cdc.yaml", "OUTBOX_CDC_TEST_PG_DSN=x", "PATH=/bin", "outbox_cdc_log_level=nope", "NOEQUALS",
		}, func(c *Config) bool { return c.Log.Level == "info" }},
		{"env wins over a flat file key", []string{"OUTBOX_CDC_LOG_FORMAT=text"}, func(c *Config) bool {
			return c.Log.Format == "text"
		}},
		{"later duplicate wins", []string{"OUTBOX_CDC_LOG_LEVEL=warn", "OUTBOX_CDC_LOG_LEVEL=error"}, func(c *Config) bool {
			return c.Log.Level == "error"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := Load(writeFile(t, file), tt.env)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Errorf("unexpected config:\n%+v", cfg)
			}
		})
	}
}

func TestEnvBadValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env  string
		key  string
		want []string
	}{
		{"OUTBOX_CDC_KAFKA_TOPICS=order", "kafka.topics", []string{"OUTBOX_CDC_KAFKA_TOPICS", "not key=value"}},
		{"OUTBOX_CDC_KAFKA_TOPICS=a=x,=y", "kafka.topics", []string{"not key=value"}},
		{"OUTBOX_CDC_KAFKA_TOPICS=a=x,a=y", "kafka.topics", []string{"twice"}},
		{"OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS=lots", "kafka.max_buffered_records", []string{"OUTBOX_CDC_KAFKA_MAX_BUFFERED_RECORDS", "not an integer", `"lots"`}},
		{"OUTBOX_CDC_POSTGRES_STATUS_INTERVAL=5", "postgres.status_interval", []string{"not a duration", "1s"}},
		{"OUTBOX_CDC_KAFKA_BROKERS=a:1,,b:2", "kafka.brokers[1]", []string{"not host:port"}},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			t.Parallel()
			_, err := Load("", append(append([]string{}, requiredEnv...), tt.env))
			hasKey(t, err, tt.key, tt.want...)
		})
	}
}

func TestUnknownYAMLKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		yaml string
		key  string
		want string
	}{
		{"postgres: {dns: x}", "postgres.dns", "did you mean postgres.dsn?"},
		{"kafka: {broker: [a:1]}", "kafka.broker", "did you mean kafka.brokers?"},
		{"kafka: {max_bufered_records: 1}", "kafka.max_bufered_records", "did you mean kafka.max_buffered_records?"},
		{"outbox: {columns: {aggregateid: x}}", "outbox.columns.aggregateid", "did you mean outbox.columns.aggregate_id?"},
		{"Postgres: {slot: x}", "Postgres", "did you mean postgres?"},
		{"dsn: x", "dsn", "did you mean postgres.dsn?"},
		{"kafka: {dsn: x}", "kafka.dsn", "did you mean postgres.dsn?"},
		{"postgres: {wibble: x}", "postgres.wibble", "keys in postgres are: dsn, "},
		{"metrics: {listen: x}", "metrics", "top-level sections are: "},
		{"log: debug", "log", "expected a section"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			_, err := Load(writeFile(t, withRequiredYAML(t, tt.yaml)), nil)
			hasKey(t, err, tt.key, tt.want)
		})
	}
	t.Run("message", func(t *testing.T) {
		t.Parallel()
		_, err := Load(writeFile(t, withRequiredYAML(t, "postgres: {dns: x}")), nil)
		if want := "postgres.dns: unknown key; did you mean postgres.dsn?"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	})
}

func TestUnknownEnv(t *testing.T) {
	t.Parallel()
	_, err := Load("", append(append([]string{}, requiredEnv...),
		"OUTBOX_CDC_KAFKA_BROKER=a:1", "OUTBOX_CDC_KAFKA_TOPICS_ORDER=x", "OUTBOX_CDC_SOMETHING=secret-value"))
	hasKey(t, err, "OUTBOX_CDC_KAFKA_BROKER", "unknown environment variable", "did you mean OUTBOX_CDC_KAFKA_BROKERS?")
	hasKey(t, err, "OUTBOX_CDC_KAFKA_TOPICS_ORDER", "unknown environment variable")
	hasKey(t, err, "OUTBOX_CDC_SOMETHING", "unknown environment variable")
	if strings.Contains(err.Error(), "secret-value") {
		t.Errorf("the value of an unknown variable is printed: %v", err)
	}
}

func TestBadTypes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		yaml string
		key  string
		want []string
	}{
		{"kafka: {brokers: 'a:9092'}", "kafka.brokers", []string{"expected a list, got a string", "[a, b]", "OUTBOX_CDC_KAFKA_BROKERS=a,b"}},
		{"outbox: {header_columns: tenant}", "outbox.header_columns", []string{"expected a list"}},
		{"outbox: {header_columns: [[a]]}", "outbox.header_columns[0]", []string{"expected a string, got a list"}},
		{"kafka: {topics: [a, b]}", "kafka.topics", []string{"expected a mapping, got a list"}},
		{"kafka: {topics: {order: {x: y}}}", `kafka.topics["order"]`, []string{"expected a string, got a mapping"}},
		{"postgres: {status_interval: 5}", "postgres.status_interval", []string{"without a unit", "500ms"}},
		{"postgres: {status_interval: fast}", "postgres.status_interval", []string{"not a duration", `"fast"`}},
		{"postgres: {reconnect_backoff_max: [1s]}", "postgres.reconnect_backoff_max", []string{"expected a duration, got a list"}},
		{"kafka: {max_buffered_records: many}", "kafka.max_buffered_records", []string{"expected an integer, got a string", `"many"`}},
		{"kafka: {max_buffered_bytes: 1.5}", "kafka.max_buffered_bytes", []string{"not an integer"}},
		{"kafka: {max_buffered_records: 99999999999999999999}", "kafka.max_buffered_records", []string{"integer"}},
		{"postgres: {slot: [a]}", "postgres.slot", []string{"expected a string, got a list"}},
		{"http: {listen: {a: b}}", "http.listen", []string{"expected a string, got a mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			t.Parallel()
			_, err := Load(writeFile(t, withRequiredYAML(t, tt.yaml)), nil)
			hasKey(t, err, tt.key, tt.want...)
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string
		want   string
	}{
		{"dsn required", func(c *Config) { c.Postgres.DSN = "" }, "postgres.dsn", "required"},
		{"dsn garbage", func(c *Config) { c.Postgres.DSN = "localhost:5432/app" }, "postgres.dsn", "keyword=value"},
		{"dsn bad url", func(c *Config) { c.Postgres.DSN = "postgres://app:p%zz@db/app" }, "postgres.dsn", "percent-encoded"},
		{"dsn unterminated quote", func(c *Config) { c.Postgres.DSN = "host=db password='abc" }, "postgres.dsn", "keyword=value"},
		{"slot upper case", func(c *Config) { c.Postgres.Slot = "Outbox" }, "postgres.slot", `"Outbox"`},
		{"slot dash", func(c *Config) { c.Postgres.Slot = "outbox-cdc" }, "postgres.slot", "a-z, 0-9 and _"},
		{"slot too long", func(c *Config) { c.Postgres.Slot = strings.Repeat("s", 64) }, "postgres.slot", "1 to 63"},
		{"slot empty", func(c *Config) { c.Postgres.Slot = "" }, "postgres.slot", "replication slot"},
		{"publication digit first", func(c *Config) { c.Postgres.Publication = "1pub" }, "postgres.publication", "not starting with a digit"},
		{"publication quote", func(c *Config) { c.Postgres.Publication = `p"; drop` }, "postgres.publication", "publication name"},
		{"status interval zero", func(c *Config) { c.Postgres.StatusInterval = 0 }, "postgres.status_interval", "wal_sender_timeout"},
		{"status interval long", func(c *Config) { c.Postgres.StatusInterval = time.Minute }, "postgres.status_interval", "30s"},
		{"backoff zero", func(c *Config) { c.Postgres.ReconnectBackoffMax = 0 }, "postgres.reconnect_backoff_max", "between"},
		{"backoff long", func(c *Config) { c.Postgres.ReconnectBackoffMax = time.Hour }, "postgres.reconnect_backoff_max", "10m0s"},
		{"failover slot unknown", func(c *Config) { c.Postgres.FailoverSlot = "yes" }, "postgres.failover_slot", "auto, on, off"},
		{"table empty", func(c *Config) { c.Outbox.Table = "" }, "outbox.table", "must not be empty"},
		{"table three parts", func(c *Config) { c.Outbox.Table = "db.public.outbox" }, "outbox.table", "too many dots"},
		{"table empty part", func(c *Config) { c.Outbox.Table = "public." }, "outbox.table", "must not be empty"},
		{"table bad char", func(c *Config) { c.Outbox.Table = "public.out box" }, "outbox.table", `"public.out box"`},
		{"column empty", func(c *Config) { c.Outbox.Columns.ID = "" }, "outbox.columns.id", "must not be empty"},
		{"column bad", func(c *Config) { c.Outbox.Columns.AggregateType = "agg-type" }, "outbox.columns.aggregate_type", "identifier"},
		{"column long", func(c *Config) { c.Outbox.Columns.AggregateID = strings.Repeat("a", 64) }, "outbox.columns.aggregate_id", "63"},
		{"column event_type", func(c *Config) { c.Outbox.Columns.EventType = "1x" }, "outbox.columns.event_type", "identifier"},
		{"field syntax", func(c *Config) { c.Outbox.Fields = []string{"type"} }, "outbox.fields[0]", "column:header[:alias]"},
		{"field placement", func(c *Config) { c.Outbox.Fields = []string{"a:header", "type:body"} }, "outbox.fields[1]", `placement "body"`},
		{"field column", func(c *Config) { c.Outbox.Fields = []string{"a-b:header"} }, "outbox.fields[0]", "identifier"},
		{"field alias twice", func(c *Config) { c.Outbox.Fields = []string{"a:header:h", "b:header:h"} }, "outbox.fields[1]", `header "h" appears twice`},
		{"standard header", func(c *Config) { c.Outbox.StandardHeaders = []string{"type"} }, "outbox.standard_headers", "id, event_type, aggregate_type"},
		{"source header", func(c *Config) { c.Outbox.SourceHeaders = []string{"txid"} }, "outbox.source_headers", "lsn, xid, commit_time"},
		{"timestamp column", func(c *Config) { c.Outbox.TimestampColumn = "created at" }, "outbox.timestamp_column", "identifier"},
		{"topic regex", func(c *Config) { c.Kafka.TopicRegex, c.Kafka.TopicReplacement = "(", "x" }, "kafka.topic_regex", "RE2"},
		{"topic replacement", func(c *Config) { c.Kafka.TopicRegex, c.Kafka.TopicReplacement = "(a)", "$2" }, "kafka.topic_regex", "group 2"},
		{"topic placeholder", func(c *Config) { c.Kafka.Topic = "e.{column:}" }, "kafka.topic", "{column:NAME}"},
		{"column payload", func(c *Config) { c.Outbox.Columns.Payload = "pay load" }, "outbox.columns.payload", "identifier"},
		{"header empty", func(c *Config) { c.Outbox.HeaderColumns = []string{"a", ""} }, "outbox.header_columns[1]", "must not be empty"},
		{"header duplicate", func(c *Config) { c.Outbox.HeaderColumns = []string{"a", "b", "a"} }, "outbox.header_columns[2]", "listed twice"},
		{"header reserved", func(c *Config) { c.Outbox.HeaderColumns = []string{"event_type"} }, "outbox.header_columns[0]", "always sent"},
		{"brokers empty", func(c *Config) { c.Kafka.Brokers = nil }, "kafka.brokers", "OUTBOX_CDC_KAFKA_BROKERS"},
		{"broker no port", func(c *Config) { c.Kafka.Brokers = []string{"a:9092", "kafka"} }, "kafka.brokers[1]", "host:port"},
		{"broker no host", func(c *Config) { c.Kafka.Brokers = []string{":9092"} }, "kafka.brokers[0]", "missing host"},
		{"broker bad port", func(c *Config) { c.Kafka.Brokers = []string{"k:99999"} }, "kafka.brokers[0]", "1 to 65535"},
		{"topic empty", func(c *Config) { c.Kafka.Topic = "" }, "kafka.topic", "must not be empty"},
		{"topic unknown placeholder", func(c *Config) { c.Kafka.Topic = "events.{event_type}" }, "kafka.topic", "unknown placeholder {event_type}"},
		{"topic unmatched brace", func(c *Config) { c.Kafka.Topic = "events.{aggregate_type" }, "kafka.topic", "unmatched {"},
		{"topic stray close", func(c *Config) { c.Kafka.Topic = "events}" }, "kafka.topic", "unmatched }"},
		{"topic bad char", func(c *Config) { c.Kafka.Topic = "events/{aggregate_type}" }, "kafka.topic", "letters, digits"},
		{"topic fixed dotdot", func(c *Config) { c.Kafka.Topic = ".." }, "kafka.topic", `".."`},
		{"topic too long", func(c *Config) { c.Kafka.Topic = strings.Repeat("t", 249) + "{aggregate_type}" }, "kafka.topic", "too long"},
		{"topics bad value", func(c *Config) { c.Kafka.Topics = map[string]string{"order": "orders v1"} }, `kafka.topics["order"]`, "letters, digits"},
		{"topics empty value", func(c *Config) { c.Kafka.Topics = map[string]string{"order": ""} }, `kafka.topics["order"]`, "empty topic name"},
		{"topics dot", func(c *Config) { c.Kafka.Topics = map[string]string{"order": "."} }, `kafka.topics["order"]`, `"."`},
		{"topics long", func(c *Config) { c.Kafka.Topics = map[string]string{"order": strings.Repeat("o", 250)} }, `kafka.topics["order"]`, "249"},
		{"topics empty key", func(c *Config) { c.Kafka.Topics = map[string]string{"": "x"} }, `kafka.topics[""]`, "empty aggregate type"},
		{"dlq bad", func(c *Config) { c.Kafka.DLQTopic = "dlq!" }, "kafka.dlq_topic", "letters, digits"},
		{"dlq empty", func(c *Config) { c.Kafka.DLQTopic = "" }, "kafka.dlq_topic", "empty"},
		{"dlq equals a fixed topic", func(c *Config) { c.Kafka.Topics = map[string]string{"order": "outbox.dlq"} }, "kafka.dlq_topic", `same as kafka.topics["order"]`},
		{"dlq produced by template", func(c *Config) { c.Kafka.DLQTopic = "outbox.event.dlq" }, "kafka.dlq_topic", `aggregate_type "dlq"`},
		{"dlq equals fixed template", func(c *Config) { c.Kafka.Topic = "events"; c.Kafka.DLQTopic = "events" }, "kafka.dlq_topic", "same as kafka.topic"},
		{"client id empty", func(c *Config) { c.Kafka.ClientID = "" }, "kafka.client_id", "must not be empty"},
		{"client id long", func(c *Config) { c.Kafka.ClientID = strings.Repeat("c", 257) }, "kafka.client_id", "256"},
		{"records zero", func(c *Config) { c.Kafka.MaxBufferedRecords = 0 }, "kafka.max_buffered_records", `"0"`},
		{"bytes zero", func(c *Config) { c.Kafka.MaxBufferedBytes = 0 }, "kafka.max_buffered_bytes", "at least"},
		{"bytes small", func(c *Config) { c.Kafka.MaxBufferedBytes = 1000 }, "kafka.max_buffered_bytes", "1 MiB"},
		{"linger negative", func(c *Config) { c.Kafka.ProducerLinger = -time.Millisecond }, "kafka.linger", "between 0 and 1m0s"},
		{"linger long", func(c *Config) { c.Kafka.ProducerLinger = 2 * time.Minute }, "kafka.linger", `"2m0s"`},
		{"latency budget long", func(c *Config) { c.Kafka.LatencyBudget = 2 * time.Second }, "kafka.latency_budget", "between 0 and 1s"},
		{"latency budget with a linger", func(c *Config) { c.Kafka.ProducerLinger = 2 * time.Millisecond }, "kafka.latency_budget", "cannot be combined with kafka.linger 2ms"},
		{"request timeout zero", func(c *Config) { c.Kafka.RequestTimeout = 0 }, "kafka.request_timeout", "between 100ms"},
		{"request timeout long", func(c *Config) { c.Kafka.RequestTimeout = time.Hour }, "kafka.request_timeout", "15m0s"},
		{"compression", func(c *Config) { c.Kafka.Compression = "brotli" }, "kafka.compression", "none, gzip, snappy, lz4, zstd"},
		{"compression case", func(c *Config) { c.Kafka.Compression = "ZSTD" }, "kafka.compression", `"ZSTD"`},
		{"partitions zero", func(c *Config) { c.Kafka.TopicPartitions = 0 }, "kafka.topic_partitions", "-1 for the broker's num.partitions"},
		{"partitions negative", func(c *Config) { c.Kafka.TopicPartitions = -2 }, "kafka.topic_partitions", "must be -1 or 1 to"},
		{"replication zero", func(c *Config) { c.Kafka.TopicReplicationFactor = 0 }, "kafka.topic_replication_factor", "3 in production"},
		{"replication too high", func(c *Config) { c.Kafka.TopicReplicationFactor = 1 << 15 }, "kafka.topic_replication_factor", "1 to 32767"},
		{"unknown topic timeout zero", func(c *Config) { c.Kafka.UnknownTopicTimeout = 0 }, "kafka.unknown_topic_timeout", "must be positive"},
		{"listen no port", func(c *Config) { c.HTTP.Listen = "localhost" }, "http.listen", "host:port"},
		{"listen bad port", func(c *Config) { c.HTTP.Listen = "localhost:http" }, "http.listen", "0 to 65535"},
		{"pprof without listen", func(c *Config) { c.HTTP.Listen, c.HTTP.PProf = "", true }, "http.pprof", "set http.listen"},
		{"pprof on all interfaces", func(c *Config) { c.HTTP.Listen, c.HTTP.PProf = "0.0.0.0:9187", true }, "http.pprof", "http.pprof_any_address: true"},
		{"pprof on all interfaces, no host", func(c *Config) { c.HTTP.Listen, c.HTTP.PProf = ":9187", true }, "http.pprof", "not a loopback address"},
		{"pprof on a routable address", func(c *Config) { c.HTTP.Listen, c.HTTP.PProf = "10.0.0.5:9187", true }, "http.pprof", "listen on 127.0.0.1"},
		{"pprof on a host name", func(c *Config) { c.HTTP.Listen, c.HTTP.PProf = "cdc.internal:9187", true }, "http.pprof", "not a loopback address"},
		{"log level", func(c *Config) { c.Log.Level = "verbose" }, "log.level", "debug, info, warn, error"},
		{"log format", func(c *Config) { c.Log.Format = "logfmt" }, "log.format", "text, json"},
		{"dlq mode", func(c *Config) { c.DLQ.Mode = "park" }, "dlq.mode", "skip, quarantine"},
		{"quarantine bound zero", func(c *Config) { c.DLQ.MaxQuarantined = 0 }, "dlq.max_quarantined", "stops the connector"},
		{"quarantine bound huge", func(c *Config) { c.DLQ.MaxQuarantined = 2_000_000 }, "dlq.max_quarantined", "1 to 1000000"},
		{"parking is the dlq", func(c *Config) { c.DLQ.Mode = DLQQuarantine; c.Kafka.ParkingTopic = "outbox.dlq" }, "kafka.parking_topic", "same as kafka.dlq_topic"},
		{"parking illegal", func(c *Config) { c.DLQ.Mode = DLQQuarantine; c.Kafka.ParkingTopic = "park!" }, "kafka.parking_topic", "letters, digits"},
		{"parking a fixed topic", func(c *Config) {
			c.DLQ.Mode = DLQQuarantine
			c.Kafka.Topics = map[string]string{"order": "outbox.parking"}
		}, "kafka.parking_topic", `same as kafka.topics["order"]`},
		{"parking produced by template", func(c *Config) { c.DLQ.Mode = DLQQuarantine; c.Kafka.ParkingTopic = "outbox.event.parked" }, "kafka.parking_topic", `aggregate_type "parked"`},
		{"quarantine topic is the dlq", func(c *Config) { c.Kafka.QuarantineTopic = "outbox.dlq" }, "kafka.quarantine_topic", "same as kafka.dlq_topic"},
		{"quarantine topic is parking", func(c *Config) { c.Kafka.QuarantineTopic = "outbox.parking" }, "kafka.quarantine_topic", "same as kafka.parking_topic"},
		{"quarantine topic illegal", func(c *Config) { c.Kafka.QuarantineTopic = "q!" }, "kafka.quarantine_topic", "letters, digits"},
		{"quarantine topic produced by template", func(c *Config) { c.Kafka.QuarantineTopic = "outbox.event.q" }, "kafka.quarantine_topic", `aggregate_type "q"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := withRequired()
			tt.mutate(&c)
			hasKey(t, c.Validate(), tt.key, tt.want)
		})
	}

	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		for _, mutate := range []func(*Config){
			func(c *Config) {},
			func(c *Config) { c.Postgres.DSN = "host=db user=app password='a b\\' c' dbname=app" },
			func(c *Config) { c.Postgres.DSN = "postgresql://app:pw@h1:5432,h2:5432/app?sslmode=require" },
			func(c *Config) { c.Outbox.Table = "outbox" },
			func(c *Config) { c.Outbox.Table = "Events.Outbox_$1" },
			func(c *Config) { c.Outbox.HeaderColumns = []string{"aggregate_id", "payload", "tenant_id"} },
			func(c *Config) {
				c.Outbox.Columns = Columns{"id", "aggregatetype", "aggregateid", "type", "payload"}
			},
			func(c *Config) { c.Kafka.Brokers = []string{"[::1]:9092", "kafka-0.kafka.svc:9093"} },
			func(c *Config) { c.Kafka.Topic = "{aggregate_type}" },
			func(c *Config) { c.Kafka.Topic = "all-events" },
			func(c *Config) { c.Kafka.Topics = map[string]string{"order": "orders.v1", "com.acme.User": "users"} },
			func(c *Config) { c.Kafka.ProducerLinger = time.Minute; c.Kafka.LatencyBudget = 0 },
			func(c *Config) { c.HTTP.Listen = "" },
			func(c *Config) { c.HTTP.Listen = ":0" },
			func(c *Config) { c.HTTP.Listen = "[::]:9187" },
			func(c *Config) { c.DLQ.Mode = DLQQuarantine },
			func(c *Config) { c.DLQ.Mode = DLQSkip; c.Kafka.ParkingTopic = "outbox.dlq" }, // unused in skip mode
			func(c *Config) { c.DLQ.Mode = DLQSkip; c.Kafka.QuarantineTopic = "outbox.parking" },
		} {
			c := withRequired()
			mutate(&c)
			if err := c.Validate(); err != nil {
				t.Errorf("%+v\nrejected: %v", c, err)
			}
		}
	})

	t.Run("all problems at once", func(t *testing.T) {
		t.Parallel()
		c := Default()
		c.Kafka.Compression = "brotli"
		c.Log.Level = "loud"
		fields := fieldErrors(t, c.Validate())
		var keys []string
		for _, f := range fields {
			keys = append(keys, f.Key)
		}
		want := []string{"postgres.dsn", "kafka.brokers", "kafka.compression", "log.level"}
		if !reflect.DeepEqual(keys, want) {
			t.Errorf("keys = %v, want %v", keys, want)
		}
		if n := strings.Count(c.Validate().Error(), "\n"); n != len(want)-1 {
			t.Errorf("want one line per field, got:\n%v", c.Validate())
		}
	})
}

func TestLoadReportsEverything(t *testing.T) {
	t.Parallel()
	file := `
postgres: {dns: x, slot: Bad-Slot}
kafka: {brokers: 'a:1', compression: brotli}
`
	_, err := Load(writeFile(t, file), []string{"OUTBOX_CDC_LOG_LEVEL=loud", "OUTBOX_CDC_NOPE=1"})
	for _, key := range []string{"postgres.dns", "postgres.dsn", "postgres.slot", "kafka.brokers", "kafka.compression", "log.level", "OUTBOX_CDC_NOPE"} {
		hasKey(t, err, key)
	}
	// kafka.brokers is reported once (as a type error), not also as "required".
	n := 0
	for _, f := range fieldErrors(t, err) {
		if f.Key == "kafka.brokers" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("kafka.brokers reported %d times:\n%v", n, err)
	}
}

func TestFileErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(missing, requiredEnv)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v does not match fs.ErrNotExist", err)
	}
	if want := "config file " + missing + ": no such file or directory"; err == nil || err.Error() != want {
		t.Errorf("missing file: %v, want %q", err, want)
	}

	for _, content := range []string{"postgres: [\n", "postgres:\n\tdsn: x\n", "- a\n- b\n", "a: 1\na: 2\n"} {
		p := writeFile(t, content)
		_, err := Load(p, requiredEnv)
		if err == nil || !strings.HasPrefix(err.Error(), "config file "+p+": ") {
			t.Errorf("bad YAML %q: %v does not name the path", content, err)
		}
	}

	// An empty file is all defaults.
	if _, err := Load(writeFile(t, ""), requiredEnv); err != nil {
		t.Errorf("empty file: %v", err)
	}
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"postgres://app:s3cret@db:5432/app", "postgres://app:xxxxx@db:5432/app"},
		{"postgresql://app:s3cret@db/app?sslmode=require", "postgresql://app:xxxxx@db/app?sslmode=require"},
		{"postgres://app@db/app", "postgres://app@db/app"},
		{"postgres://db/app?user=app&password=s3cret&sslmode=disable", "postgres://db/app?user=app&password=xxxxx&sslmode=disable"},
		{"postgres://app:s3cret@db/app?sslpassword=s3cret", "postgres://app:xxxxx@db/app?sslpassword=xxxxx"},
		{"postgres://app:s3c%zzret@db/app", "postgres://xxxxx@db/app"},
		{"postgres://app:s3c@ret@db/app", "postgres://app:xxxxx@db/app"},
		{"host=db user=app password=s3cret dbname=app", "host=db user=app password=xxxxx dbname=app"},
		{"host=db password = 's3 cret\\' x' dbname=app", "host=db password = xxxxx dbname=app"},
		{"host=db password='s3cret", "host=db password=xxxxx"},
		{"host=db password=s3\\ cret user=u", "host=db password=xxxxx user=u"},
		{"host=db PASSWORD=s3cret sslpassword=s3cret", "host=db PASSWORD=xxxxx sslpassword=xxxxx"},
		{"host=db user=app", "host=db user=app"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := RedactDSN(tt.in); got != tt.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.Contains(RedactDSN(tt.in), "s3") {
			t.Errorf("RedactDSN(%q) leaks the password", tt.in)
		}
	}
}

// TestPasswordNeverPrinted covers every way a DSN could reach a message.
func TestPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "hunter2xyz"
	dsns := []string{
		"postgres://app:" + secret + "@db/app",
		"postgres://app:" + secret + "%zz@db/app", // invalid URL
		"host=db password=" + secret,
		"host=db password='" + secret, // invalid keyword form
		"host db password=" + secret,  // invalid keyword form
	}
	for _, dsn := range dsns {
		check := func(what, s string) {
			t.Helper()
			if strings.Contains(s, secret) {
				t.Errorf("%s leaks the password of %q:\n%s", what, RedactDSN(dsn), s)
			}
		}
		// Through the file, with other errors around it.
		file := fmt.Sprintf("postgres: {dsn: %q}\nkafka: {compression: brotli}\n", dsn)
		_, err := Load(writeFile(t, file), nil)
		if err == nil {
			t.Fatal("expected an error")
		}
		check("Load (file)", err.Error())
		// Through the environment.
		_, err = Load("", []string{"OUTBOX_CDC_POSTGRES_DSN=" + dsn, "OUTBOX_CDC_LOG_LEVEL=loud"})
		check("Load (env)", err.Error())
		for _, f := range fieldErrors(t, err) {
			check("FieldError.Value", f.Value)
		}
		// A wrong type for the DSN itself.
		_, err = Load(writeFile(t, fmt.Sprintf("postgres: {dsn: [%q]}\n", dsn)), nil)
		check("Load (bad type)", err.Error())

		c := withRequired()
		c.Postgres.DSN = DSN(dsn)
		check("Validate", fmt.Sprint(c.Validate()))
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			check(verb+" Config", fmt.Sprintf(verb, c))
			check(verb+" *Config", fmt.Sprintf(verb, &c))
			check(verb+" Postgres", fmt.Sprintf(verb, c.Postgres))
		}
		js, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		check("json", string(js))
		js, err = json.Marshal(c.Postgres)
		if err != nil {
			t.Fatal(err)
		}
		check("json Postgres", string(js))
		var buf bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&buf, nil))
		logger.Info("x", "postgres", c.Postgres, "config", c)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "postgres", c.Postgres, "config", &c)
		check("slog", buf.String())
	}
}

func TestSchemaTable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ table, schema, name string }{
		{"public.outbox", "public", "outbox"},
		{"outbox", "public", "outbox"},
		{"app.events", "app", "events"},
	} {
		s, n := Outbox{Table: tt.table}.SchemaTable()
		if s != tt.schema || n != tt.name {
			t.Errorf("SchemaTable(%q) = %q, %q; want %q, %q", tt.table, s, n, tt.schema, tt.name)
		}
	}
}

func TestSchema(t *testing.T) {
	t.Parallel()
	// The env names in the brief and the contract.
	for key, env := range map[string]string{
		"postgres.dsn":                "OUTBOX_CDC_POSTGRES_DSN",
		"outbox.columns.aggregate_id": "OUTBOX_CDC_OUTBOX_COLUMNS_AGGREGATE_ID",
		"kafka.brokers":               "OUTBOX_CDC_KAFKA_BROKERS",
		"outbox.header_columns":       "OUTBOX_CDC_OUTBOX_HEADER_COLUMNS",
		"kafka.topics":                "OUTBOX_CDC_KAFKA_TOPICS",
		"kafka.linger":                "OUTBOX_CDC_KAFKA_LINGER",
		"kafka.latency_budget":        "OUTBOX_CDC_KAFKA_LATENCY_BUDGET",
		"postgres.failover_slot":      "OUTBOX_CDC_POSTGRES_FAILOVER_SLOT",
		"postgres.primary_dsn":        "OUTBOX_CDC_POSTGRES_PRIMARY_DSN",
		"http.pprof_any_address":      "OUTBOX_CDC_HTTP_PPROF_ANY_ADDRESS",
	} {
		if l := leafByKey[key]; l == nil || l.env != env {
			t.Errorf("key %s: leaf %+v, want env %s", key, l, env)
		}
	}
	if len(leaves) != 110 {
		t.Errorf("%d keys; update the docs and this test when adding one", len(leaves))
	}
}

func TestRetainWindow(t *testing.T) {
	tests := []struct {
		in    string
		d     time.Duration
		bytes int64
		bad   bool
	}{
		{"", 0, 0, false}, {"0", 0, 0, false}, {"24h", 24 * time.Hour, 0, false}, {"90s", 90 * time.Second, 0, false},
		{"512MB", 0, 512_000_000, false}, {"2GiB", 0, 2 << 30, false}, {"1048576", 0, 1 << 20, false}, {"10 KiB", 0, 10 << 10, false},
		{"-1h", 0, 0, true}, {"lots", 0, 0, true}, {"-5MB", 0, 0, true}, {"1.5GB", 0, 0, true},
	}
	for _, tt := range tests {
		d, b, err := RetainWindow(tt.in)
		if (err != nil) != tt.bad || d != tt.d || b != tt.bytes {
			t.Errorf("RetainWindow(%q) = %v, %d, %v; want %v, %d, bad=%v", tt.in, d, b, err, tt.d, tt.bytes, tt.bad)
		}
	}
}

func TestValidateOperationsKeys(t *testing.T) {
	tests := []struct {
		name string
		mod  func(c *Config)
		key  string
	}{
		{"bad retain", func(c *Config) { c.Postgres.Retain = "forever" }, "postgres.retain"},
		{"heartbeat too fast", func(c *Config) { c.Postgres.HeartbeatInterval = time.Millisecond }, "postgres.heartbeat_interval"},
		{"unknown store", func(c *Config) { c.Checkpoint.Store = "redis" }, "checkpoint.store"},
		{"file store without file", func(c *Config) { c.Checkpoint.Store = "file" }, "checkpoint.file"},
		{"table without schema", func(c *Config) { c.Checkpoint.Table = "checkpoints" }, "checkpoint.table"},
		{"unknown snapshot mode", func(c *Config) { c.Snapshot.Mode = "all" }, "snapshot.mode"},
		{"filter without pending", func(c *Config) { c.Snapshot.Filter = "true" }, "snapshot.filter"},
		{"filter with two statements", func(c *Config) { c.Snapshot.Mode = "pending"; c.Snapshot.Filter = "true; DROP TABLE x" }, "snapshot.filter"},
		{"order_by not a column name", func(c *Config) { c.Snapshot.OrderBy = "created_at; DROP TABLE x" }, "snapshot.order_by"},
		{"order_by not a name", func(c *Config) { c.Snapshot.Mode = "pending"; c.Snapshot.OrderBy = "created_at desc" }, "snapshot.order_by"},
		{"pending without a checkpoint store", func(c *Config) { c.Snapshot.Mode = "pending"; c.Checkpoint.Store = "none" }, "checkpoint.store is none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Postgres.DSN = "postgres://u@h/db"
			c.Kafka.Brokers = []string{"k:9092"}
			tt.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.key) {
				t.Fatalf("Validate() = %v, want an error naming %s", err, tt.key)
			}
		})
	}
	c := Default()
	c.Postgres.DSN = "postgres://u@h/db"
	c.Kafka.Brokers = []string{"k:9092"}
	c.Snapshot.Mode, c.Snapshot.Filter = "pending", "status = 'PENDING'"
	c.Checkpoint.Store, c.Checkpoint.File = "file", "/tmp/x"
	c.Postgres.HeartbeatInterval = 0
	if err := c.Validate(); err != nil {
		t.Fatalf("valid operations settings rejected: %v", err)
	}
}

// TestPProfListeners: the profiler is accepted on a loopback listener, and
// on any other only when asked for explicitly.
func TestPProfListeners(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		listen string
		any    bool
	}{{"127.0.0.1:9187", false}, {"127.0.0.2:0", false}, {"[::1]:9187", false}, {"localhost:9187", false},
		{"0.0.0.0:9187", true}, {":9187", true}} {
		c := Default()
		c.Postgres.DSN = "host=db dbname=app"
		c.Kafka.Brokers = []string{"kafka:9092"}
		c.HTTP.Listen, c.HTTP.PProf, c.HTTP.PProfAnyAddress = tc.listen, true, tc.any
		if err := c.Validate(); err != nil {
			t.Errorf("http.listen %s, http.pprof_any_address %v: %v", tc.listen, tc.any, err)
		}
	}
}
