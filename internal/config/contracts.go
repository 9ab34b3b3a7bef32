package config

import (
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// contracts.on_violation and contracts.unknown_type values.
const (
	// ContractsQuarantine dead-letters the event and parks its aggregate,
	// in order, as dlq.mode quarantine does.
	ContractsQuarantine = "quarantine"
	// ContractsDLQ dead-letters only the event (on_violation).
	ContractsDLQ = "dlq"
	// ContractsPass publishes the event as it is (unknown_type).
	ContractsPass = "pass"
	// ContractsFail stops the connector before the event (nothing is
	// confirmed past it).
	ContractsFail = "fail"
)

// Contracts checks every event against its schema in a schema registry
// (package contracts); off unless Registry.URL is set.
type Contracts struct {
	Registry        ContractsRegistry `koanf:"registry"`
	Format          string            `koanf:"format"`           // contracts.Formats
	Mode            string            `koanf:"mode"`             // contracts.Modes
	SubjectStrategy string            `koanf:"subject_strategy"` // contracts.Strategies
	Resolution      string            `koanf:"resolution"`       // contracts.Resolutions
	OnViolation     string            `koanf:"on_violation"`     // quarantine, dlq, fail
	UnknownType     string            `koanf:"unknown_type"`     // quarantine, pass, fail
}

// ContractsRegistry is how to reach the registry. Secrets are files only,
// read at every request (contracts.RegistryConfig).
type ContractsRegistry struct {
	URL          string   `koanf:"url"` // the Confluent API's base URL
	UsernameFile string   `koanf:"username_file"`
	PasswordFile string   `koanf:"password_file"`
	TokenFile    string   `koanf:"token_file"`
	TLS          KafkaTLS `koanf:"tls"` // the same keys as kafka.tls
}

// Enabled reports whether contracts apply: contracts.registry.url is set.
func (c Contracts) Enabled() bool { return c.Registry.URL != "" }

func defaultContracts() Contracts {
	return Contracts{Format: string(contracts.FormatJSONSchema), Mode: string(contracts.ModeValidate),
		SubjectStrategy: string(contracts.StrategyTopicRecord), Resolution: string(contracts.ResolutionLookup),
		OnViolation: ContractsQuarantine, UnknownType: ContractsQuarantine}
}

func (v *validator) contracts(c Contracts, d DLQ) {
	if !c.Enabled() {
		v.contractsOff(c)
		return
	}
	v.registryURL(c.Registry)
	v.oneOf("contracts.format", c.Format, contracts.Formats())
	if slices.Contains(contracts.Formats(), c.Format) && !contracts.Format(c.Format).Supported() {
		var supported []string
		for _, f := range contracts.Formats() {
			if contracts.Format(f).Supported() {
				supported = append(supported, f)
			}
		}
		v.add("contracts.format", c.Format, "not yet supported in this version", "use one of "+strings.Join(supported, ", "))
	}
	v.oneOf("contracts.mode", c.Mode, contracts.Modes())
	v.oneOf("contracts.subject_strategy", c.SubjectStrategy, contracts.Strategies())
	v.oneOf("contracts.resolution", c.Resolution, contracts.Resolutions())
	v.oneOf("contracts.on_violation", c.OnViolation, []string{ContractsQuarantine, ContractsDLQ, ContractsFail})
	v.oneOf("contracts.unknown_type", c.UnknownType, []string{ContractsQuarantine, ContractsPass, ContractsFail})
	// Parking an aggregate needs the quarantine machinery (parking and
	// quarantine topics, redrive), which dlq.mode skip does not run.
	for _, k := range []struct{ key, val, other string }{
		{"contracts.on_violation", c.OnViolation, ContractsDLQ},
		{"contracts.unknown_type", c.UnknownType, ContractsFail},
	} {
		if k.val == ContractsQuarantine && d.Mode != DLQQuarantine {
			v.add(k.key, k.val, "parks the aggregate in order, which needs dlq.mode quarantine, but dlq.mode is "+d.Mode,
				"set dlq.mode: quarantine, or "+k.key+": "+k.other)
		}
	}
	// Under dlq.mode quarantine both producers quarantine the key of every
	// dead letter that has one (sink.Produce, exactlyonce's route): a
	// violation dead-lettered alone cannot be told apart there yet.
	if c.OnViolation == ContractsDLQ && d.Mode == DLQQuarantine {
		v.add("contracts.on_violation", c.OnViolation,
			"dead-letters only the event, but with dlq.mode quarantine every dead letter parks its aggregate's later events",
			"set contracts.on_violation: quarantine (park the aggregate) or fail, or dlq.mode: skip")
	}
}

// contractsEncode: in encode mode the record value is the framed payload,
// so it cannot also be a JSON envelope (kafka.format
// cloudevents-structured, an outbox.fields envelope member).
func (v *validator) contractsEncode(c *Config) {
	if !c.Contracts.Enabled() || c.Contracts.Mode != string(contracts.ModeEncode) {
		return
	}
	for _, tc := range c.PerTable() {
		if tc.Kafka.Format == router.FormatCEStructured {
			v.add("contracts.mode", c.Contracts.Mode, "frames the payload as the record value, but kafka.format "+
				router.FormatCEStructured+" makes the value a JSON envelope",
				"use kafka.format "+router.FormatCEBinary+" (the value is the data), or contracts.mode: validate")
			return
		}
		for _, f := range tc.Outbox.Fields {
			if fd, err := router.ParseField(f); err == nil && fd.Placement == router.PlaceEnvelope {
				v.add("contracts.mode", c.Contracts.Mode, "frames the payload as the record value, but outbox.fields "+
					strconv.Quote(f)+" makes the value a JSON envelope",
					"place the column as a header, or use contracts.mode: validate")
				return
			}
		}
	}
}

// contractsOff reports contracts keys set while contracts are off: the
// operator meant them to apply.
func (v *validator) contractsOff(c Contracts) {
	def := reflect.ValueOf(defaultContracts())
	var walk func(rv, dv reflect.Value, prefix string)
	walk = func(rv, dv reflect.Value, prefix string) {
		for i := range rv.NumField() {
			key := prefix + "." + rv.Type().Field(i).Tag.Get("koanf")
			if f := rv.Field(i); f.Kind() == reflect.Struct {
				walk(f, dv.Field(i), key)
			} else if !f.Equal(dv.Field(i)) {
				v.add(key, fmt.Sprint(f), "set while contracts.registry.url is empty, so contracts are off and it would be ignored",
					"set contracts.registry.url to the registry's Confluent API ("+envName("contracts.registry.url")+"), or remove "+key)
			}
		}
	}
	walk(reflect.ValueOf(c), def, "contracts")
}

// registryURL checks the URL, the credentials files and TLS.
func (v *validator) registryURL(r ContractsRegistry) {
	u, err := url.Parse(r.URL)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https"):
		v.add("contracts.registry.url", r.URL, "not an http(s) URL",
			"give the Confluent API's base URL, such as http://registry:8080/apis/ccompat/v7 (Apicurio) or https://sr.example.com")
		return
	case u.User != nil:
		v.add("contracts.registry.url", "", "has user info",
			"remove it: put the credentials in contracts.registry.username_file and password_file")
	case u.Scheme == "http" && r.TLS.Enabled:
		v.add("contracts.registry.tls.enabled", "true", "set with an http:// contracts.registry.url, so TLS would not be used",
			"use an https:// URL")
	}
	switch basic := r.UsernameFile != "" || r.PasswordFile != ""; {
	case basic && r.TokenFile != "":
		v.add("contracts.registry.token_file", r.TokenFile, "set together with username_file/password_file",
			"keep one: a bearer token or basic credentials")
	case basic && (r.UsernameFile == "" || r.PasswordFile == ""):
		v.add("contracts.registry.username_file", r.UsernameFile, "basic credentials need both username_file and password_file",
			"set both, or neither")
	}
	for _, f := range [][2]string{{"contracts.registry.username_file", r.UsernameFile},
		{"contracts.registry.password_file", r.PasswordFile}, {"contracts.registry.token_file", r.TokenFile}} {
		if _, err := kafkaopt.ReadSecretFile(f[1]); f[1] != "" && err != nil {
			v.add(f[0], f[1], err.Error(), "give a file readable by this process that holds only the secret")
		}
	}
	v.tlsSection("contracts.registry.tls", r.TLS)
}

// contractsWarnings: registry credentials sent in clear text.
func (c *Config) contractsWarnings() []FieldError {
	if !c.Contracts.Enabled() {
		return nil
	}
	var out []FieldError
	r := c.Contracts.Registry
	if u, err := url.Parse(r.URL); err == nil && u.Scheme == "http" && !isLoopback(u.Hostname()) && (r.UsernameFile != "" || r.TokenFile != "") {
		out = append(out, FieldError{Key: "contracts.registry.url", Value: r.URL,
			Problem: "credentials over plain http are sent in clear text; use an https:// URL with contracts.registry.tls"})
	}
	return out
}

// Registry is what contracts.New needs to reach the registry; its TLS
// files are read now (Validate has checked them).
func (r ContractsRegistry) Registry() (contracts.RegistryConfig, error) {
	cfg := contracts.RegistryConfig{URL: r.URL, UsernameFile: r.UsernameFile, PasswordFile: r.PasswordFile, TokenFile: r.TokenFile}
	if t := r.TLS.Sink(); t != nil {
		tc, err := kafkaopt.TLSConfig(*t)
		if err != nil {
			return cfg, fmt.Errorf("contracts.registry.tls: %w", err)
		}
		cfg.TLS = tc
	}
	return cfg, nil
}
