package config

import (
	"strconv"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// dlq.mode values.
const (
	// DLQSkip delivers an aggregate's later events after one was
	// dead-lettered: they overtake it.
	DLQSkip = "skip"
	// DLQQuarantine parks them on kafka.parking_topic, in order (sink/quarantine).
	DLQQuarantine = "quarantine"
)

// maxQuarantinedLimit keeps the in-memory set to a few MiB.
const maxQuarantinedLimit = 1_000_000

// DLQ configures what happens to an aggregate after one of its events is
// dead-lettered.
type DLQ struct {
	Mode string `koanf:"mode"` // skip or quarantine
	// MaxQuarantined bounds the quarantined aggregates; one more stops the
	// connector (sink.Config.MaxQuarantined).
	MaxQuarantined int `koanf:"max_quarantined"`
}

// ParkingTopic is kafka.parking_topic in quarantine mode, "" in skip mode.
func (c *Config) ParkingTopic() string {
	if c.DLQ.Mode != DLQQuarantine {
		return ""
	}
	return c.Kafka.ParkingTopic
}

// QuarantineTopic is kafka.quarantine_topic in quarantine mode, "" in skip mode.
func (c *Config) QuarantineTopic() string {
	if c.DLQ.Mode != DLQQuarantine {
		return ""
	}
	return c.Kafka.QuarantineTopic
}

func (v *validator) dlq(d DLQ, k Kafka) {
	v.oneOf("dlq.mode", d.Mode, []string{DLQSkip, DLQQuarantine})
	if d.MaxQuarantined < 1 || d.MaxQuarantined > maxQuarantinedLimit {
		v.add("dlq.max_quarantined", strconv.Itoa(d.MaxQuarantined), "must be 1 to "+strconv.Itoa(maxQuarantinedLimit),
			"use a bound such as 10000: one more quarantined aggregate stops the connector")
	}
	if d.Mode != DLQQuarantine {
		return
	}
	v.sideTopic(k, "kafka.parking_topic", k.ParkingTopic, "outbox.parking")
	if k.QuarantineTopic == k.ParkingTopic {
		v.add("kafka.quarantine_topic", k.QuarantineTopic, "same as kafka.parking_topic", "choose a quarantine topic of its own, such as outbox.quarantine")
		return
	}
	v.sideTopic(k, "kafka.quarantine_topic", k.QuarantineTopic, "outbox.quarantine")
}

// sideTopic checks that topic, the value of key, is as unreachable for
// events as the dead-letter topic: router.Config.Check says so for its
// DLQTopic.
func (v *validator) sideTopic(k Kafka, key, topic, example string) {
	if topic == k.DLQTopic {
		v.add(key, topic, "same as kafka.dlq_topic", "choose a topic of its own, such as "+example)
		return
	}
	for _, p := range (router.Config{TopicTemplate: k.Topic, Topics: k.Topics, DLQTopic: topic,
		TopicRegex: k.TopicRegex, TopicReplacement: k.TopicReplacement}).Check() {
		if p.Key == "kafka.dlq_topic" {
			v.add(key, p.Value, p.Reason, "choose a topic no event can be published to")
		}
	}
}
