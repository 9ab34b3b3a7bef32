package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func baseConfig() *config.Config {
	cfg := config.Default()
	cfg.Postgres.DSN = "postgres://app@127.0.0.1:5432/app"
	cfg.Kafka.Brokers = []string{"127.0.0.1:9092"}
	return &cfg
}

// TestPostgresPasswordFile: the password of postgres.password_file reaches
// the parsed connection settings, never the process environment.
func TestPostgresPasswordFile(t *testing.T) {
	t.Setenv("PGPASSWORD", "")
	path := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(path, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig()
	cfg.Postgres.PasswordFile = path
	pc, err := PipelineConfig(cfg)
	if err != nil {
		t.Fatalf("PipelineConfig: %v", err)
	}
	if got, err := pc.Source.DB.Password(t.Context()); got != "s3cret" || err != nil {
		t.Errorf("connection password %q, %v; want the file's", got, err)
	}
	// Re-read at every connection attempt: a rotated file is used next time.
	if err := os.WriteFile(path, []byte("rotated\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := pc.Source.DB.Password(t.Context()); got != "rotated" || err != nil {
		t.Errorf("connection password after rotation %q, %v; want the new content", got, err)
	}
	if got := os.Getenv("PGPASSWORD"); got != "" {
		t.Errorf("PGPASSWORD = %q, want it left alone", got)
	}
	if db := pc.Source.DB.Config(); db.Host != "127.0.0.1" || db.User != "app" || db.Database != "app" {
		t.Errorf("connection settings %s@%s/%s, want the DSN's", db.User, db.Host, db.Database)
	}
}

func TestCheckpointStore(t *testing.T) {
	tests := []struct {
		store string
		want  string // the store's type, "" for none
	}{
		{"table", "*replication.TableStore"},
		{"file", "*offsets.FileStore"},
		{"none", ""},
	}
	for _, tt := range tests {
		t.Run(tt.store, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Checkpoint.Store, cfg.Checkpoint.File = tt.store, filepath.Join(t.TempDir(), "ckpt")
			pc, err := PipelineConfig(cfg)
			if err != nil {
				t.Fatalf("PipelineConfig: %v", err)
			}
			got := ""
			switch pc.Checkpoints.(type) {
			case *replication.TableStore:
				got = "*replication.TableStore"
			case *offsets.FileStore:
				got = "*offsets.FileStore"
			case nil:
			default:
				got = "other"
			}
			if got != tt.want {
				t.Fatalf("checkpoint.store %s built %s, want %s", tt.store, got, tt.want)
			}
		})
	}
}

// TestRunUsage: exit codes and messages of the command line that need no
// server.
func TestRunUsage(t *testing.T) {
	env := []string{"OUTBOX_CDC_POSTGRES_DSN=postgres://app@127.0.0.1:1/app", "OUTBOX_CDC_KAFKA_BROKERS=127.0.0.1:1"}
	tests := []struct {
		name string
		args []string
		env  []string
		code int
		out  string // in stdout or stderr
	}{
		{"no command", nil, nil, ExitUsage, "usage:"},
		{"unknown command", []string{"bogus"}, nil, ExitUsage, `unknown command "bogus"`},
		{"version", []string{"version"}, nil, ExitOK, "outbox-cdc " + Version},
		{"help", []string{"help"}, nil, ExitOK, "commands:"},
		{"unknown flag", []string{"status", "--bogus"}, env, ExitUsage, "bogus"},
		{"replay without --from-lsn", []string{"replay"}, env, ExitUsage, "--from-lsn is required"},
		{"bad LSN", []string{"replay", "--from-lsn", "zz"}, env, ExitUsage, "from-lsn"},
		{"extra argument", []string{"run", "extra"}, env, ExitUsage, `unexpected argument "extra"`},
		{"missing required key", []string{"run"}, nil, ExitUsage, "postgres.dsn"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Run(testCtx(t), tt.args, &stdout, &stderr, tt.env)
			out := stdout.String() + stderr.String()
			if code != tt.code || !strings.Contains(out, tt.out) {
				t.Fatalf("exit %d, want %d; output %q lacks %q", code, tt.code, out, tt.out)
			}
		})
	}
}
