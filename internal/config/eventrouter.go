package config

import (
	"fmt"

	"github.com/outbox-cdc/outbox-cdc/router"
)

// Routes is the router's configuration: kafka.topic and its companions, and
// the Debezium EventRouter options of the outbox section. Call it on a
// validated Config. An empty outbox.standard_headers (`[]`, or the variable
// set to "") loads as an empty list and means none.
func (c *Config) Routes() router.Config {
	rc := router.Config{
		TopicTemplate: c.Kafka.Topic, Topics: c.Kafka.Topics, DLQTopic: c.Kafka.DLQTopic,
		TopicRegex: c.Kafka.TopicRegex, TopicReplacement: c.Kafka.TopicReplacement,
		StandardHeaders: c.Outbox.StandardHeaders, SourceHeaders: c.Outbox.SourceHeaders,
		TimestampColumn: c.Outbox.TimestampColumn, TombstoneOnEmpty: c.Outbox.TombstoneOnEmptyPayload,
		TraceColumn: c.Outbox.TraceColumn, Format: c.Kafka.Format,
	}
	for _, s := range c.Outbox.Fields {
		if f, err := router.ParseField(s); err == nil {
			rc.Fields = append(rc.Fields, f)
		}
	}
	return rc
}

// eventRouter checks the outbox section's EventRouter options; the kafka
// section's (topic_regex, column placeholders) are checked with kafka.topic.
func (v *validator) eventRouter(c *Config) {
	for i, s := range c.Outbox.Fields {
		key := fmt.Sprintf("outbox.fields[%d]", i)
		f, err := router.ParseField(s)
		if err != nil {
			v.add(key, s, err.Error(), "write column:header[:alias], column:envelope[:alias] or column:partition")
			continue
		}
		v.identifier(key, f.Column, s)
	}
	if ts := c.Outbox.TimestampColumn; ts != "" {
		v.identifier("outbox.timestamp_column", ts, ts)
	}
	for _, p := range c.Routes().FieldProblems() {
		v.add(p.Key, p.Value, p.Reason, p.Fix)
	}
}
