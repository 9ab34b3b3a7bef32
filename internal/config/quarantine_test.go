package config

import "testing"

// TestDLQFromEnv: the keys have their OUTBOX_CDC_ variables, quarantine is
// the default mode, and the parking and quarantine topics are used only in
// quarantine mode.
func TestDLQFromEnv(t *testing.T) {
	t.Parallel()
	env := []string{
		"OUTBOX_CDC_POSTGRES_DSN=postgres://cdc@db:5432/app",
		"OUTBOX_CDC_KAFKA_BROKERS=127.0.0.1:9092",
		"OUTBOX_CDC_KAFKA_PARKING_TOPIC=parked",
		"OUTBOX_CDC_KAFKA_QUARANTINE_TOPIC=quarantined",
		"OUTBOX_CDC_DLQ_MAX_QUARANTINED=50",
	}
	cfg, err := Load("", env)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if cfg.DLQ.Mode != DLQQuarantine || cfg.ParkingTopic() != "parked" || cfg.QuarantineTopic() != "quarantined" || cfg.DLQ.MaxQuarantined != 50 {
		t.Fatalf("default mode: mode %q, parking %q, quarantine topic %q, bound %d", cfg.DLQ.Mode, cfg.ParkingTopic(), cfg.QuarantineTopic(), cfg.DLQ.MaxQuarantined)
	}
	cfg, err = Load("", append(env, "OUTBOX_CDC_DLQ_MODE=skip"))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if cfg.ParkingTopic() != "" || cfg.QuarantineTopic() != "" {
		t.Fatalf("skip mode: parking %q, quarantine topic %q, want none", cfg.ParkingTopic(), cfg.QuarantineTopic())
	}
}
