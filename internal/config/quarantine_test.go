package config

import "testing"

func TestValidateDLQ(t *testing.T) {
	t.Parallel()
	quarantine := func(c *Config) { c.DLQ.Mode = DLQQuarantine }
	tests := []struct {
		name   string
		mutate func(*Config)
		key    string // "": valid
		want   []string
	}{
		{"skip by default", func(*Config) {}, "", nil},
		{"quarantine", quarantine, "", nil},
		{"unknown mode", func(c *Config) { c.DLQ.Mode = "park" }, "dlq.mode", []string{"skip", "quarantine"}},
		{"bound zero", func(c *Config) { c.DLQ.MaxQuarantined = 0 }, "dlq.max_quarantined", []string{"1 to 1000000", "stops the connector"}},
		{"bound huge", func(c *Config) { c.DLQ.MaxQuarantined = 2_000_000 }, "dlq.max_quarantined", []string{"1 to 1000000"}},
		{"parking is the dlq", func(c *Config) { quarantine(c); c.Kafka.ParkingTopic = "outbox.dlq" }, "kafka.parking_topic", []string{"same as kafka.dlq_topic"}},
		{"parking illegal", func(c *Config) { quarantine(c); c.Kafka.ParkingTopic = "park!" }, "kafka.parking_topic", []string{"letters, digits"}},
		{"parking a fixed topic", func(c *Config) { quarantine(c); c.Kafka.Topics = map[string]string{"order": "outbox.parking"} }, "kafka.parking_topic", []string{`kafka.topics["order"]`, "no event can be published to"}},
		{"parking produced by template", func(c *Config) { quarantine(c); c.Kafka.ParkingTopic = "outbox.event.parked" }, "kafka.parking_topic", []string{`aggregate_type "parked"`}},
		{"parking unchecked in skip mode", func(c *Config) { c.Kafka.ParkingTopic = "outbox.dlq" }, "", nil},
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

// TestDLQFromEnv: the new keys have their OUTBOX_CDC_ variables, and the
// parking topic is used only in quarantine mode.
func TestDLQFromEnv(t *testing.T) {
	t.Parallel()
	env := []string{
		"OUTBOX_CDC_POSTGRES_DSN=postgres://cdc@db:5432/app",
		"OUTBOX_CDC_KAFKA_BROKERS=127.0.0.1:9092",
		"OUTBOX_CDC_KAFKA_PARKING_TOPIC=parked",
		"OUTBOX_CDC_DLQ_MAX_QUARANTINED=50",
	}
	cfg, err := Load("", env)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if cfg.DLQ.Mode != DLQSkip || cfg.ParkingTopic() != "" || cfg.DLQ.MaxQuarantined != 50 {
		t.Fatalf("skip mode: mode %q, parking %q, bound %d", cfg.DLQ.Mode, cfg.ParkingTopic(), cfg.DLQ.MaxQuarantined)
	}
	cfg, err = Load("", append(env, "OUTBOX_CDC_DLQ_MODE=quarantine"))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if cfg.ParkingTopic() != "parked" {
		t.Fatalf("quarantine mode: parking %q, want parked", cfg.ParkingTopic())
	}
}
