package contracts_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/twmb/franz-go/pkg/sr"
)

const avroOrderV1 = `{"type":"record","name":"OrderCreated","namespace":"com.acme","fields":[
  {"name":"id","type":{"type":"string","logicalType":"uuid"}},
  {"name":"qty","type":"int"},
  {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
  {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
  {"name":"state","type":{"type":"enum","name":"State","symbols":["NEW","PAID"]},"default":"NEW"},
  {"name":"note","type":["null","string"],"default":null}
]}`

// avroOrderV2 adds a field without a default: a consumer on v2 cannot read
// v1 events, so BACKWARD must refuse it.
var avroOrderV2 = strings.Replace(avroOrderV1, `{"name":"qty","type":"int"},`,
	`{"name":"qty","type":"int"},{"name":"currency","type":"string"},`, 1)

// TestAvroEncodesForConsumers: an Avro schema registered in Apicurio is
// resolved by lookup; a payload is encoded by the contracts package, and a
// consumer that knows only the framed value decodes it: the schema read
// back from the registry by the framed id (GET /schemas/ids/{id}),
// linkedin/goavro (not the library that parsed the schema here) reading
// the body. A violating payload names its JSON pointer.
func TestAvroEncodesForConsumers(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	topic := uniqueTopic("avro")
	subject := topic + "-OrderCreated"
	enc := newContracts(t, registry.URL(), contracts.Config{Format: contracts.FormatAvro, Mode: contracts.ModeEncode})
	ref, err := enc.Registry().Register(ctx, subject, avroOrderV1)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	payload := []byte(`{"id":"123e4567-e89b-12d3-a456-426614174000","qty":2,"price":"19.90","at":"2024-05-01T12:00:00.123Z"}`)
	res, err := enc.Apply(ctx, topic, "OrderCreated", payload)
	if err != nil || res.Schema != ref {
		t.Fatalf("encode: %v, %v; want %v", res.Schema, err, ref)
	}
	id, body, err := contracts.ParseHeader(res.Value)
	if err != nil || id != ref.ID {
		t.Fatalf("framed %x: id %d, %v; want %d", res.Value, id, err, ref.ID)
	}
	codec, err := goavro.NewCodec(schemaByID(ctx, t, id))
	if err != nil {
		t.Fatalf("goavro: the registry's schema %d: %v", id, err)
	}
	native, rest, err := codec.NativeFromBinary(body)
	if err != nil || len(rest) != 0 {
		t.Fatalf("goavro decoding %x: %v (%d bytes left)", body, err, len(rest))
	}
	got := native.(map[string]any)
	at := time.Date(2024, 5, 1, 12, 0, 0, 123_000_000, time.UTC)
	if got["id"] != "123e4567-e89b-12d3-a456-426614174000" || got["qty"] != int32(2) ||
		got["price"].(*big.Rat).Cmp(big.NewRat(1990, 100)) != 0 || !got["at"].(time.Time).Equal(at) ||
		got["state"] != "NEW" || got["note"] != nil {
		t.Fatalf("decoded %v", got)
	}

	val := newContracts(t, registry.URL(), contracts.Config{Format: contracts.FormatAvro})
	if res, err := val.Apply(ctx, topic, "OrderCreated", payload); err != nil || string(res.Value) != string(payload) {
		t.Fatalf("validate: %q, %v; want the payload unchanged", res.Value, err)
	}
	_, err = val.Apply(ctx, topic, "OrderCreated",
		[]byte(`{"id":"123e4567-e89b-12d3-a456-426614174000","qty":2,"price":"19.999","at":0}`))
	var v *contracts.Violation
	if !errors.As(err, &v) || v.Pointer != "/price" || v.Schema != ref ||
		v.Reason != `got string "19.999", want decimal(9,2): more than 2 digits after the decimal point` {
		t.Fatalf("violation: %v; want one at /price under %v", err, ref)
	}
}

// schemaByID is what a consumer's deserializer does with the framed id.
func schemaByID(ctx context.Context, t *testing.T, id int) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/schemas/ids/%d", registry.URL(), id), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /schemas/ids/%d: %v", id, err)
	}
	defer resp.Body.Close()
	var out struct {
		Schema     string `json:"schema"`
		SchemaType string `json:"schemaType"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /schemas/ids/%d: HTTP %d, %v", id, resp.StatusCode, err)
	}
	if out.SchemaType != "" && out.SchemaType != "AVRO" {
		t.Fatalf("schema %d has schemaType %s, want AVRO", id, out.SchemaType)
	}
	return out.Schema
}

// TestAvroIncompatibleRefused: under BACKWARD, a version adding a field
// without a default is refused (409) and reported as ErrIncompatible with
// the registry's reason; the subject keeps version 1.
func TestAvroIncompatibleRefused(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	subject := uniqueTopic("avrocompat") + "-OrderCreated"
	reg := newContracts(t, registry.URL(), contracts.Config{Format: contracts.FormatAvro}).Registry()
	if _, err := reg.Register(ctx, subject, avroOrderV1); err != nil {
		t.Fatalf("register v1: %v", err)
	}
	for _, r := range reg.Client().SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, subject) {
		if r.Err != nil {
			t.Fatalf("set BACKWARD: %v", r.Err)
		}
	}
	_, err := reg.Register(ctx, subject, avroOrderV2)
	var re *contracts.RegistryError
	var resp *sr.ResponseError
	if !errors.Is(err, contracts.ErrIncompatible) || contracts.Retryable(err) || !errors.As(err, &re) ||
		re.Subject != subject || !errors.As(err, &resp) || resp.StatusCode != http.StatusConflict {
		t.Fatalf("incompatible v2: %v; want ErrIncompatible (409) naming %s", err, subject)
	}
	if !strings.Contains(err.Error(), "currency") {
		t.Fatalf("incompatible v2: %v; want the registry's reason naming the field", err)
	}
	t.Logf("refused as expected: %v", err)
	s, err := reg.Resolve(ctx, subject)
	if err != nil || s.Ref.Version != 1 {
		t.Fatalf("after the refusal: %v, %v; want version 1", s, err)
	}
	// With a default the same field is compatible.
	withDefault := strings.Replace(avroOrderV2, `"type":"string"}`, `"type":"string","default":"EUR"}`, 1)
	if ref, err := reg.Register(ctx, subject, withDefault); err != nil || ref.Version != 2 {
		t.Fatalf("v2 with a default: %v, %v; want version 2", ref, err)
	}
}
