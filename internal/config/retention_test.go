package config

import (
	"strings"
	"testing"
	"time"
)

func TestRetentionKeys(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		set  func(*Config)
		key  string // "" valid
		want string
	}{
		{"off by default", func(*Config) {}, "", ""},
		{"on with the defaults", func(c *Config) { c.Outbox.Retention = 48 * time.Hour }, "", ""},
		{"negative", func(c *Config) { c.Outbox.Retention = -time.Second }, "outbox.retention", "must not be negative"},
		{"batch zero", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.RetentionBatchSize = 0 }, "outbox.retention_batch_size", "use 5000"},
		{"batch too large", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.RetentionBatchSize = 200_000 }, "outbox.retention_batch_size", "between 1 and 100000"},
		{"duty zero", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.RetentionDutyCycle = 0 }, "outbox.retention_duty_cycle", "above 0"},
		{"duty above one", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.RetentionDutyCycle = 1.5 }, "outbox.retention_duty_cycle", "at most 1"},
		{"duty one", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.RetentionDutyCycle = 1 }, "", ""},
		{"interval too short", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.RetentionInterval = time.Millisecond }, "outbox.retention_interval", "between"},
		{"partition width too short", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.PartitionWidth = time.Millisecond }, "outbox.partition_width", "between"},
		{"no partition ahead", func(c *Config) { c.Outbox.Retention = time.Hour; c.Outbox.PartitionsAhead = 0 }, "outbox.partitions_ahead", "use 3"},
		{"no checkpoint store", func(c *Config) { c.Outbox.Retention = time.Hour; c.Checkpoint.Store = "none" }, "outbox.retention", "needs a checkpoint store"},
		{"pacing ignored when off", func(c *Config) { c.Outbox.RetentionBatchSize = 0 }, "", ""},
	}
	for _, c := range cases {
		cfg := withRequired()
		c.set(&cfg)
		err := cfg.Validate()
		if c.key == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		hasKey(t, err, c.key, c.want)
	}
}

func TestRetentionFromFile(t *testing.T) {
	t.Parallel()
	path := writeFile(t, withRequiredYAML(t, `
outbox:
  retention: 36h
  retention_batch_size: 1000
  retention_duty_cycle: 0.25
  retention_interval: 5s
  partition_width: 1h
  partitions_ahead: 6
`))
	c, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Outbox; o.Retention != 36*time.Hour || o.RetentionBatchSize != 1000 || o.RetentionDutyCycle != 0.25 || o.RetentionInterval != 5*time.Second ||
		o.PartitionWidth != time.Hour || o.PartitionsAhead != 6 {
		t.Fatalf("got %+v", o)
	}
}

func TestRetentionShortWarns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		r    time.Duration
		warn bool
	}{{0, false}, {10 * time.Second, true}, {59 * time.Minute, true}, {time.Hour, false}, {48 * time.Hour, false}} {
		cfg := withRequired()
		cfg.Outbox.Retention = c.r
		var got []FieldError
		for _, w := range cfg.Warnings() {
			if w.Key == "outbox.retention" {
				got = append(got, w)
			}
		}
		if (len(got) == 1) != c.warn || (c.warn && !strings.Contains(got[0].Problem, "verify (--since) can check and repair only the last "+c.r.String())) {
			t.Errorf("retention %v: warnings %v, want warning %v", c.r, got, c.warn)
		}
	}
}
