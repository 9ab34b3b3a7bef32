package inbox

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Event is what a handler needs of a record, read the same way whatever
// format the connector published it in (kafka.format: plain,
// cloudevents-binary or cloudevents-structured).
type Event struct {
	// ID is the event id: the CloudEvents id, else the "id" header.
	ID string
	// Source is the CloudEvents source; "" for a plain record. The
	// specification makes (Source, ID) unique, not ID alone.
	Source string
	// Type is the event type: the CloudEvents type, else "event_type".
	Type string
	// AggregateID is the record key (the CloudEvents subject when the key
	// is empty); AggregateType the "aggregate_type" header.
	AggregateID, AggregateType string
	// Payload is the event's data: the record value in plain and binary
	// records; in a structured one the envelope's data (a JSON value byte
	// for byte under a JSON content type, else the string's text) or
	// data_base64 decoded. nil for a tombstone or an event without data.
	Payload []byte
	// ContentType is the CloudEvents datacontenttype; "" for a plain record.
	ContentType string
	// Txn names the PostgreSQL transaction of an event that exactly_once
	// committed in parts (wire.HeaderTxn; "" for one committed whole), Part
	// its part from 1, and Last whether that part is the transaction's
	// last. A handler that needs the transaction's atomicity keeps a Txn's
	// events until the Last part's arrive.
	Txn  string
	Part int
	Last bool
}

// EventOf reads rec. It fails only for a structured CloudEvent it cannot
// read (not JSON, another event format, data of the wrong shape), which
// no retry will change: a handler should treat that as a poison message.
func EventOf(rec *kgo.Record) (Event, error) {
	ev := Event{AggregateID: string(rec.Key), Payload: rec.Value}
	ev.ID, _ = Header(rec, wire.HeaderID)
	ev.Type, _ = Header(rec, wire.HeaderEventType)
	ev.AggregateType, _ = Header(rec, wire.HeaderAggregateType)
	ev.Txn, ev.Part, ev.Last = txnPart(rec)
	ct, _ := Header(rec, wire.HeaderContentType)
	// The binding's rule: a content-type naming a CloudEvents event format
	// means structured mode, anything else binary (or plain) mode.
	if strings.HasPrefix(ct, wire.CEMediaPrefix) {
		return structured(rec, ev, ct)
	}
	ce := func(attr string) string { v, _ := Header(rec, wire.CEHeaderPrefix+attr); return v }
	if _, ok := Header(rec, wire.CEHeaderPrefix+"specversion"); ok {
		ev.ID, ev.Type, ev.Source = cmp.Or(ce("id"), ev.ID), cmp.Or(ce("type"), ev.Type), ce("source")
		ev.AggregateID, ev.ContentType = cmp.Or(ev.AggregateID, ce("subject")), ct
	}
	return ev, nil
}

// envelope is the part of the JSON event format (CloudEvents 1.0.2
// json-format.md) the inbox reads.
type envelope struct {
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	DataContentType *string         `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
	DataBase64      *string         `json:"data_base64"`
}

func structured(rec *kgo.Record, ev Event, ct string) (Event, error) {
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/cloudevents+json" {
		return ev, fmt.Errorf("inbox: record %s/%d/%d: content-type %q is not the CloudEvents JSON format", rec.Topic, rec.Partition, rec.Offset, ct)
	}
	var env envelope
	if err := json.Unmarshal(rec.Value, &env); err != nil {
		return ev, fmt.Errorf("inbox: record %s/%d/%d: CloudEvents JSON: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	ev.ID, ev.Type, ev.Source = cmp.Or(env.ID, ev.ID), cmp.Or(env.Type, ev.Type), env.Source
	ev.AggregateID = cmp.Or(ev.AggregateID, env.Subject)
	// An absent datacontenttype means JSON (json-format.md 3.1.2).
	ev.ContentType = "application/json"
	if env.DataContentType != nil {
		ev.ContentType = *env.DataContentType
	}
	var err error
	switch {
	case env.Data != nil && env.DataBase64 != nil:
		err = errors.New("both data and data_base64")
	case env.DataBase64 != nil:
		ev.Payload, err = base64.StdEncoding.DecodeString(*env.DataBase64)
	case env.Data == nil:
		ev.Payload = nil
	case wire.JSONContentType(ev.ContentType):
		ev.Payload = env.Data
	default:
		var s string
		if err = json.Unmarshal(env.Data, &s); err == nil {
			ev.Payload = []byte(s)
		} else {
			err = fmt.Errorf("data of content type %q is not a JSON string", ev.ContentType)
		}
	}
	if err != nil {
		return ev, fmt.Errorf("inbox: record %s/%d/%d: CloudEvents JSON: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	return ev, nil
}

// txnPart reads the txn and txn_part headers: "i" for a part before the
// last, "i/i" for the last; a malformed part reads as none.
func txnPart(rec *kgo.Record) (string, int, bool) {
	txn, ok := Header(rec, wire.HeaderTxn)
	part, _ := Header(rec, wire.HeaderTxnPart)
	if !ok {
		return "", 0, false
	}
	i, n, last := strings.Cut(part, "/")
	p, err := strconv.Atoi(i)
	if err != nil || p < 1 || last && n != i {
		return txn, 0, false
	}
	return txn, p, last
}
