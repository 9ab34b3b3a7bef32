package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidatePrimaryDSN: postgres.primary_dsn is checked like postgres.dsn,
// printed redacted, and not the same as postgres.dsn.
func TestValidatePrimaryDSN(t *testing.T) {
	t.Parallel()
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []string // empty: valid
	}{
		{"unset", func(*Config) {}, nil},
		{"url", func(c *Config) { c.Postgres.PrimaryDSN = "postgres://cdc@db-primary:5432/app" }, nil},
		{"keyword", func(c *Config) { c.Postgres.PrimaryDSN = "host=db-primary user=cdc dbname=app" }, nil},
		{"malformed", func(c *Config) { c.Postgres.PrimaryDSN = "host=db-primary 'oops" }, []string{"postgres.primary_dsn"}},
		{"same as dsn", func(c *Config) { c.Postgres.PrimaryDSN = c.Postgres.DSN }, []string{"the same as postgres.dsn", "unset it"}},
		{"password with password file", func(c *Config) {
			c.Postgres.PasswordFile = pwFile
			c.Postgres.PrimaryDSN = "postgres://cdc:s3cret@db-primary:5432/app"
		}, []string{"postgres.primary_dsn has a password too", "OUTBOX_CDC_POSTGRES_PRIMARY_DSN"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := withRequired()
			tt.mutate(&c)
			err := c.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("valid configuration refused: %v", err)
				}
				return
			}
			key := "postgres.primary_dsn"
			if tt.name == "password with password file" {
				key = "postgres.password_file"
			}
			hasKey(t, err, key, tt.want...)
			if strings.Contains(fmt.Sprint(err), "s3cret") {
				t.Errorf("the primary's password is printed: %v", err)
			}
		})
	}
}

// TestPrimaryDSNFromEnv: the key is set from OUTBOX_CDC_POSTGRES_PRIMARY_DSN
// and prints redacted.
func TestPrimaryDSNFromEnv(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", []string{
		"OUTBOX_CDC_POSTGRES_DSN=postgres://cdc@db-standby:5432/app",
		"OUTBOX_CDC_POSTGRES_PRIMARY_DSN=postgres://cdc:s3cret@db-primary:5432/app",
		"OUTBOX_CDC_KAFKA_BROKERS=127.0.0.1:9092",
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if got := string(cfg.Postgres.PrimaryDSN); got != "postgres://cdc:s3cret@db-primary:5432/app" {
		t.Errorf("primary_dsn = %q", got)
	}
	if s := fmt.Sprintf("%v %+v %s", cfg.Postgres.PrimaryDSN, cfg.Postgres, cfg.Postgres.PrimaryDSN); strings.Contains(s, "s3cret") {
		t.Errorf("primary_dsn printed with its password: %s", s)
	}
}
