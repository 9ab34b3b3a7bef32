package config

import "testing"

func TestValidateTracing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string // "": valid
		want   []string
	}{
		{"off by default", func(*Config) {}, "", nil},
		{"trace column", func(c *Config) { c.Outbox.TraceColumn = "tracingspancontext" }, "", nil},
		{"endpoint", func(c *Config) { c.OTel.Endpoint = "https://otel-collector:4318" }, "", nil},
		{"trace column not an identifier", func(c *Config) { c.Outbox.TraceColumn = "trace-ctx" }, "outbox.trace_column", nil},
		{"trace column also a header column", func(c *Config) {
			c.Outbox.TraceColumn = "trace"
			c.Outbox.HeaderColumns = []string{"tenant", "trace"}
		}, "outbox.trace_column", []string{"remove it from outbox.header_columns"}},
		{"trace column is a mapped column", func(c *Config) { c.Outbox.TraceColumn = "payload" }, "outbox.trace_column", []string{"outbox.columns"}},
		{"header column named traceparent", func(c *Config) {
			c.Outbox.TraceColumn = "trace"
			c.Outbox.HeaderColumns = []string{"traceparent"}
		}, "outbox.header_columns[0]", []string{"second one"}},
		{"endpoint without scheme", func(c *Config) { c.OTel.Endpoint = "otel-collector:4318" }, "otel.endpoint", []string{"http://otel-collector:4318"}},
		{"endpoint grpc scheme", func(c *Config) { c.OTel.Endpoint = "grpc://otel-collector:4317" }, "otel.endpoint", []string{"not an http(s) URL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := withRequired()
			tt.mutate(&c)
			err := c.Validate()
			if tt.key == "" {
				if err != nil {
					t.Fatalf("valid configuration refused: %v", err)
				}
				return
			}
			hasKey(t, err, tt.key, tt.want...)
		})
	}
}

// TestTracingFromEnv: both keys have their OUTBOX_CDC_ variable.
func TestTracingFromEnv(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", []string{
		"OUTBOX_CDC_POSTGRES_DSN=postgres://cdc@db:5432/app",
		"OUTBOX_CDC_KAFKA_BROKERS=127.0.0.1:9092",
		"OUTBOX_CDC_OUTBOX_TRACE_COLUMN=tracingspancontext",
		"OUTBOX_CDC_OTEL_ENDPOINT=http://collector:4318",
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if cfg.Outbox.TraceColumn != "tracingspancontext" || cfg.OTel.Endpoint != "http://collector:4318" {
		t.Fatalf("trace_column %q, endpoint %q", cfg.Outbox.TraceColumn, cfg.OTel.Endpoint)
	}
}
