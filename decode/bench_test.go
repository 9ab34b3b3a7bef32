package decode

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
)

// A realistic outbox row: uuid id, short aggregate type and id, event type,
// a ~200-byte JSON payload and one header column.
const benchPayload = `{"orderId":"ord-7f3a9c","customerId":"cus-19d2","currency":"EUR",` +
	`"total":"129.90","items":[{"sku":"SKU-1001","qty":2,"price":"39.95"},` +
	`{"sku":"SKU-2040","qty":1,"price":"50.00"}],"placedAt":"2024-05-06T07:08:09Z"}`

func benchDecoder(b *testing.B, payloadType uint32) (*Decoder, pgwire.Wire) {
	m := testMapping()
	m.HeaderColumns = []string{"trace_id"}
	d := NewDecoder(m)
	rel := pgwire.Relation(outboxID, "public", "outbox",
		pgwire.Col{Name: "id", OID: pgwire.OIDUUID}, pgwire.Col{Name: "aggregate_type", OID: pgwire.OIDVarchar}, pgwire.Col{Name: "aggregate_id", OID: pgwire.OIDText},
		pgwire.Col{Name: "event_type", OID: pgwire.OIDVarchar}, pgwire.Col{Name: "payload", OID: payloadType}, pgwire.Col{Name: "trace_id", OID: pgwire.OIDText},
		pgwire.Col{Name: "created_at", OID: pgwire.OIDTimestamptz})
	if _, err := d.Decode(rel); err != nil {
		b.Fatal(err)
	}
	payload := benchPayload
	if payloadType == OIDBytea {
		payload = `\x` + hex.EncodeToString([]byte(benchPayload))
	}
	ins := pgwire.Insert(outboxID, pgwire.Txt("0b8e2a52-3c1f-4f0e-9d59-5b7f3f0f6a11"), pgwire.Txt("order"), pgwire.Txt("ord-7f3a9c"),
		pgwire.Txt("OrderPlaced"), pgwire.Txt(payload), pgwire.Txt("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
		pgwire.Txt("2024-05-06 07:08:09.123456+00"))
	return d, ins
}

func benchInsert(b *testing.B, payloadType uint32) {
	d, ins := benchDecoder(b, payloadType)
	b.SetBytes(int64(len(ins)))
	b.ReportAllocs()
	for b.Loop() {
		res, err := d.Decode(ins)
		if err != nil || res.Kind != KindEvent || len(res.Event.Payload.Bytes) != len(benchPayload) {
			b.Fatalf("%v %v", res, err)
		}
	}
}

func BenchmarkDecodeInsert(b *testing.B)      { benchInsert(b, pgwire.OIDJSONB) }
func BenchmarkDecodeInsertBytea(b *testing.B) { benchInsert(b, OIDBytea) }

// BenchmarkDecodeInsertOtherTable measures the skip path for tables that share
// the publication.
func BenchmarkDecodeInsertOtherTable(b *testing.B) {
	d, _ := benchDecoder(b, pgwire.OIDJSONB)
	if _, err := d.Decode(pgwire.Relation(otherID, "public", "orders", pgwire.Col{Name: "id", OID: pgwire.OIDInt8}, pgwire.Col{Name: "body", OID: pgwire.OIDText})); err != nil {
		b.Fatal(err)
	}
	ins := pgwire.Insert(otherID, pgwire.Txt("12345"), pgwire.Txt(strings.Repeat("x", 200)))
	b.ReportAllocs()
	for b.Loop() {
		if res, err := d.Decode(ins); err != nil || res.Kind != KindSkip {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeBeginCommit(b *testing.B) {
	d := NewDecoder(testMapping())
	benchTime := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	begin := pgwire.Begin(0x16_B374D848, benchTime, 771)
	commit := pgwire.Commit(0x16_B374D848, 0x16_B374D878, benchTime)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Decode(begin); err != nil {
			b.Fatal(err)
		}
		if _, err := d.Decode(commit); err != nil {
			b.Fatal(err)
		}
	}
}
