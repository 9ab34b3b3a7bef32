package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-cdc/outbox-cdc/outbox"
	writer "github.com/outbox-cdc/outbox-cdc/outbox/contracts"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// The demo's one contract: PaymentCaptured events of aggregate type payment,
// on topic outbox.event.payment, under the connector's default subject
// strategy (topic_record: <topic>-<event_type>).
const (
	paymentTopic   = "outbox.event.payment"
	paymentSubject = paymentTopic + "-PaymentCaptured"
	paymentSchema  = `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "type": "object",
  "properties": {
    "payment_id":   {"type": "string"},
    "amount_cents": {"type": "integer", "minimum": 1},
    "currency":     {"type": "string", "pattern": "^[A-Z]{3}$"}
  },
  "required": ["payment_id", "amount_cents", "currency"]
}`
)

// demoEvent is one row the contracts step writes.
type demoEvent struct {
	aggID, eventType, payload string
}

// The contracts step writes validEvents, waits until they are published,
// then laterEvents: pay-1's violation is dead-lettered and pay-1 is
// quarantined, so its PaymentRefunded is parked behind it; pay-3 is not
// held up. PaymentRefunded has no contract and passes
// (contracts.unknown_type: pass).
var (
	validEvents = []demoEvent{
		{"pay-1", "PaymentCaptured", `{"payment_id": "pay-1", "amount_cents": 1250, "currency": "EUR"}`},
		{"pay-2", "PaymentCaptured", `{"payment_id": "pay-2", "amount_cents": 990, "currency": "USD"}`},
	}
	laterEvents = []demoEvent{
		{"pay-1", "PaymentCaptured", `{"payment_id": "pay-1", "amount_cents": "12.50", "currency": "EUR"}`},
		{"pay-1", "PaymentRefunded", `{"payment_id": "pay-1", "amount_cents": 1250}`},
		{"pay-3", "PaymentCaptured", `{"payment_id": "pay-3", "amount_cents": 4200, "currency": "GBP"}`},
	}
)

// tickSchemas are the contracts of the burst's and the steady stream's Tick
// events, so that the measurements include the check. Every high-volume
// type has a contract here: an event of a type without one costs the
// connector a registry request (unknown_type pass), which a burst of
// 20,000 would pay 20,000 times.
var tickSchemas = map[string]string{
	"outbox.event.burst-Tick":  `{"type": "object", "properties": {"i": {"type": "integer", "minimum": 0}}, "required": ["i"]}`,
	"outbox.event.steady-Tick": `{"type": "object"}`,
}

// registerContracts registers the PaymentCaptured schema and the Tick
// schemas, as a team would with `outbox-cdc contracts register` before its
// deploy, and returns PaymentCaptured's version.
func registerContracts(ctx context.Context, url string) (int, error) {
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		return 0, err
	}
	for subject, schema := range tickSchemas {
		if _, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: schema, Type: sr.TypeJSON}); err != nil {
			return 0, fmt.Errorf("register %s: %w", subject, err)
		}
	}
	ss, err := cl.CreateSchema(ctx, paymentSubject, sr.Schema{Schema: paymentSchema, Type: sr.TypeJSON})
	if err != nil {
		return 0, fmt.Errorf("register %s: %w", paymentSubject, err)
	}
	return ss.Version, nil
}

// contractsStep shows both checks: the writer library refusing a violating
// payload before the INSERT, then the connector publishing valid events,
// dead-lettering a violating one a writer without the check inserted, and
// parking its aggregate's next event.
func (d *demo) contractsStep(ctx context.Context) error {
	say("\ncontracts: %s is registered (version %d) in the schema registry (JSON Schema: amount_cents integer >= 1, currency ^[A-Z]{3}$);",
		paymentSubject, d.contractVersion)
	say("  so are the Tick events of the burst and the steady stream below: their numbers include the check")
	if err := d.writerRefuses(ctx); err != nil {
		return err
	}
	say("  a writer without the check (plain SQL) inserts events, each in its own transaction:")
	if err := d.insertAll(ctx, validEvents); err != nil {
		return err
	}
	published, err := consume(ctx, d.kafka.Brokers(), []string{paymentTopic}, len(validEvents), 30*time.Second)
	if err != nil {
		return fmt.Errorf("contracts: valid events: %w", err)
	}
	say("  published, checked against version %d:", d.contractVersion)
	printRecords(published)
	say("  then a violating event and the next event of the same aggregate:")
	if err := d.insertAll(ctx, laterEvents); err != nil {
		return err
	}
	// One more published (pay-3), one dead letter, one parked.
	recs, err := consume(ctx, d.kafka.Brokers(), []string{paymentTopic, "outbox.dlq", "outbox.parking"}, len(published)+3, 30*time.Second)
	if err != nil {
		return fmt.Errorf("contracts: the violation: %w", err)
	}
	byTopic := map[string][]*kgo.Record{}
	for _, r := range recs {
		byTopic[r.Topic] = append(byTopic[r.Topic], r)
	}
	say("  dead-lettered, with its reason:")
	for _, r := range byTopic["outbox.dlq"] {
		say("    %-21s key=%-6s %s=%s %s=%s", r.Topic, r.Key, wire.HeaderContractSubject, header(r, wire.HeaderContractSubject),
			wire.HeaderContractVersion, header(r, wire.HeaderContractVersion))
		say("      error: %s", header(r, wire.HeaderError))
	}
	say("  parked behind it, in order, until a redrive:")
	printRecords(byTopic["outbox.parking"])
	say("  other aggregates are not held up:")
	printRecords(slices.DeleteFunc(byTopic[paymentTopic], func(r *kgo.Record) bool {
		return slices.ContainsFunc(published, func(p *kgo.Record) bool { return p.Partition == r.Partition && p.Offset == r.Offset })
	}))
	say("  fix the producer or register a version the payload fits, then `outbox-cdc redrive --aggregate pay-1` (docs/contracts.md)")
	return nil
}

func (d *demo) insertAll(ctx context.Context, events []demoEvent) error {
	for _, e := range events {
		if _, err := d.conn.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('payment', $1, $2, $3)`,
			e.aggID, e.eventType, e.payload); err != nil {
			return err
		}
		say("    %-6s %-16s %s", e.aggID, e.eventType, e.payload)
	}
	return nil
}

func printRecords(recs []*kgo.Record) {
	for _, r := range recs {
		say("    %-21s key=%-6s %-16s %s", r.Topic, r.Key, header(r, wire.HeaderEventType), r.Value)
	}
}

// writerRefuses writes one valid and one violating PaymentCaptured through
// outbox.Writer with the registry-backed checker: the violation is refused
// before the INSERT, and the transaction goes on or rolls back as the
// service decides. The event is not part of contractEvents.
func (d *demo) writerRefuses(ctx context.Context) error {
	chk, err := writer.New(writer.Config{URL: d.registry.URL(), UnknownType: writer.UnknownPass})
	if err != nil {
		return err
	}
	if err := chk.Start(ctx); err != nil { // loads the subjects outside any transaction
		return err
	}
	defer chk.Stop()
	w, err := outbox.New(outbox.Config{Contracts: chk})
	if err != nil {
		return err
	}
	tx, err := d.conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit: a no-op
	err = w.Write(ctx, tx, outbox.Event{AggregateType: "payment", AggregateID: "pay-0", EventType: "PaymentCaptured",
		Payload: map[string]any{"payment_id": "pay-0", "amount_cents": 500, "currency": "eur"}})
	var v *outbox.ContractViolation
	if !errors.As(err, &v) {
		return fmt.Errorf("the writer accepted a violating payload: %v", err)
	}
	say("  outbox.Writer with outbox/contracts refuses a violating payload before the INSERT, nothing written:")
	say("    %s", strings.TrimPrefix(err.Error(), "outbox: "))
	return tx.Rollback(ctx)
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
