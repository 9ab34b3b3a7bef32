package contracts

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
)

// benchPayload is an outbox payload of about the size make bench writes
// (~230 bytes).
var benchPayload = []byte(`{"order_id":"ord-000123","customer":"cus-4711","amount_cents":129900,` +
	`"currency":"EUR","status":"PAID","lines":[{"sku":"sku-1","qty":2},{"sku":"sku-22","qty":1}],` +
	`"note":"deliver to the back door, ring twice"}`)

var benchSchemas = map[Format]string{
	FormatJSONSchema: `{"type":"object","required":["order_id","customer","amount_cents","currency","status"],` +
		`"properties":{"order_id":{"type":"string"},"customer":{"type":"string"},"amount_cents":{"type":"integer","minimum":0},` +
		`"currency":{"type":"string","pattern":"^[A-Z]{3}$"},"status":{"enum":["NEW","PAID","SHIPPED"]},` +
		`"lines":{"type":"array","items":{"type":"object","required":["sku","qty"],` +
		`"properties":{"sku":{"type":"string"},"qty":{"type":"integer"}},"additionalProperties":false}},` +
		`"note":{"type":"string"}},"additionalProperties":false}`,
	FormatAvro: `{"type":"record","name":"Order","fields":[{"name":"order_id","type":"string"},` +
		`{"name":"customer","type":"string"},{"name":"amount_cents","type":"long"},{"name":"currency","type":"string"},` +
		`{"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID","SHIPPED"]}},` +
		`{"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[` +
		`{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}},{"name":"note","type":["null","string"],"default":null}]}`,
	FormatProtobuf: `syntax = "proto3"; package bench; message Order { string order_id = 1; string customer = 2; ` +
		`int64 amount_cents = 3; string currency = 4; Status status = 5; repeated Line lines = 6; string note = 7; ` +
		`message Line { string sku = 1; int32 qty = 2; } enum Status { NEW = 0; PAID = 1; SHIPPED = 2; } }`,
}

var benchTypes = map[Format]sr.SchemaType{FormatJSONSchema: sr.TypeJSON, FormatAvro: sr.TypeAvro, FormatProtobuf: sr.TypeProtobuf}

// BenchmarkApply: the per-event cost of a contract once its subject is
// cached (the steady state), per format and mode, for docs/performance.md
// and make bench's micro-benchmarks. The registry is srfake: a cached
// subject asks it nothing.
func BenchmarkApply(b *testing.B) {
	for _, f := range []Format{FormatJSONSchema, FormatAvro, FormatProtobuf} {
		for _, m := range []Mode{ModeValidate, ModeEncode} {
			b.Run(string(f)+"/"+string(m), func(b *testing.B) {
				fake := srfake.New()
				b.Cleanup(fake.Close)
				fake.SeedSchema("orders-OrderPaid", 1, 7, sr.Schema{Schema: benchSchemas[f], Type: benchTypes[f]})
				c, err := New(Config{Format: f, Mode: m, Registry: RegistryConfig{URL: fake.URL()}})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				if _, err := c.Apply(ctx, "orders", "OrderPaid", benchPayload); err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(len(benchPayload)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Apply(ctx, "orders", "OrderPaid", benchPayload); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
