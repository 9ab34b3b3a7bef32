// Package wire defines what outbox-cdc's writers, connector and consumers
// must agree on byte for byte: the names of the headers on the records the
// connector publishes (dead letters included) and the content of a
// table-less event (outbox.Emit).
//
// It lives in the outbox module, the lowest layer, and imports only the
// standard library: the connector (router, decode, sink), the outbox library
// and the inbox library all import it, and none of them has to import
// another to agree on a name. docs/contract.md describes the same record for
// readers who do not use Go.
package wire

import (
	"encoding/json"
	"mime"
	"strings"
)

// Headers of every published record, in this order, each omitted when its
// value is NULL. Extra headers (the connector's outbox.header_columns,
// outbox.Event.Headers) follow them and may not reuse these names (Reserved).
const (
	HeaderID            = "id"             // event id; consumers deduplicate on it
	HeaderEventType     = "event_type"     // the event's type
	HeaderAggregateType = "aggregate_type" // selects the topic
)

// HeaderAggregateVersion carries the aggregate's version after the event
// (outbox.Event.Version; the seeds' aggregateVersion), an ordinary extra
// header: the outbox table's aggregate_version column listed in
// outbox.header_columns, or an Emit header. Consumers drop an event older
// than the version they have applied (inbox.Consumer.ApplyVersion).
const HeaderAggregateVersion = "aggregate_version"

// W3C trace-context headers (https://www.w3.org/TR/trace-context/) over Kafka
// headers, as OpenTelemetry's Kafka instrumentations carry them. The connector
// sends them when outbox.trace_column holds a trace context; the inbox
// continues the trace from them.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Headers the connector adds after the others when outbox.source_headers
// names them; rows read from the table instead of the WAL have no lsn or xid.
const (
	HeaderLSN        = "lsn"         // WAL position of the row's insert, e.g. 0/16B3748
	HeaderXid        = "xid"         // PostgreSQL transaction id, decimal
	HeaderCommitTime = "commit_time" // commit time, RFC 3339 UTC with microseconds
)

// Headers of the events of a PostgreSQL transaction that kafka.delivery
// exactly_once committed in more than one Kafka transaction (one too large
// for one: more than kafka.max_buffered_records events). Every event of such
// a transaction carries both; a transaction committed whole carries neither.
// A consumer that needs the transaction's atomicity keeps its events until
// the part whose HeaderTxnPart says "i/i" (the last) arrives.
const (
	HeaderTxn     = "txn"      // the transaction: its xid and commit LSN, e.g. 734@0/16B3748
	HeaderTxnPart = "txn_part" // its part, from 1: "2" for a part before the last, "3/3" for the last of three
)

// Headers a dead letter adds to the record it replaces. The dead letter keeps
// the record's key, value, timestamp and headers; in front of them go
// HeaderError and, when the broker refused the record, HeaderTopic. A row the
// connector rejects before sending carries HeaderAggregateID last, or, when
// aggregate_id is NULL, no such header and the event id as its key. A dead
// letter the dead-letter topic refuses is sent again without its value (with
// HeaderPayloadOmitted), then as a minimal record: no value, the key cut to 64
// bytes, at most the headers error, topic, id, payload_omitted and truncated.
const (
	HeaderError          = "error"           // why the record was dead-lettered; always the first header
	HeaderTopic          = "topic"           // the topic the record was meant for
	HeaderAggregateID    = "aggregate_id"    // the original key, when the router rejected the row
	HeaderPayloadOmitted = "payload_omitted" // why the payload (and more) was left out
	HeaderTruncated      = "truncated"       // the key and headers were cut to fit
)

// Headers of a dead letter for an event contract (the connector's
// contracts.*): after HeaderError, which holds the reason (the JSON pointer
// and what was expected, or that the event type has no subject), and
// HeaderTopic (the topic the event was meant for, where a redrive
// republishes it), the subject the event was checked under and, when a
// schema version was resolved (a violation), its version as a decimal
// number. An event without a subject (no event type) has none of the three.
// The rest is as for any row the connector rejects before sending
// (HeaderAggregateID last).
const (
	HeaderContractSubject = "contract_subject" // the schema registry subject, e.g. orders-OrderPlaced
	HeaderContractVersion = "contract_version" // the subject's version the payload violates, e.g. 3
)

// CloudEvents records (the connector's kafka.format cloudevents-binary and
// cloudevents-structured) follow the CloudEvents 1.0.2 Kafka protocol
// binding and keep the headers above. In binary mode every attribute is a
// header named CEHeaderPrefix + attribute (ce_id, ce_type, ce_subject, …) and
// HeaderContentType holds datacontenttype; in structured mode
// HeaderContentType is CEStructuredJSON and the value is the JSON envelope.
const (
	HeaderContentType = "content-type"
	CEHeaderPrefix    = "ce_"
	CEStructuredJSON  = "application/cloudevents+json; charset=UTF-8"
	// CEMediaPrefix starts the content-type of every structured record,
	// whatever its event format: the binding's test for structured mode.
	CEMediaPrefix = "application/cloudevents"
)

// JSONContentType reports whether a media type declares JSON content,
// */json or */*+json with parameters ignored: the CloudEvents JSON format
// then carries the data as a JSON value rather than a string.
func JSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	_, sub, _ := strings.Cut(mt, "/")
	return sub == "json" || strings.HasSuffix(sub, "+json")
}

// Reserved reports whether name is a header every record carries, which an
// extra header may therefore not use: the record would have two.
func Reserved(name string) bool {
	switch name {
	case HeaderID, HeaderEventType, HeaderAggregateType:
		return true
	}
	return false
}

// Message is the content of a table-less outbox event: a JSON object, UTF-8,
// written with pg_logical_emit_message(true, prefix, content) (content as
// bytea). outbox.Writer.EncodeMessage writes it; the connector's decoder
// reads it.
//
//	{
//	  "id":             "0190f5b2-…",         event id (header "id")
//	  "aggregate_type": "order",              topic selection (header "aggregate_type")
//	  "aggregate_id":   "order-1001",         record key
//	  "event_type":     "OrderPlaced",        header "event_type"
//	  "payload":        {"any": "JSON"},      record value: this JSON value's text
//	  "payload_base64": "AAEC",               record value: these bytes (std base64), instead of payload
//	  "headers":        {"tenant": "acme"}    extra headers, name → text value
//	}
//
// payload and payload_base64 are never both present. Neither present, or
// "payload": null, is a tombstone (nil record value); a JSON null payload
// therefore cannot be sent as the 4-byte value "null" through Emit.
// headers is omitted when empty; its names are never Reserved. Unknown
// members must be ignored by readers.
//
// The four text members are pointers because content written by other
// programs may lack them or hold null, which the connector reads as the NULL
// column of a table event (no header; a NULL aggregate_id is dead-lettered),
// while "" is an empty value. Emit always writes all four.
type Message struct {
	ID            *string           `json:"id"`
	AggregateType *string           `json:"aggregate_type"`
	AggregateID   *string           `json:"aggregate_id"`
	EventType     *string           `json:"event_type"`
	Payload       json.RawMessage   `json:"payload,omitempty"`
	PayloadBase64 *string           `json:"payload_base64,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
}
