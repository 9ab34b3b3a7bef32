package config

import (
	"strings"
	"testing"
	"time"
)

func TestDelivery(t *testing.T) {
	t.Parallel()
	if d := Default(); d.Kafka.Delivery != DeliveryAtLeastOnce || d.Kafka.ExactlyOnce() {
		t.Fatalf("default delivery %q", d.Kafka.Delivery)
	}
	// As Load leaves it with dlq.mode unset (TestDeliveryEnv).
	eos := func(c *Config) { c.Kafka.Delivery, c.DLQ.Mode = DeliveryExactlyOnce, DLQSkip }
	for _, tt := range []struct {
		name   string
		edit   func(*Config)
		key    string // "" : valid
		phrase string
	}{
		{"exactly once", eos, "", ""},
		{"unknown mode", func(c *Config) { c.Kafka.Delivery = "at_most_once" }, "kafka.delivery", "at_least_once, exactly_once"},
		{"interval too short", func(c *Config) { eos(c); c.Kafka.TransactionInterval = 0 }, "kafka.transaction_interval", "between 1ms and 1m0s"},
		{"interval too long", func(c *Config) { eos(c); c.Kafka.TransactionInterval = time.Hour }, "kafka.transaction_interval", "between 1ms and 1m0s"},
		{"interval ignored at least once", func(c *Config) { c.Kafka.TransactionInterval = 0 }, "", ""},
		{"timeout too short", func(c *Config) { eos(c); c.Kafka.TransactionTimeout = 100 * time.Millisecond }, "kafka.transaction_timeout", "between 1s and 15m0s"},
		{"timeout too long", func(c *Config) { eos(c); c.Kafka.TransactionTimeout = time.Hour }, "kafka.transaction_timeout", "between 1s and 15m0s"},
		{"interval past the timeout", func(c *Config) {
			eos(c)
			c.Kafka.TransactionInterval, c.Kafka.TransactionTimeout = 30*time.Second, 10*time.Second
		}, "kafka.transaction_interval", "not shorter than kafka.transaction_timeout"},
		{"timeout ignored at least once", func(c *Config) { c.Kafka.TransactionTimeout = 0 }, "", ""},
		{"a header column named txn", func(c *Config) { eos(c); c.Outbox.HeaderColumns = []string{"tenant", "txn"} },
			"outbox.header_columns[1]", "carry the header txn"},
		{"txn_part in a table's header columns", func(c *Config) {
			eos(c)
			c.Outbox.Tables = []OutboxTable{{Table: "public.a"}, {Table: "public.b", HeaderColumns: []string{"txn_part"}}}
			c.Outbox.Table = ""
		}, "outbox.tables[1].header_columns[0]", "carry the header txn_part"},
		{"txn at least once", func(c *Config) { c.Outbox.HeaderColumns = []string{"txn"} }, "", ""},
		{"positions is the dlq", func(c *Config) { eos(c); c.Kafka.PositionsTopic = "outbox.dlq" }, "kafka.positions_topic", "same as the dead-letter"},
		{"positions routable", func(c *Config) { eos(c); c.Kafka.PositionsTopic = "outbox.event.positions" }, "kafka.positions_topic", `aggregate_type "positions"`},
		{"positions illegal", func(c *Config) { eos(c); c.Kafka.PositionsTopic = "pos!" }, "kafka.positions_topic", "letters, digits"},
		{"quarantine with exactly once", func(c *Config) { eos(c); c.DLQ.Mode = DLQQuarantine }, "", ""},
		{"positions is the quarantine topic", func(c *Config) {
			eos(c)
			c.DLQ.Mode, c.Kafka.PositionsTopic = DLQQuarantine, c.Kafka.QuarantineTopic
		}, "kafka.positions_topic", "quarantine topic"},
		{"positions is the parking topic", func(c *Config) {
			eos(c)
			c.DLQ.Mode, c.Kafka.PositionsTopic = DLQQuarantine, c.Kafka.ParkingTopic
		}, "kafka.positions_topic", "parking"},
		{"pending snapshot with exactly once", func(c *Config) { eos(c); c.Snapshot.Mode = "pending" }, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := withRequired()
			tt.edit(&c)
			var got *FieldError
			for _, p := range c.problems() {
				if p.Key == tt.key || tt.key == "" {
					got = &p
					break
				}
			}
			switch {
			case tt.key == "" && got != nil:
				t.Fatalf("unexpected problem: %v", got)
			case tt.key != "" && got == nil:
				t.Fatalf("no problem for %s; problems: %v", tt.key, c.problems())
			case tt.key != "" && !strings.Contains(got.Error(), tt.phrase):
				t.Fatalf("problem %q lacks %q", got.Error(), tt.phrase)
			}
		})
	}
}

func TestDeliveryEnv(t *testing.T) {
	t.Parallel()
	cfg, err := Load("", append(requiredEnv[:len(requiredEnv):len(requiredEnv)],
		"OUTBOX_CDC_KAFKA_DELIVERY=exactly_once", "OUTBOX_CDC_KAFKA_TRANSACTION_INTERVAL=20ms"))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if !cfg.Kafka.ExactlyOnce() || cfg.Kafka.TransactionInterval != 20*time.Millisecond || cfg.Kafka.PositionsTopic != "outbox-cdc.positions" {
		t.Fatalf("kafka %q %v %q", cfg.Kafka.Delivery, cfg.Kafka.TransactionInterval, cfg.Kafka.PositionsTopic)
	}
	// dlq.mode unset is quarantine in both modes; skip stays a choice.
	if cfg.DLQ.Mode != DLQQuarantine {
		t.Fatalf("dlq.mode %q with exactly_once and no dlq.mode set, want quarantine", cfg.DLQ.Mode)
	}
	cfg, err = Load("", append(requiredEnv[:len(requiredEnv):len(requiredEnv)],
		"OUTBOX_CDC_KAFKA_DELIVERY=exactly_once", "OUTBOX_CDC_DLQ_MODE=skip"))
	if err != nil || cfg.DLQ.Mode != DLQSkip {
		t.Fatalf("explicit skip with exactly_once: %v, %v", cfg, err)
	}
	if cfg, err := Load("", requiredEnv); err != nil || cfg.DLQ.Mode != DLQQuarantine {
		t.Fatalf("default dlq.mode: %v, %v", cfg, err)
	}
}

// TestSnapshotIDs: exactly_once with snapshot.mode pending refuses plain
// records without an id header (a snapshot taken again finds what Kafka
// holds by it); each other combination passes.
func TestSnapshotIDs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		edit    func(*Config)
		refused bool
	}{
		{"no id, exactly_once, pending", func(c *Config) {}, true},
		{"with id", func(c *Config) { c.Outbox.StandardHeaders = []string{"id", "event_type"} }, false},
		{"at_least_once", func(c *Config) { c.Kafka.Delivery = DeliveryAtLeastOnce }, false},
		{"no snapshot", func(c *Config) { c.Snapshot.Mode = "none" }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := withRequired()
			c.Kafka.Delivery, c.DLQ.Mode, c.Snapshot.Mode = DeliveryExactlyOnce, DLQSkip, "pending"
			c.Outbox.StandardHeaders = []string{"event_type", "aggregate_type"}
			tt.edit(&c)
			var got *FieldError
			for _, p := range c.problems() {
				if p.Key == "outbox.standard_headers" {
					got = &p
				}
			}
			if (got != nil) != tt.refused {
				t.Fatalf("refused %v (%v), want %v", got != nil, got, tt.refused)
			}
			if got != nil && !strings.Contains(got.Error(), "keep id in the list") {
				t.Fatalf("problem %q lacks the fix", got.Error())
			}
		})
	}
}
