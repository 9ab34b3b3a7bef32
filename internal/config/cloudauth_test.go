package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
)

func TestValidateCloudAuth(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "client-secret")
	writeBytes(t, secretFile, []byte("cs-in-file\n"))
	tokenFile := filepath.Join(dir, "token")
	writeBytes(t, tokenFile, []byte("tok\n"))
	missing := filepath.Join(dir, "missing")

	cc := func(c *Config) {
		c.Kafka.TLS.Enabled = true
		c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismOAuthBearer, OAuth: KafkaOAuth{
			TokenURL: "https://idp.example.com/oauth2/token", ClientID: "outbox", ClientSecret: "cs-inline", Scope: "kafka"}}
	}
	file := func(c *Config) {
		c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismOAuthBearer, OAuth: KafkaOAuth{TokenFile: tokenFile}}
	}
	iam := func(c *Config) {
		c.Kafka.TLS.Enabled = true
		c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismAWSMSKIAM}
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string // "" when valid
		want   []string
	}{
		{"client credentials", cc, "", nil},
		{"client secret file, extensions", func(c *Config) {
			cc(c)
			c.Kafka.SASL.OAuth.ClientSecret, c.Kafka.SASL.OAuth.ClientSecretFile = "", secretFile
			c.Kafka.SASL.OAuth.Extensions = map[string]string{"logicalCluster": "lkc-1"}
		}, "", nil},
		{"http to loopback", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.TokenURL = "http://127.0.0.1:8080/token" }, "", nil},
		{"token file", file, "", nil},
		{"no token source", func(c *Config) { file(c); c.Kafka.SASL.OAuth.TokenFile = "" }, "kafka.sasl.oauth.token_url",
			[]string{"required with kafka.sasl.mechanism OAUTHBEARER", "token_file"}},
		{"both sources", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.TokenFile = tokenFile }, "kafka.sasl.oauth.token_file",
			[]string{"set together with kafka.sasl.oauth.token_url", "keep one"}},
		{"token file missing", func(c *Config) { file(c); c.Kafka.SASL.OAuth.TokenFile = missing }, "kafka.sasl.oauth.token_file",
			[]string{missing, "does not exist"}},
		{"token file with client id", func(c *Config) { file(c); c.Kafka.SASL.OAuth.ClientID = "x" }, "kafka.sasl.oauth.token_file",
			[]string{"client credentials keys", "remove those keys"}},
		{"plain http", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.TokenURL = "http://idp.example.com/token" },
			"kafka.sasl.oauth.token_url", []string{"clear text", "use https"}},
		{"not a url", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.TokenURL = "idp.example.com/token" },
			"kafka.sasl.oauth.token_url", []string{"not an http(s) URL", "https://idp.example.com/oauth2/token"}},
		{"user info in url", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.TokenURL = "https://u:cs-inline@idp/token" },
			"kafka.sasl.oauth.token_url", []string{"has user info"}},
		{"no client id", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.ClientID = "" }, "kafka.sasl.oauth.client_id",
			[]string{"required with kafka.sasl.oauth.token_url", "OUTBOX_CDC_KAFKA_SASL_OAUTH_CLIENT_ID"}},
		{"no client secret", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.ClientSecret = "" }, "kafka.sasl.oauth.client_secret",
			[]string{"required", "client_secret_file", "OUTBOX_CDC_KAFKA_SASL_OAUTH_CLIENT_SECRET"}},
		{"secret and file", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.ClientSecretFile = secretFile }, "kafka.sasl.oauth.client_secret",
			[]string{"set together with kafka.sasl.oauth.client_secret_file"}},
		{"secret file missing", func(c *Config) {
			cc(c)
			c.Kafka.SASL.OAuth.ClientSecret, c.Kafka.SASL.OAuth.ClientSecretFile = "", missing
		}, "kafka.sasl.oauth.client_secret_file", []string{"does not exist"}},
		{"bad extension name", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.Extensions = map[string]string{"pool-id": "x"} },
			"kafka.sasl.oauth.extensions.pool-id", []string{"letters only"}},
		{"auth extension", func(c *Config) { cc(c); c.Kafka.SASL.OAuth.Extensions = map[string]string{"auth": "x"} },
			"kafka.sasl.oauth.extensions.auth", []string{`not "auth"`}},
		{"username with oauthbearer", func(c *Config) { cc(c); c.Kafka.SASL.Username = "alice" }, "kafka.sasl.username",
			[]string{"not used with kafka.sasl.mechanism OAUTHBEARER"}},
		{"oauth keys with scram", func(c *Config) {
			c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismScramSHA512, Username: "u", Password: "p", OAuth: KafkaOAuth{TokenFile: tokenFile}}
		}, "kafka.sasl.oauth", []string{"would be ignored", "mechanism: OAUTHBEARER"}},
		{"oauth keys without mechanism", func(c *Config) { c.Kafka.SASL.OAuth.TokenURL = "https://idp/token" },
			"kafka.sasl.oauth", []string{"would be ignored"}},
		{"msk iam", iam, "", nil},
		{"msk iam with oauth keys", func(c *Config) { iam(c); c.Kafka.SASL.OAuth.TokenFile = tokenFile }, "kafka.sasl.oauth",
			[]string{"not used with kafka.sasl.mechanism AWS_MSK_IAM"}},
		{"pg password command", func(c *Config) { c.Postgres.PasswordCommand = "echo pw" }, "", nil},
		{"pg command and file", func(c *Config) {
			c.Postgres.PasswordCommand, c.Postgres.PasswordFile = "echo pw", secretFile
		}, "postgres.password_command", []string{"set together with postgres.password_file", "keep one"}},
		{"pg command and dsn password", func(c *Config) {
			c.Postgres.PasswordCommand, c.Postgres.DSN = "echo pw", "postgres://app:pw@db/app"
		}, "postgres.password_command", []string{"postgres.dsn has a password too", "OUTBOX_CDC_POSTGRES_DSN"}},
		{"pg command timeout", func(c *Config) {
			c.Postgres.PasswordCommand, c.Postgres.PasswordCommandTimeout = "echo pw", time.Hour
		}, "postgres.password_command_timeout", []string{"between 100ms and 5m0s"}},
	}
	t.Setenv(kafkaopt.EnvAWSAccessKeyID, "AKID")
	t.Setenv(kafkaopt.EnvAWSSecretAccessKey, "secret")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := withRequired()
			tt.mutate(&c)
			err := c.Validate()
			if tt.key == "" {
				if err != nil {
					t.Errorf("valid configuration refused: %v", err)
				}
				return
			}
			hasKey(t, err, tt.key, tt.want...)
			for _, s := range []string{"cs-inline", "cs-in-file"} {
				if strings.Contains(fmt.Sprint(err), s) {
					t.Errorf("the client secret is printed: %v", err)
				}
			}
		})
	}
	t.Run("msk iam with web identity", func(t *testing.T) {
		t.Setenv(kafkaopt.EnvAWSAccessKeyID, "")
		t.Setenv(kafkaopt.EnvAWSWebIdentityTokenFile, tokenFile)
		t.Setenv(kafkaopt.EnvAWSRoleARN, "arn:aws:iam::123456789012:role/x")
		c := withRequired()
		iam(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("web identity refused: %v", err)
		}
	})
	t.Run("msk iam without credentials", func(t *testing.T) {
		t.Setenv(kafkaopt.EnvAWSAccessKeyID, "")
		t.Setenv(kafkaopt.EnvAWSWebIdentityTokenFile, "")
		c := withRequired()
		iam(&c)
		hasKey(t, c.Validate(), "kafka.sasl.mechanism", "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, must be set", "AWS_SESSION_TOKEN")
	})
}

func TestOAuthBearerWarning(t *testing.T) {
	c := withRequired()
	c.Kafka.SASL = KafkaSASL{Mechanism: kafkaopt.MechanismOAuthBearer, OAuth: KafkaOAuth{TokenFile: "/t"}}
	if w := c.Warnings(); len(w) != 1 || w[0].Key != "kafka.sasl.mechanism" || !strings.Contains(w[0].Problem, "bearer token in clear text") {
		t.Errorf("OAUTHBEARER without TLS: %v", w)
	}
	c.Kafka.TLS.Enabled = true
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("OAUTHBEARER over TLS warns: %v", w)
	}
}

func TestLoadOAuthFromEnv(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "cs")
	writeBytes(t, secretFile, []byte("cs\n"))
	cfg, err := Load("", append(append([]string{}, requiredEnv...),
		"OUTBOX_CDC_KAFKA_TLS_ENABLED=true",
		"OUTBOX_CDC_KAFKA_SASL_MECHANISM=OAUTHBEARER",
		"OUTBOX_CDC_KAFKA_SASL_OAUTH_TOKEN_URL=https://idp/token",
		"OUTBOX_CDC_KAFKA_SASL_OAUTH_CLIENT_ID=outbox",
		"OUTBOX_CDC_KAFKA_SASL_OAUTH_CLIENT_SECRET_FILE="+secretFile,
		"OUTBOX_CDC_KAFKA_SASL_OAUTH_EXTENSIONS=logicalCluster=lkc-1,identityPoolId=pool-2",
		"OUTBOX_CDC_POSTGRES_PASSWORD_COMMAND=echo pw",
	))
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.Kafka.SASL.OAuth
	if o.TokenURL != "https://idp/token" || o.ClientID != "outbox" || o.ClientSecretFile != secretFile ||
		o.Extensions["logicalCluster"] != "lkc-1" || o.Extensions["identityPoolId"] != "pool-2" {
		t.Errorf("oauth = %+v", o)
	}
	if cfg.Postgres.PasswordCommand != "echo pw" || cfg.Postgres.PasswordCommandTimeout != 10*time.Second {
		t.Errorf("password command %q, timeout %s", cfg.Postgres.PasswordCommand, cfg.Postgres.PasswordCommandTimeout)
	}
}

func TestPasswordCommand(t *testing.T) {
	tests := []struct {
		name, command string
		timeout       time.Duration
		want          string // the password, or a part of the error
		ok            bool
	}{
		{"trimmed", `printf '  tok en\n\n'`, time.Second, "tok en", true},
		{"each run anew", `date +%N`, time.Second, "", true},
		{"failure with stderr", `echo "ExpiredToken: refresh your SSO session" >&2; echo leaked-pw; exit 3`, time.Second,
			"postgres.password_command: exit status 3: ExpiredToken: refresh your SSO session", false},
		{"no output", `true`, time.Second, "postgres.password_command: printed nothing on standard output", false},
		{"timeout", `echo slow-pw; sleep 5`, 200 * time.Millisecond,
			"postgres.password_command: timed out after 200ms (postgres.password_command_timeout)", false},
		{"output too large", `head -c 70000 /dev/zero | tr '\0' x`, time.Second, "printed more than 65536 bytes, not a password", false},
		{"long stderr keeps its end", `head -c 5000 /dev/zero | tr '\0' x >&2; echo END >&2; exit 1`, time.Second, "xxEND", false},
		// A CLI's error may quote what it was given or forge log lines: the
		// error (logged) keeps its words, not its control characters nor
		// anything shaped like a credential.
		{"stderr filtered", `printf 'denied\n\033[2Jlevel=INFO msg=forged\rtoken=hunter2 Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOjF9.c2ln PASSWORD: s3cret\n' >&2; exit 1`,
			time.Second, "exit status 1: denied [2Jlevel=INFO msg=forged token=[redacted] Bearer [redacted] PASSWORD: [redacted]", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := Postgres{PasswordCommand: tt.command, PasswordCommandTimeout: tt.timeout}.PasswordSource()
			start := time.Now()
			got, err := src(t.Context())
			if took := time.Since(start); took > tt.timeout+3*time.Second {
				t.Errorf("took %s with a timeout of %s", took, tt.timeout)
			}
			switch {
			case tt.ok && err != nil:
				t.Fatalf("error %v", err)
			case tt.ok && tt.want != "" && got != tt.want:
				t.Errorf("password %q, want %q", got, tt.want)
			case !tt.ok && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want it to contain %q", err, tt.want)
			case !tt.ok && (strings.Contains(err.Error(), "pw\n") || strings.Contains(err.Error(), "leaked-pw") ||
				strings.Contains(err.Error(), "slow-pw") || len(err.Error()) > 700 ||
				strings.ContainsAny(err.Error(), "\n\r\x1b") || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret")):
				t.Errorf("error shows standard output or too much: %q", err)
			}
			if tt.name == "each run anew" {
				again, err := src(t.Context())
				if err != nil || again == got {
					t.Errorf("second run %q, %v; want a new output (not cached), first was %q", again, err, got)
				}
			}
		})
	}
}
