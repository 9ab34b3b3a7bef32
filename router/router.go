// Package router turns a decoded outbox row into the Kafka record the
// contract describes: topic, key, value, headers and timestamp.
package router

import (
	"fmt"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Placeholder is the one variable a topic template may use.
const Placeholder = "{aggregate_type}"

// maxTopicCache bounds the memory spent on distinct aggregate types; past it
// topics are computed per event, which only costs speed.
const maxTopicCache = 4096

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is a Kafka record before it is handed to the sink. Its byte slices
// alias the decoded event; the headers slice is reused between calls.
type Record struct {
	Topic     string
	Key       []byte
	Value     []byte // nil for a tombstone
	Headers   []Header
	Timestamp time.Time
}

// Config holds the routing rules (kafka.topic, kafka.topics, kafka.dlq_topic).
type Config struct {
	TopicTemplate string
	Topics        map[string]string
	DLQTopic      string
}

type route struct {
	topic  string
	reason string // non-empty when the topic can never be used
}

// Router is used by one goroutine at a time.
type Router struct {
	prefix, suffix string
	templated      bool
	fixed          map[string]string
	dlq            string
	cache          map[string]route
}

// New validates cfg and returns a Router.
func New(cfg Config) (*Router, error) {
	r := &Router{fixed: cfg.Topics, dlq: cfg.DLQTopic, cache: make(map[string]route)}
	before, after, found := strings.Cut(cfg.TopicTemplate, Placeholder)
	r.prefix, r.suffix, r.templated = before, after, found
	if strings.Contains(after, Placeholder) {
		return nil, fmt.Errorf("kafka.topic %q: %s may appear once", cfg.TopicTemplate, Placeholder)
	}
	// The literal text must be legal too: check the template with a stand-in
	// aggregate type, so a bad prefix stops start-up instead of dead-lettering
	// every event.
	if reason := CheckTopic(before + "x" + after); found && reason != "" {
		return nil, fmt.Errorf("kafka.topic %q: %s", cfg.TopicTemplate, reason)
	} else if reason := CheckTopic(cfg.TopicTemplate); !found && reason != "" {
		return nil, fmt.Errorf("kafka.topic %q: %s", cfg.TopicTemplate, reason)
	}
	if reason := CheckTopic(cfg.DLQTopic); reason != "" {
		return nil, fmt.Errorf("kafka.dlq_topic %q: %s", cfg.DLQTopic, reason)
	}
	for k, v := range cfg.Topics {
		if reason := CheckTopic(v); reason != "" {
			return nil, fmt.Errorf("kafka.topics.%s %q: %s", k, v, reason)
		}
	}
	return r, nil
}

// Route fills rec for ev committed at commit. It returns a non-empty reason
// when the row can never be published; the caller then dead-letters it.
func (r *Router) Route(ev *decode.Event, commit time.Time, rec *Record) (reason string) {
	if ev.Invalid != "" {
		return ev.Invalid
	}
	if ev.AggregateID.Null {
		return "aggregate_id is NULL"
	}
	rt := r.topicFor(ev.AggregateType)
	if rt.reason != "" {
		return rt.reason
	}
	rec.Topic = rt.topic
	rec.Key = ev.AggregateID.Bytes
	rec.Value = valueOf(ev.Payload)
	rec.Timestamp = commit
	rec.Headers = appendHeaders(rec.Headers[:0], ev)
	return ""
}

// DeadLetter fills rec with the dead-letter record for ev, in the shape
// wire's dead-letter headers describe: the original key (or the event id when
// aggregate_id is NULL), payload and headers, the reason in the error header
// first and aggregate_id last.
func (r *Router) DeadLetter(ev *decode.Event, commit time.Time, reason string, rec *Record) {
	rec.Topic = r.dlq
	rec.Key = ev.AggregateID.Bytes
	if ev.AggregateID.Null {
		rec.Key = ev.ID.Bytes
	}
	rec.Value = valueOf(ev.Payload)
	rec.Timestamp = commit
	h := append(rec.Headers[:0], Header{wire.HeaderError, []byte(reason)})
	h = appendHeaders(h, ev)
	if !ev.AggregateID.Null {
		h = append(h, Header{wire.HeaderAggregateID, ev.AggregateID.Bytes})
	}
	rec.Headers = h
}

func valueOf(v decode.Value) []byte {
	if v.Null {
		return nil
	}
	if v.Bytes == nil {
		return []byte{} // an empty payload is not a tombstone
	}
	return v.Bytes
}

// appendHeaders adds id, event_type, aggregate_type and the configured header
// columns; NULL values are omitted (contract, "headers").
func appendHeaders(h []Header, ev *decode.Event) []Header {
	add := func(key string, v decode.Value) {
		if !v.Null {
			h = append(h, Header{key, v.Bytes})
		}
	}
	add(wire.HeaderID, ev.ID)
	add(wire.HeaderEventType, ev.EventType)
	add(wire.HeaderAggregateType, ev.AggregateType)
	for _, c := range ev.Headers {
		add(c.Name, c.Value)
	}
	return h
}

func (r *Router) topicFor(aggType decode.Value) route {
	if aggType.Null {
		if r.templated {
			return route{reason: "aggregate_type is NULL and kafka.topic uses " + Placeholder}
		}
		return route{topic: r.prefix}
	}
	// A map index with string(b) does not allocate.
	if rt, ok := r.cache[string(aggType.Bytes)]; ok {
		return rt
	}
	at := string(aggType.Bytes)
	rt := r.resolve(at)
	if len(r.cache) < maxTopicCache {
		r.cache[at] = rt
	}
	return rt
}

func (r *Router) resolve(aggType string) route {
	if t, ok := r.fixed[aggType]; ok {
		return route{topic: t}
	}
	if !r.templated {
		return route{topic: r.prefix}
	}
	t := r.prefix + aggType + r.suffix
	if reason := CheckTopic(t); reason != "" {
		return route{reason: fmt.Sprintf("topic %q for aggregate_type %q is not a legal Kafka topic name: %s", t, aggType, reason)}
	}
	return route{topic: t}
}

// CheckTopic returns why name is not a legal Kafka topic name, or "".
// Kafka's rule (org.apache.kafka.common.internals.Topic.validate): 1 to 249
// characters of [a-zA-Z0-9._-], and not "." or "..".
func CheckTopic(name string) string {
	switch {
	case name == "":
		return "empty"
	case name == "." || name == "..":
		return `"." and ".." are not allowed`
	case len(name) > 249:
		return fmt.Sprintf("%d characters, the limit is 249", len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Sprintf("character %q is not allowed (only a-z A-Z 0-9 . _ -)", c)
		}
	}
	return ""
}
