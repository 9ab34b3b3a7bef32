package contracts

import (
	"fmt"
	"strings"
)

// Strategy is how an event names its subject; it must equal the
// connector's contracts.subject_strategy.
type Strategy string

// Strategies, named as the connector's contracts.subject_strategy values.
const (
	// StrategyTopicRecord is <topic>-<event_type> (the connector's
	// default): the checker needs the topic (Config.TopicTemplate, Topics).
	StrategyTopicRecord Strategy = "topic_record"
	// StrategyRecord is <event_type>: no topic needed.
	StrategyRecord Strategy = "record"
	// StrategyTopic is <topic>-value: one schema per topic.
	StrategyTopic Strategy = "topic"
)

// DefaultTopicTemplate is the connector's default kafka.topic.
const DefaultTopicTemplate = "outbox.event." + placeholder

// placeholder is the one variable of the connector's topic template the
// writer can fill in: the aggregate type.
const placeholder = "{aggregate_type}"

// subjects names the subject of an event as the connector's router and
// contracts.subject_strategy do: a fixed topic of kafka.topics wins over
// the kafka.topic template.
type subjects struct {
	strategy       Strategy
	prefix, suffix string // the template around {aggregate_type}
	templated      bool   // the template has {aggregate_type}
	fixed          map[string]string
}

func newSubjects(s Strategy, template string, fixed map[string]string) (subjects, error) {
	if template == "" {
		template = DefaultTopicTemplate
	}
	switch s {
	case StrategyTopicRecord, StrategyRecord, StrategyTopic:
	default:
		return subjects{}, fmt.Errorf("outbox/contracts: subject strategy %q: use %s, %s or %s (as the connector's contracts.subject_strategy)",
			s, StrategyTopicRecord, StrategyRecord, StrategyTopic)
	}
	before, after, found := strings.Cut(template, placeholder)
	if strings.Contains(before+after, "{") {
		return subjects{}, fmt.Errorf("outbox/contracts: topic template %q: only %s can be filled in by the writer "+
			"(it does not know the row's other columns, nor kafka.topic_regex): list the aggregate types in Topics, or use the record strategy",
			template, placeholder)
	}
	return subjects{strategy: s, prefix: before, suffix: after, templated: found, fixed: fixed}, nil
}

func (n subjects) topic(aggregateType string) string {
	if t, ok := n.fixed[aggregateType]; ok {
		return t
	}
	if !n.templated {
		return n.prefix
	}
	return n.prefix + aggregateType + n.suffix
}

// subject returns the subject of an event.
func (n subjects) subject(aggregateType, eventType string) string {
	switch n.strategy {
	case StrategyRecord:
		return eventType
	case StrategyTopic:
		return n.topic(aggregateType) + "-value"
	}
	return n.topic(aggregateType) + "-" + eventType
}

// mayBeOurs reports whether a registered subject can be the subject of one
// of the writer's events, so that a refresh fetches only those from a
// registry other teams share. Every subject may be one under the record
// strategy.
func (n subjects) mayBeOurs(subject string) bool {
	switch n.strategy {
	case StrategyRecord:
		return true
	case StrategyTopic:
		t, ok := strings.CutSuffix(subject, "-value")
		return ok && n.isTopic(t)
	}
	// topic_record: a topic of ours, "-", an event type (which may hold
	// dashes itself, as topics may).
	for i := range len(subject) {
		if subject[i] == '-' && n.isTopic(subject[:i]) {
			return true
		}
	}
	return false
}

// isTopic reports whether t is a topic the writer's events can go to.
func (n subjects) isTopic(t string) bool {
	for _, f := range n.fixed {
		if f == t {
			return true
		}
	}
	if !n.templated {
		return t == n.prefix
	}
	return len(t) > len(n.prefix)+len(n.suffix) && strings.HasPrefix(t, n.prefix) && strings.HasSuffix(t, n.suffix)
}
