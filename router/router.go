// Package router turns a decoded outbox row into the Kafka record the
// contract describes: topic, key, value, headers and timestamp.
package router

import (
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
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
	// Partition is the record's partition when HasPartition (an
	// outbox.fields partition column); otherwise the key chooses it.
	Partition    int32
	HasPartition bool
}

// Config holds the routing rules (kafka.topic, kafka.topics, kafka.dlq_topic)
// and the options of Debezium's outbox EventRouter that fit a row outbox
// (docs/operations.md, "Cut-over from Debezium's outbox event router").
type Config struct {
	TopicTemplate string
	Topics        map[string]string
	DLQTopic      string
	// Format is kafka.format ("" is plain); CloudEvents its cloudevents-*
	// settings (cloudevents.go).
	Format      string
	CloudEvents CloudEvents
	// TraceColumn (outbox.trace_column) is the header column holding a trace
	// context, sent as traceparent and tracestate (trace.go); "" for none.
	TraceColumn string
	// OnBadTrace is told about a trace column value without a valid
	// traceparent (the event is published without trace headers).
	OnBadTrace func(ev *decode.Event, problem string)

	// TopicRegex and TopicReplacement (kafka.topic_regex,
	// kafka.topic_replacement): a name the template builds that matches the
	// regex whole is replaced (Java syntax: $1, ${name}), as Kafka
	// Connect's RegexRouter does for route.topic.regex.
	TopicRegex, TopicReplacement string
	// Fields are outbox.fields: extra columns as headers, envelope members
	// or the partition.
	Fields []Field
	// StandardHeaders (outbox.standard_headers) chooses among the id,
	// event_type and aggregate_type headers; nil means all three.
	StandardHeaders []string
	// SourceHeaders (outbox.source_headers) adds lsn, xid, commit_time.
	SourceHeaders []string
	// TimestampColumn (outbox.timestamp_column) is the record timestamp
	// instead of the commit time, when not NULL.
	TimestampColumn string
	// TombstoneOnEmpty (outbox.tombstone_on_empty_payload) publishes an
	// empty or blank payload as a tombstone, envelope or not.
	TombstoneOnEmpty bool
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
	ce             *shaper // nil for the plain format
	traceColumn    string
	onBadTrace     func(ev *decode.Event, problem string)
	gen            *general // nil when prefix and suffix build every topic
	x              extras
}

// New returns a Router for cfg, or the first of cfg.Check's problems.
func New(cfg Config) (*Router, error) {
	if problems := cfg.Check(); len(problems) > 0 {
		return nil, problems[0]
	}
	ce, err := newShaper(cmp.Or(cfg.Format, FormatPlain), cfg.CloudEvents)
	if err != nil {
		return nil, err
	}
	before, after, found := strings.Cut(cfg.TopicTemplate, Placeholder)
	r := &Router{prefix: before, suffix: after, templated: found, fixed: cfg.Topics, dlq: cfg.DLQTopic,
		cache: make(map[string]route), x: newExtras(cfg),
		ce: ce, traceColumn: cfg.TraceColumn, onBadTrace: cfg.OnBadTrace}
	if cfg.TopicRegex != "" || len(templateColumns(cfg.TopicTemplate)) > 0 {
		g, err := newGeneral(cfg)
		if err != nil {
			return nil, Problem{"kafka.topic_regex", cfg.TopicRegex, err.Error(), ""}
		}
		r.gen = g
	}
	return r, nil
}

// Problem is a routing setting that cannot work, worded for the
// configuration: its key, its value, what is wrong and what to do ("" when
// the problem says it).
type Problem struct{ Key, Value, Reason, Fix string }

func (p Problem) Error() string { return fmt.Sprintf("%s %q: %s", p.Key, p.Value, p.Reason) }

// Check returns every problem of cfg: a template (kafka.topic) with another
// placeholder than Placeholder, or with literal text that makes every topic
// illegal; an illegal fixed topic (kafka.topics) or dead-letter topic
// (kafka.dlq_topic); a dead-letter topic that events can be routed to.
func (cfg Config) Check() []Problem {
	var out []Problem
	if p := templateProblem(cfg.TopicTemplate, cfg.TopicRegex == ""); p != "" {
		out = append(out, Problem{"kafka.topic", cfg.TopicTemplate, p,
			"the placeholders are " + Placeholder + " and " + columnPrefix + "NAME} (a column of the outbox table)"})
	}
	if cfg.TopicRegex != "" {
		if _, err := newGeneral(cfg); err != nil {
			out = append(out, Problem{"kafka.topic_regex", cfg.TopicRegex + " -> " + cfg.TopicReplacement, err.Error(),
				"a Go regexp (RE2) and a replacement with $1 or ${name}"})
		}
	}
	out = append(out, cfg.FieldProblems()...)
	for _, at := range slices.Sorted(maps.Keys(cfg.Topics)) {
		key := fmt.Sprintf("kafka.topics[%q]", at)
		if at == "" {
			out = append(out, Problem{key, "", "empty aggregate type", "remove the entry"})
		}
		if p := topicProblem(cfg.Topics[at]); p != "" {
			out = append(out, Problem{key, cfg.Topics[at], p, ""})
		}
	}
	if p := topicProblem(cfg.DLQTopic); p != "" {
		out = append(out, Problem{"kafka.dlq_topic", cfg.DLQTopic, p, ""})
	} else if clash := cfg.dlqClash(); clash != "" {
		out = append(out, Problem{"kafka.dlq_topic", cfg.DLQTopic, clash, "choose a dead-letter topic no event can be published to"})
	}
	return out
}

// A placeholder runs from { to the next }; a brace without its partner
// matches alone.
var placeholderRE = regexp.MustCompile(`\{[^}]*\}?|\}`)

// templateProblem checks a template: at most one Placeholder, no other
// placeholder than column ones, and, when legal is set (no regex rewrites the
// name), a legal topic name once the placeholders are replaced.
func templateProblem(t string, legal bool) string {
	if t == "" {
		return "must not be empty"
	}
	for _, ph := range placeholderRE.FindAllString(t, -1) {
		switch {
		case ph == "}":
			return "unmatched }"
		case !strings.HasSuffix(ph, "}"):
			return "unmatched {"
		case ph != Placeholder && columnOf(ph) == "":
			return "unknown placeholder " + ph
		}
	}
	cols := templateColumns(t)
	for _, c := range cols {
		t = strings.ReplaceAll(t, columnPrefix+c+"}", "x") // a value adds at least a character
	}
	before, after, found := strings.Cut(t, Placeholder)
	name := t
	if found {
		name = before + "x" + after // an aggregate type adds at least a character
	}
	f, _ := topicFaultOf(name)
	switch {
	case strings.Contains(after, Placeholder):
		return Placeholder + " may appear once"
	case f == topicOK || !legal:
		return ""
	case (found || len(cols) > 0) && f == topicTooLong:
		return "too long: a topic name has at most 249 characters"
	case f == topicBadChar:
		return "a " + configWording[f]
	default:
		return configWording[f]
	}
}

// configWording words a topic fault for the configuration; runtime
// dead-letter reasons use CheckTopic's.
var configWording = map[topicFault]string{
	topicEmpty:   "empty topic name",
	topicDots:    `topic name cannot be "." or ".."`,
	topicTooLong: "topic name longer than 249 characters",
	topicBadChar: "topic name may only contain letters, digits, '.', '_' and '-'",
}

// topicProblem says, in the configuration's words, why a configured topic
// name is illegal, or "".
func topicProblem(name string) string {
	f, _ := topicFaultOf(name)
	return configWording[f]
}

// dlqClash says how an event could be published to the dead-letter topic:
// it is a fixed topic or a name the template can produce.
func (cfg Config) dlqClash() string {
	for _, at := range slices.Sorted(maps.Keys(cfg.Topics)) {
		if cfg.Topics[at] == cfg.DLQTopic {
			return fmt.Sprintf("same as kafka.topics[%q]", at)
		}
	}
	// A bare placeholder can produce any name; rejecting every dead-letter
	// topic for it would forbid a common setup, so only a template with
	// literal text (a namespace for event topics) is checked.
	before, after, found := strings.Cut(cfg.TopicTemplate, Placeholder)
	d := cfg.DLQTopic
	switch {
	case templateProblem(cfg.TopicTemplate, true) != "" || cfg.TopicTemplate == Placeholder ||
		cfg.TopicRegex != "" || len(templateColumns(cfg.TopicTemplate)) > 0:
	case !found && d == cfg.TopicTemplate:
		return "same as kafka.topic"
	case found && len(d) > len(before)+len(after) && strings.HasPrefix(d, before) && strings.HasSuffix(d, after):
		return fmt.Sprintf("kafka.topic publishes events of aggregate_type %q to it", d[len(before):len(d)-len(after)])
	}
	return ""
}

// Route fills rec for ev committed at commit. It returns a non-empty reason
// when the row can never be published; the caller then dead-letters it.
func (r *Router) Route(ev *decode.Event, commit time.Time, rec *Record) (reason string) {
	return r.RouteFrom(ev, Source{Commit: commit}, rec)
}

// DeadLetter fills rec with the dead-letter record for ev, in the shape
// wire's dead-letter headers describe: the original key (or the event id when
// aggregate_id is NULL), payload and headers, the reason in the error header
// first and aggregate_id last.
func (r *Router) DeadLetter(ev *decode.Event, commit time.Time, reason string, rec *Record) {
	rec.Topic = r.dlq
	rec.Partition, rec.HasPartition = 0, false
	rec.Key = ev.AggregateID.Bytes
	if ev.AggregateID.Null {
		rec.Key = ev.ID.Bytes
	}
	rec.Value = valueOf(ev.Payload)
	rec.Timestamp = commit
	h := append(rec.Headers[:0], Header{wire.HeaderError, []byte(reason)})
	h = appendHeaders(h, ev)
	if r.traceColumn != "" {
		h = r.traceHeaders(h, ev)
	}
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

func (r *Router) topicFor(ev *decode.Event) route {
	if r.gen != nil {
		return r.generalTopic(ev)
	}
	aggType := ev.AggregateType
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

// generalTopic builds the topic from column placeholders and the regex; a
// kafka.topics entry for the aggregate type still wins.
func (r *Router) generalTopic(ev *decode.Event) route {
	if !ev.AggregateType.Null {
		if t, ok := r.fixed[string(ev.AggregateType.Bytes)]; ok {
			return route{topic: t}
		}
	}
	name, reason := r.gen.name(ev)
	if reason != "" {
		return route{reason: reason}
	}
	if rt, ok := r.cache[string(name)]; ok {
		return rt
	}
	rt := r.gen.resolve(string(name))
	if len(r.cache) < maxTopicCache {
		r.cache[string(name)] = rt
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

// topicFault is what makes a name an illegal Kafka topic name.
type topicFault int

const (
	topicOK topicFault = iota
	topicEmpty
	topicDots
	topicTooLong
	topicBadChar
)

// topicFaultOf applies Kafka's rule (org.apache.kafka.common.internals.
// Topic.validate): 1 to 249 characters of [a-zA-Z0-9._-], and not "." or
// "..". For topicBadChar it also returns the first character refused.
func topicFaultOf(name string) (topicFault, byte) {
	switch {
	case name == "":
		return topicEmpty, 0
	case name == "." || name == "..":
		return topicDots, 0
	case len(name) > 249:
		return topicTooLong, 0
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return topicBadChar, c
		}
	}
	return topicOK, 0
}

// CheckTopic returns why name is not a legal Kafka topic name, or "".
func CheckTopic(name string) string {
	switch f, c := topicFaultOf(name); f {
	case topicEmpty:
		return "empty"
	case topicDots:
		return `"." and ".." are not allowed`
	case topicTooLong:
		return fmt.Sprintf("%d characters, the limit is 249", len(name))
	case topicBadChar:
		return fmt.Sprintf("character %q is not allowed (only a-z A-Z 0-9 . _ -)", c)
	}
	return ""
}
