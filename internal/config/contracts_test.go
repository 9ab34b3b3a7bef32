package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// contractsEnv is a valid base configuration with contracts on.
var contractsEnv = []string{
	"OUTBOX_CDC_POSTGRES_DSN=postgres://cdc@db:5432/app",
	"OUTBOX_CDC_KAFKA_BROKERS=127.0.0.1:9092",
	"OUTBOX_CDC_CONTRACTS_REGISTRY_URL=http://127.0.0.1:8080/apis/ccompat/v7",
}

// TestContractsDefaults: off without a URL; with one, the documented
// defaults, and no warning (they are applied to every event).
func TestContractsDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", contractsEnv[:2])
	if err != nil || cfg.Contracts.Enabled() {
		t.Fatalf("no URL: %v, enabled %v; want off", err, cfg != nil && cfg.Contracts.Enabled())
	}
	cfg, err = Load("", contractsEnv)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	c := cfg.Contracts
	if !c.Enabled() || c.Format != "json-schema" || c.Mode != "validate" || c.SubjectStrategy != "topic_record" ||
		c.Resolution != "lookup" || c.OnViolation != "quarantine" || c.UnknownType != "quarantine" {
		t.Fatalf("defaults: %+v", c)
	}
	if w := cfg.Warnings(); len(w) != 0 {
		t.Fatalf("warnings: %v; want none", w)
	}
	if _, err := cfg.Contracts.Registry.Registry(); err != nil {
		t.Fatalf("registry config: %v", err)
	}
}

// TestContractsAvro: contracts.format avro is accepted.
func TestContractsAvro(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", append(slices.Clone(contractsEnv), "OUTBOX_CDC_CONTRACTS_FORMAT=avro"))
	if err != nil || cfg.Contracts.Format != "avro" {
		t.Fatalf("avro: %v", err)
	}
}

// TestContractsProblems: every bad value names its key and says what to do.
func TestContractsProblems(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		want []string // substrings of the error, the key first
	}{
		{"unknown format", []string{"OUTBOX_CDC_CONTRACTS_FORMAT=json"},
			[]string{`contracts.format = "json": not supported`, "use one of json-schema, avro, protobuf"}},
		{"mode", []string{"OUTBOX_CDC_CONTRACTS_MODE=wire"}, []string{`contracts.mode = "wire"`, "validate, encode"}},
		{"strategy", []string{"OUTBOX_CDC_CONTRACTS_SUBJECT_STRATEGY=TopicNameStrategy"},
			[]string{"contracts.subject_strategy", "topic_record, record, topic"}},
		{"resolution", []string{"OUTBOX_CDC_CONTRACTS_RESOLUTION=register"}, []string{"contracts.resolution", "lookup, auto"}},
		{"on_violation", []string{"OUTBOX_CDC_CONTRACTS_ON_VIOLATION=skip"}, []string{"contracts.on_violation", "quarantine, dlq, fail"}},
		{"unknown_type", []string{"OUTBOX_CDC_CONTRACTS_UNKNOWN_TYPE=drop"}, []string{"contracts.unknown_type", "quarantine, pass, fail"}},
		{"quarantine without dlq quarantine", []string{"OUTBOX_CDC_DLQ_MODE=skip"},
			[]string{`contracts.on_violation = "quarantine": parks the aggregate in order, which needs dlq.mode quarantine`,
				"or contracts.on_violation: dlq", "contracts.unknown_type", "or contracts.unknown_type: fail"}},
		{"dlq under dlq.mode quarantine", []string{"OUTBOX_CDC_CONTRACTS_ON_VIOLATION=dlq"},
			[]string{`contracts.on_violation = "dlq": dead-letters only the event, but with dlq.mode quarantine`,
				"set contracts.on_violation: quarantine (park the aggregate) or fail, or dlq.mode: skip"}},
		{"encode with structured cloudevents", []string{"OUTBOX_CDC_CONTRACTS_MODE=encode", "OUTBOX_CDC_KAFKA_FORMAT=cloudevents-structured"},
			[]string{`contracts.mode = "encode": frames the payload`, "cloudevents-binary"}},
		{"encode with an envelope", []string{"OUTBOX_CDC_CONTRACTS_MODE=encode", "OUTBOX_CDC_OUTBOX_FIELDS=tenant:envelope"},
			[]string{`contracts.mode = "encode": frames the payload`, `outbox.fields "tenant:envelope"`}},
		{"not a URL", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_URL=registry:8081"},
			[]string{"contracts.registry.url", "not an http(s) URL", "/apis/ccompat/v7"}},
		{"user info", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_URL=https://u:p@sr.example.com"},
			[]string{"contracts.registry.url: has user info", "username_file"}},
		{"tls with http", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_TLS_ENABLED=true"},
			[]string{"contracts.registry.tls.enabled", "use an https:// URL"}},
		{"tls key off", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_TLS_CA_FILE=/ca.pem"},
			[]string{"contracts.registry.tls.ca_file", "contracts.registry.tls.enabled is false", "OUTBOX_CDC_CONTRACTS_REGISTRY_TLS_ENABLED=true"}},
		{"tls bad file", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_URL=https://sr.example.com",
			"OUTBOX_CDC_CONTRACTS_REGISTRY_TLS_ENABLED=true", "OUTBOX_CDC_CONTRACTS_REGISTRY_TLS_CA_FILE=" + filepath.Join(dir, "none.pem")},
			[]string{"contracts.registry.tls.ca_file"}},
		{"half basic", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_USERNAME_FILE=" + secret},
			[]string{"contracts.registry.username_file", "need both username_file and password_file"}},
		{"token and basic", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_USERNAME_FILE=" + secret,
			"OUTBOX_CDC_CONTRACTS_REGISTRY_PASSWORD_FILE=" + secret, "OUTBOX_CDC_CONTRACTS_REGISTRY_TOKEN_FILE=" + secret},
			[]string{"contracts.registry.token_file", "keep one"}},
		{"missing token file", []string{"OUTBOX_CDC_CONTRACTS_REGISTRY_TOKEN_FILE=" + filepath.Join(dir, "none")},
			[]string{"contracts.registry.token_file", "give a file readable by this process"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load("", append(append([]string{}, contractsEnv...), tc.env...))
			if err == nil {
				t.Fatalf("%v loaded", tc.env)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error\n%v\ndoes not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error shows a secret: %v", err)
			}
		})
	}
}

// TestContractsOff: a contracts key set without contracts.registry.url is
// refused, naming the key and the URL key (and the file form too).
func TestContractsOff(t *testing.T) {
	t.Parallel()
	_, err := Load("", append(append([]string{}, contractsEnv[:2]...), "OUTBOX_CDC_CONTRACTS_MODE=encode",
		"OUTBOX_CDC_CONTRACTS_REGISTRY_TLS_ENABLED=true"))
	for _, w := range []string{`contracts.mode = "encode": set while contracts.registry.url is empty`,
		"contracts.registry.tls.enabled", "OUTBOX_CDC_CONTRACTS_REGISTRY_URL"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Fatalf("error %v does not say %q", err, w)
		}
	}
	path := filepath.Join(t.TempDir(), "c.yaml")
	yaml := "postgres: {dsn: postgres://cdc@db/app}\nkafka: {brokers: [k:9092]}\ncontracts:\n  mode: encode\n  registry: {url: https://sr.example.com}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, nil)
	if err != nil || cfg.Contracts.Mode != "encode" {
		t.Fatalf("file: %v", err)
	}
}

// TestContractsCleartextWarning: credentials over http to another host.
func TestContractsCleartextWarning(t *testing.T) {
	t.Parallel()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load("", append(append([]string{}, contractsEnv[:2]...),
		"OUTBOX_CDC_CONTRACTS_REGISTRY_URL=http://sr.example.com", "OUTBOX_CDC_CONTRACTS_REGISTRY_TOKEN_FILE="+tok))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if w := cfg.Warnings(); len(w) != 1 || !strings.Contains(w[0].Error(), "clear text") {
		t.Fatalf("warnings %v; want the clear-text one", w)
	}
}

// TestContractsDLQUnderSkip: on_violation dlq is accepted once dead letters
// do not park (dlq.mode skip); with unknown_type it may not be quarantine.
func TestContractsDLQUnderSkip(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", append(append([]string{}, contractsEnv...), "OUTBOX_CDC_DLQ_MODE=skip",
		"OUTBOX_CDC_CONTRACTS_ON_VIOLATION=dlq", "OUTBOX_CDC_CONTRACTS_UNKNOWN_TYPE=pass", "OUTBOX_CDC_CONTRACTS_MODE=encode"))
	if err != nil || cfg.Contracts.OnViolation != "dlq" {
		t.Fatalf("load: %v", err)
	}
}

// TestContractsProtobuf: contracts.format protobuf is accepted, in both
// modes.
func TestContractsProtobuf(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"validate", "encode"} {
		cfg, err := Load("", append(append([]string{}, contractsEnv...), "OUTBOX_CDC_CONTRACTS_FORMAT=protobuf",
			"OUTBOX_CDC_CONTRACTS_MODE="+mode))
		if err != nil || cfg.Contracts.Format != "protobuf" || cfg.Contracts.Mode != mode {
			t.Fatalf("protobuf, %s: %v", mode, err)
		}
	}
}
