package main

import (
	"fmt"
	"strconv"
)

// Every benchmark event carries its sequence number in its id, a UUID whose
// last 12 hex digits are the number. Consumers recover it from the record's
// "id" header to count distinct events and to pair an event with its commit.
const idPrefix = "00000000-0000-4000-8000-"

func eventID(seq int) string { return fmt.Sprintf("%s%012x", idPrefix, seq) }

// seqOf parses an event id; ok is false for ids not made by eventID.
func seqOf(id []byte) (int, bool) {
	if len(id) != len(idPrefix)+12 || string(id[:len(idPrefix)]) != idPrefix {
		return 0, false
	}
	n, err := strconv.ParseUint(string(id[len(idPrefix):]), 16, 48)
	return int(n), err == nil
}

// payloadJSON is the event body: the shape and size (~230 bytes) of the
// decoder benchmark's realistic order event, plus the sequence number.
const payloadJSON = `"orderId":"ord-7f3a9c","customerId":"cus-19d2","currency":"EUR","total":"129.90",` +
	`"items":[{"sku":"SKU-1001","qty":2,"price":"39.95"},{"sku":"SKU-2040","qty":1,"price":"50.00"}],` +
	`"placedAt":"2024-05-06T07:08:09Z"}`

func payload(seq int) string { return `{"seq":` + strconv.Itoa(seq) + `,` + payloadJSON }

// aggregates is how many distinct aggregate ids (Kafka keys) the events use.
const aggregates = 1000

// insertSQL is the writers' one-row insert into table: $1 id, $2
// aggregate_type, $3 aggregate_id, $4 payload.
func insertSQL(table string) string {
	return `INSERT INTO ` + table + ` (id, aggregate_type, aggregate_id, event_type, payload)
		VALUES ($1::uuid, $2, $3, 'OrderPlaced', $4::jsonb)`
}

func insertArgs(aggType string, seq int) []any {
	return []any{eventID(seq), aggType, "agg-" + strconv.Itoa(seq%aggregates), payload(seq)}
}
