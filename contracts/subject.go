package contracts

import (
	"errors"
	"fmt"
)

// Strategy is contracts.subject_strategy: how a topic and an event type name
// the subject their schema is registered under. The names follow Confluent's
// serializers (TopicRecordNameStrategy, RecordNameStrategy,
// TopicNameStrategy), with the event type in place of the record name,
// because an outbox topic carries many event types.
type Strategy string

// Strategies.
const (
	// StrategyTopicRecord is <topic>-<event_type>: each type of each topic
	// evolves on its own.
	StrategyTopicRecord Strategy = "topic_record"
	// StrategyRecord is <event_type>: one contract per type, whatever topic
	// carries it.
	StrategyRecord Strategy = "record"
	// StrategyTopic is <topic>-value: one schema for every event of a topic
	// (typically a oneOf over the types).
	StrategyTopic Strategy = "topic"
)

// Strategies lists every contracts.subject_strategy value.
func Strategies() []string {
	return []string{string(StrategyTopicRecord), string(StrategyRecord), string(StrategyTopic)}
}

// errNoEventType: an event without a type has no subject under a strategy
// that names the subject after the type.
var errNoEventType = errors.New("the event has no event_type, so it has no subject")

// Subject returns the subject of an event of eventType on topic.
func (s Strategy) Subject(topic, eventType string) (string, error) {
	switch s {
	case StrategyTopicRecord:
		if eventType == "" {
			return "", errNoEventType
		}
		return topic + "-" + eventType, nil
	case StrategyRecord:
		if eventType == "" {
			return "", errNoEventType
		}
		return eventType, nil
	case StrategyTopic:
		return topic + "-value", nil
	}
	return "", fmt.Errorf("contracts: subject strategy %q: use one of %v", s, Strategies())
}
