package config

import "testing"

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
