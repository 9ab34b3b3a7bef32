package config

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
)

// selfSigned writes a self-signed certificate and its key to dir and
// returns their paths.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	writeBytes(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeBytes(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}))
	return certFile, keyFile
}

func writeBytes(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestBoolKind(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		yaml string
		want bool
	}{
		{"kafka: {tls: {enabled: true}}", true},
		{"kafka: {tls: {enabled: false}}", false},
		{"kafka: {tls: {enabled: 'true'}}", true},
		{"kafka: {tls: {enabled: \"0\"}}", false},
		{"kafka: {tls: {enabled: ~}}", false},
	} {
		cfg, err := Load(writeFile(t, withRequiredYAML(t, tt.yaml)), nil)
		if err != nil {
			t.Errorf("%s: %v", tt.yaml, err)
			continue
		}
		if cfg.Kafka.TLS.Enabled != tt.want {
			t.Errorf("%s: enabled = %v, want %v", tt.yaml, cfg.Kafka.TLS.Enabled, tt.want)
		}
	}
	for env, want := range map[string]bool{"true": true, "false": false, "1": true, "0": false, "TRUE": true, " False ": false} {
		cfg, err := Load(writeFile(t, withRequiredYAML(t, "kafka: {tls: {enabled: true}}")),
			[]string{"OUTBOX_CDC_KAFKA_TLS_ENABLED=" + env})
		if err != nil {
			t.Errorf("env %q: %v", env, err)
			continue
		}
		if cfg.Kafka.TLS.Enabled != want {
			t.Errorf("env %q: enabled = %v, want %v", env, cfg.Kafka.TLS.Enabled, want)
		}
	}
	_, err := Load("", append(append([]string{}, requiredEnv...), "OUTBOX_CDC_KAFKA_TLS_ENABLED=yes"))
	hasKey(t, err, "kafka.tls.enabled", "OUTBOX_CDC_KAFKA_TLS_ENABLED", "not true, false, 1 or 0", "write true or false")
	for _, bad := range []string{"kafka: {tls: {enabled: 1}}", "kafka: {tls: {enabled: [true]}}", "kafka: {tls: {enabled: yes}}"} {
		_, err := Load(writeFile(t, withRequiredYAML(t, bad)), nil)
		hasKey(t, err, "kafka.tls.enabled", "true or false")
	}
}

func TestSecurityEnvNames(t *testing.T) {
	t.Parallel()
	for key, env := range map[string]string{
		"kafka.tls.enabled":              "OUTBOX_CDC_KAFKA_TLS_ENABLED",
		"kafka.tls.ca_file":              "OUTBOX_CDC_KAFKA_TLS_CA_FILE",
		"kafka.tls.cert_file":            "OUTBOX_CDC_KAFKA_TLS_CERT_FILE",
		"kafka.tls.key_file":             "OUTBOX_CDC_KAFKA_TLS_KEY_FILE",
		"kafka.tls.server_name":          "OUTBOX_CDC_KAFKA_TLS_SERVER_NAME",
		"kafka.tls.insecure_skip_verify": "OUTBOX_CDC_KAFKA_TLS_INSECURE_SKIP_VERIFY",
		"kafka.sasl.mechanism":           "OUTBOX_CDC_KAFKA_SASL_MECHANISM",
		"kafka.sasl.username":            "OUTBOX_CDC_KAFKA_SASL_USERNAME",
		"kafka.sasl.password":            "OUTBOX_CDC_KAFKA_SASL_PASSWORD",
		"kafka.sasl.password_file":       "OUTBOX_CDC_KAFKA_SASL_PASSWORD_FILE",
		"postgres.password_file":         "OUTBOX_CDC_POSTGRES_PASSWORD_FILE",
	} {
		l := leafByKey[key]
		if l == nil || l.env != env {
			t.Errorf("key %s: leaf %+v, want env %s", key, l, env)
		}
	}
	def := Default()
	if def.Kafka.TLS != (KafkaTLS{}) || !reflect.DeepEqual(def.Kafka.SASL, KafkaSASL{OAuth: KafkaOAuth{Extensions: map[string]string{}}}) || def.Postgres.PasswordFile != "" {
		t.Errorf("security defaults are not all off: %#v %#v", def.Kafka.TLS, def.Kafka.SASL)
	}
}

func TestSecurityLoadFromEnv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, _ := selfSigned(t, dir, "ca")
	pwFile := filepath.Join(dir, "sasl")
	writeBytes(t, pwFile, []byte("file-secret\n"))
	cfg, err := Load("", append(append([]string{}, requiredEnv...),
		"OUTBOX_CDC_KAFKA_TLS_ENABLED=1",
		"OUTBOX_CDC_KAFKA_TLS_CA_FILE="+ca,
		"OUTBOX_CDC_KAFKA_TLS_SERVER_NAME=kafka.internal",
		"OUTBOX_CDC_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
		"OUTBOX_CDC_KAFKA_SASL_USERNAME=alice",
		"OUTBOX_CDC_KAFKA_SASL_PASSWORD_FILE="+pwFile,
	))
	if err != nil {
		t.Fatal(err)
	}
	want := KafkaTLS{Enabled: true, CAFile: ca, ServerName: "kafka.internal"}
	if cfg.Kafka.TLS != want {
		t.Errorf("tls = %#v, want %#v", cfg.Kafka.TLS, want)
	}
	pw, err := cfg.Kafka.SASL.Secret()
	if err != nil || pw != "file-secret" {
		t.Errorf("Secret() = %q, %v", pw, err)
	}
	if len(cfg.Warnings()) != 0 {
		t.Errorf("unexpected warnings %v", cfg.Warnings())
	}
}

func TestSecretFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for content, want := range map[string]string{
		"pw":               "pw",
		"pw\n":             "pw",
		"pw\r\n":           "pw",
		"pw\n\n":           "pw",
		" spaced pw \n":    " spaced pw ",
		"multi\nline pw\n": "multi\nline pw",
	} {
		p := filepath.Join(dir, "pw")
		writeBytes(t, p, []byte(content))
		got, err := KafkaSASL{PasswordFile: p}.Secret()
		if err != nil || got != want {
			t.Errorf("Secret() of %q = %q, %v; want %q", content, got, err, want)
		}
		got, err = Postgres{PasswordFile: p}.PasswordSource()(t.Context())
		if err != nil || got != want {
			t.Errorf("PasswordSource() of %q = %q, %v; want %q", content, got, err, want)
		}
	}
	if pw, err := (KafkaSASL{Password: "inline"}).Secret(); pw != "inline" || err != nil {
		t.Errorf("Secret() = %q, %v", pw, err)
	}
	if src := (Postgres{}).PasswordSource(); src != nil {
		t.Errorf("PasswordSource() without a file or command is not nil")
	}
	_, err := Postgres{PasswordFile: filepath.Join(dir, "missing")}.PasswordSource()(t.Context())
	if err == nil || !strings.Contains(err.Error(), "postgres.password_file") || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing file: %v", err)
	}
}

func TestValidateSecurity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, _ := selfSigned(t, dir, "ca")
	cert, key := selfSigned(t, dir, "client")
	_, otherKey := selfSigned(t, dir, "other")
	pwFile := filepath.Join(dir, "pw")
	writeBytes(t, pwFile, []byte("s3cret-in-file\n"))
	emptyFile := filepath.Join(dir, "empty")
	writeBytes(t, emptyFile, []byte("\n"))
	notPEM := filepath.Join(dir, "not.pem")
	writeBytes(t, notPEM, []byte("hello"))
	missing := filepath.Join(dir, "missing.pem")

	tlsOn := func(c *Config) { c.Kafka.TLS.Enabled = true }
	scram := func(c *Config) {
		c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismScramSHA512, Username: "alice", Password: "pw"}
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string
		want   []string
	}{
		{"ca without tls", func(c *Config) { c.Kafka.TLS.CAFile = ca }, "kafka.tls.ca_file",
			[]string{"kafka.tls.enabled is false", "kafka.tls.enabled: true", "OUTBOX_CDC_KAFKA_TLS_ENABLED=true"}},
		{"skip verify without tls", func(c *Config) { c.Kafka.TLS.InsecureSkipVerify = true }, "kafka.tls.insecure_skip_verify",
			[]string{"kafka.tls.enabled is false"}},
		{"ca missing", func(c *Config) { tlsOn(c); c.Kafka.TLS.CAFile = missing }, "kafka.tls.ca_file",
			[]string{missing, "does not exist", "readable PEM file"}},
		{"ca not pem", func(c *Config) { tlsOn(c); c.Kafka.TLS.CAFile = notPEM }, "kafka.tls.ca_file", []string{"no PEM certificate"}},
		{"ca is a directory", func(c *Config) { tlsOn(c); c.Kafka.TLS.CAFile = dir }, "kafka.tls.ca_file", []string{"not a regular file"}},
		{"cert without key", func(c *Config) { tlsOn(c); c.Kafka.TLS.CertFile = cert }, "kafka.tls.key_file",
			[]string{"required when kafka.tls.cert_file is set"}},
		{"key without cert", func(c *Config) { tlsOn(c); c.Kafka.TLS.KeyFile = key }, "kafka.tls.cert_file",
			[]string{"required when kafka.tls.key_file is set"}},
		{"cert missing", func(c *Config) { tlsOn(c); c.Kafka.TLS.CertFile, c.Kafka.TLS.KeyFile = missing, key }, "kafka.tls.cert_file",
			[]string{"does not exist"}},
		{"key not a key", func(c *Config) { tlsOn(c); c.Kafka.TLS.CertFile, c.Kafka.TLS.KeyFile = cert, cert }, "kafka.tls.key_file",
			[]string{"no PEM private key"}},
		{"key of another cert", func(c *Config) { tlsOn(c); c.Kafka.TLS.CertFile, c.Kafka.TLS.KeyFile = cert, otherKey }, "kafka.tls.key_file",
			[]string{"does not go with kafka.tls.cert_file"}},
		{"server name with port", func(c *Config) { tlsOn(c); c.Kafka.TLS.ServerName = "kafka:9093" }, "kafka.tls.server_name",
			[]string{"not a host name"}},
		{"unknown mechanism", func(c *Config) { scram(c); c.Kafka.SASL.Mechanism = "GSSAPI" }, "kafka.sasl.mechanism",
			[]string{"not supported", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"}},
		{"lower-case mechanism", func(c *Config) { scram(c); c.Kafka.SASL.Mechanism = "scram-sha-512" }, "kafka.sasl.mechanism",
			[]string{"upper case: SCRAM-SHA-512"}},
		{"mechanism without username", func(c *Config) { scram(c); c.Kafka.SASL.Username = "" }, "kafka.sasl.username",
			[]string{"required when kafka.sasl.mechanism is set", "OUTBOX_CDC_KAFKA_SASL_USERNAME"}},
		{"mechanism without password", func(c *Config) { scram(c); c.Kafka.SASL.Password = "" }, "kafka.sasl.password",
			[]string{"required", "kafka.sasl.password_file", "OUTBOX_CDC_KAFKA_SASL_PASSWORD"}},
		{"password and file", func(c *Config) { scram(c); c.Kafka.SASL.PasswordFile = pwFile }, "kafka.sasl.password",
			[]string{"set together with kafka.sasl.password_file", "keep one"}},
		{"password file missing", func(c *Config) { scram(c); c.Kafka.SASL.Password, c.Kafka.SASL.PasswordFile = "", missing },
			"kafka.sasl.password_file", []string{missing, "does not exist"}},
		{"password file empty", func(c *Config) { scram(c); c.Kafka.SASL.Password, c.Kafka.SASL.PasswordFile = "", emptyFile },
			"kafka.sasl.password_file", []string{"is empty"}},
		{"username without mechanism", func(c *Config) { c.Kafka.SASL.Username = "alice" }, "kafka.sasl.mechanism",
			[]string{"empty while other kafka.sasl keys are set", "OUTBOX_CDC_KAFKA_SASL_MECHANISM"}},
		{"pg password file missing", func(c *Config) { c.Postgres.PasswordFile = missing }, "postgres.password_file",
			[]string{"does not exist"}},
		{"pg password file and url password", func(c *Config) {
			c.Postgres.PasswordFile = pwFile
			c.Postgres.DSN = "postgres://app:pw@db/app"
		}, "postgres.password_file", []string{"postgres.dsn has a password too", "OUTBOX_CDC_POSTGRES_DSN"}},
		{"pg password file and keyword password", func(c *Config) {
			c.Postgres.PasswordFile = pwFile
			c.Postgres.DSN = "host=db user=app password=pw"
		}, "postgres.password_file", []string{"postgres.dsn has a password too"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := withRequired()
			tt.mutate(&c)
			err := c.Validate()
			hasKey(t, err, tt.key, tt.want...)
			if strings.Contains(fmt.Sprint(err), "s3cret-in-file") {
				t.Errorf("the password file's content is printed: %v", err)
			}
		})
	}

	if os.Geteuid() != 0 { // root reads any file
		t.Run("password file unreadable", func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "locked")
			writeBytes(t, p, []byte("pw"))
			if err := os.Chmod(p, 0); err != nil {
				t.Fatal(err)
			}
			c := withRequired()
			c.Postgres.PasswordFile = p
			hasKey(t, c.Validate(), "postgres.password_file", "permission denied")
		})
	}

	valid := []struct {
		name   string
		mutate func(*Config)
	}{
		{"tls with system roots", tlsOn},
		{"full tls and scram from file", func(c *Config) {
			c.Kafka.TLS = KafkaTLS{Enabled: true, CAFile: ca, CertFile: cert, KeyFile: key, ServerName: "kafka.internal"}
			c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismScramSHA256, Username: "alice", PasswordFile: pwFile}
		}},
		{"ip server name", func(c *Config) { tlsOn(c); c.Kafka.TLS.ServerName = "::1" }},
		{"plain without tls", func(c *Config) {
			c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismPlain, Username: "u", Password: "p"}
		}},
		{"pg password file", func(c *Config) { c.Postgres.PasswordFile = pwFile }},
		{"pg password file, sslpassword in dsn", func(c *Config) {
			c.Postgres.PasswordFile = pwFile
			c.Postgres.DSN = "host=db user=app sslpassword=keypw"
		}},
	}
	for _, tt := range valid {
		c := withRequired()
		tt.mutate(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

// TestQuarantineDoesNotWarn: quarantine mode is durable now (saved on
// kafka.quarantine_topic): nothing to warn about.
func TestQuarantineDoesNotWarn(t *testing.T) {
	t.Parallel()
	c := withRequired()
	c.DLQ.Mode = DLQQuarantine
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("quarantine: %v", w)
	}
}

func TestSecurityWarnings(t *testing.T) {
	t.Parallel()
	c := withRequired()
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("defaults warn: %v", w)
	}
	c.Kafka.TLS = KafkaTLS{Enabled: true, InsecureSkipVerify: true}
	c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismScramSHA512, Username: "u", Password: "p"}
	if w := c.Warnings(); len(w) != 1 || w[0].Key != "kafka.tls.insecure_skip_verify" || !strings.Contains(w[0].Problem, "not verified") {
		t.Errorf("insecure_skip_verify: %v", w)
	}
	c.Kafka.TLS = KafkaTLS{}
	c.Kafka.SASL.Mechanism = kafkaopt.MechanismPlain
	if w := c.Warnings(); len(w) != 1 || w[0].Key != "kafka.sasl.mechanism" || !strings.Contains(w[0].Problem, "clear text") {
		t.Errorf("PLAIN without TLS: %v", w)
	}
	c.Kafka.TLS.Enabled = true
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("PLAIN over TLS warns: %v", w)
	}
}

func TestDSNHasPassword(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]bool{
		"postgres://app:pw@db/app":                 true,
		"postgres://app:@db/app":                   true,
		"postgres://app@db/app":                    false,
		"postgres://app@db/app?password=pw":        true,
		"postgres://app@db/app?sslpassword=pw":     false,
		"postgresql://db/app?sslmode=verify-full":  false,
		"host=db password=pw":                      true,
		"password = 'p w' host=db":                 true,
		"host=db sslpassword=pw":                   false,
		"host=db user=app sslrootcert=/etc/ca.pem": false,
		"host=db PASSWORD=pw":                      true,
	} {
		if got := dsnHasPassword(dsn); got != want {
			t.Errorf("dsnHasPassword(%q) = %v, want %v", dsn, got, want)
		}
	}
}

// TestSASLPasswordNeverPrinted covers every way kafka.sasl.password could
// reach a message.
func TestSASLPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "sasl-hunter2-xyz"
	check := func(what, s string) {
		t.Helper()
		if strings.Contains(s, secret) {
			t.Errorf("%s leaks the SASL password:\n%s", what, s)
		}
	}
	// Through the file and the environment, with other errors around it.
	file := fmt.Sprintf("kafka: {compression: brotli, sasl: {mechanism: PLAIN, password: %q}}\n", secret)
	_, err := Load(writeFile(t, withRequiredYAML(t, file)), nil)
	check("Load (file)", fmt.Sprint(err))
	hasKey(t, err, "kafka.sasl.username", "required")
	_, err = Load("", append(append([]string{}, requiredEnv...),
		"OUTBOX_CDC_KAFKA_SASL_PASSWORD="+secret, "OUTBOX_CDC_KAFKA_SASL_MECHANISM=scram", "OUTBOX_CDC_LOG_LEVEL=loud"))
	check("Load (env)", fmt.Sprint(err))
	for _, f := range fieldErrors(t, err) {
		check("FieldError.Value", f.Value)
	}
	// Wrong types and misplaced values.
	for _, y := range []string{
		fmt.Sprintf("kafka: {sasl: {password: [%q]}}", secret),
		fmt.Sprintf("kafka: {sasl: {password: {x: %q}}}", secret),
		fmt.Sprintf("kafka: {sasl: %q}", secret),
	} {
		_, err = Load(writeFile(t, withRequiredYAML(t, y)), nil)
		if err == nil {
			t.Fatalf("%s: expected an error", y)
		}
		check("Load (bad type)", err.Error())
	}
	// Every way a valid configuration is printed.
	c := withRequired()
	c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismScramSHA512, Username: "alice", Password: secret}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		check(verb+" Config", fmt.Sprintf(verb, c))
		check(verb+" *Config", fmt.Sprintf(verb, &c))
		check(verb+" Kafka", fmt.Sprintf(verb, c.Kafka))
		check(verb+" *Kafka", fmt.Sprintf(verb, &c.Kafka))
		check(verb+" KafkaSASL", fmt.Sprintf(verb, c.Kafka.SASL))
		check(verb+" *KafkaSASL", fmt.Sprintf(verb, &c.Kafka.SASL))
	}
	for _, v := range []any{c, &c, c.Kafka, c.Kafka.SASL} {
		js, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("json %T", v), string(js))
	}
	js, _ := json.Marshal(c.Kafka)
	if !strings.Contains(string(js), `"Username":"alice","Password":"xxxxx"`) {
		t.Errorf("json.Marshal(Kafka) = %s", js)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "config", c, "kafka", c.Kafka, "sasl", c.Kafka.SASL)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "config", &c, "kafka", c.Kafka, "sasl", c.Kafka.SASL)
	check("slog", buf.String())
	if !strings.Contains(buf.String(), "alice") {
		t.Errorf("slog output lacks the username:\n%s", buf.String())
	}
	if got := fmt.Sprintf("%+v", c.Kafka.SASL); got != "{Mechanism:SCRAM-SHA-512 Username:alice Password:xxxxx PasswordFile: "+
		"OAuth:{TokenURL: ClientID: ClientSecret: ClientSecretFile: Scope: Extensions:map[] TokenFile:}}" {
		t.Errorf("%%+v of KafkaSASL = %s", got)
	}
	// An empty password stays empty: nothing to hide.
	c.Kafka.SASL.Password = ""
	if got := fmt.Sprintf("%v|%#v", c.Kafka.SASL.Password, c.Kafka.SASL.Password); got != `|""` {
		t.Errorf("empty password printed as %s", got)
	}
}
