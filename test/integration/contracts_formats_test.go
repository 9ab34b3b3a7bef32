package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jhump/protoreflect/desc/protoparse"
	"github.com/jhump/protoreflect/dynamic"
	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Event contracts per format through the binary in encode mode, against
// Apicurio: every record a consumer reads is decoded the way a consumer
// does it, with a library other than the connector's (Avro: linkedin/goavro,
// the connector uses hamba/avro; Protobuf: jhump/protoreflect's dynamic
// message, the connector uses protocompile and dynamicpb), from the schema
// fetched by the id in the frame (GET /schemas/ids/{id}), and compared with
// the meaning of the row's JSON.

const avroOrderPlaced = `{"type": "record", "name": "OrderPlaced", "namespace": "it.contracts", "fields": [
  {"name": "seq", "type": "long"},
  {"name": "qty", "type": "int"},
  {"name": "sku", "type": "string"},
  {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}, "default": "NEW"},
  {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "note", "type": ["null", "string"], "default": null},
  {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line",
    "fields": [{"name": "sku", "type": "string"}, {"name": "n", "type": "int"}]}}, "default": []}]}`

const protoOrderPlaced = `syntax = "proto3";
package it.contracts;

import "google/protobuf/timestamp.proto";

message OrderPlaced {
  int64 seq = 1;
  int32 qty = 2;
  string sku = 3;
  State state = 4;
  google.protobuf.Timestamp at = 5;
  string note = 6;
  repeated Line lines = 7;
  message Line { string sku = 1; int32 n = 2; }
}

enum State { STATE_UNSPECIFIED = 0; NEW = 1; PAID = 2; }
`

const jsonOrderPlaced = `{"type": "object", "properties": {"seq": {"type": "integer"}, "qty": {"type": "integer"},
  "sku": {"type": "string"}}, "required": ["seq", "qty", "sku"]}`

// formatCase is one contracts.format: its schema, its consumer-side
// decoder, the schemaType the registry answers for it, and what its
// decoder shows for a field the row left out.
type formatCase struct {
	format, schema, schemaType string
	decode                     func(schema string, body []byte) (map[string]any, error)
	defaults                   map[string]any
}

var formatCases = []formatCase{
	{format: "avro", schema: avroOrderPlaced, schemaType: "AVRO", decode: decodeAvro,
		defaults: map[string]any{"state": "NEW", "note": nil, "lines": []any{}}},
	{format: "protobuf", schema: protoOrderPlaced, schemaType: "PROTOBUF", decode: decodeProto},
	{format: "json-schema", schema: jsonOrderPlaced, schemaType: "JSON", decode: decodeJSON},
}

// The rows every format gets, by seq; seq 2 violates every schema at /qty.
var formatRows = map[int]struct{ key, payload string }{
	1: {"o-1", `{"seq": 1, "qty": 1, "sku": "a-1", "state": "PAID", "at": "2024-05-01T12:00:00.123Z", "note": "gift", "lines": [{"sku": "x", "n": 2}]}`},
	2: {"o-2", `{"seq": 2, "qty": "two", "sku": "b-2", "at": "2024-05-01T12:00:00Z"}`},
	3: {"o-3", `{"seq": 3, "qty": 3, "sku": "c-3", "at": "2024-05-01T12:00:01Z"}`},
	4: {"o-2", `{"seq": 4, "qty": 4, "sku": "b-4", "state": "NEW", "at": "2024-05-01T12:00:02.456Z"}`},
	5: {"o-1", `{"seq": 5, "qty": 5, "sku": "a-5", "at": "2024-05-01T12:00:03Z", "lines": [{"sku": "y", "n": 1}, {"sku": "z", "n": 3}]}`},
	6: {"o-3", `{"seq": 6, "qty": 6, "sku": "c-6", "state": "PAID", "at": "2024-05-01T12:00:04Z", "note": null}`},
}

func TestContractsFormats(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	reg := startTestRegistry(ctx, t) // contracts_kill_test.go
	for _, fc := range formatCases {
		t.Run(fc.format, func(t *testing.T) { testContractsFormat(ctx, t, reg.URL(), fc) })
	}
}

// testContractsFormat: in encode mode with on_violation quarantine, o-1 and
// o-3 reach the topic framed with the subject's id, keyed by the raw
// aggregate_id, and decode to their rows' meaning; o-2's violating seq 2 is
// dead-lettered with its contract's headers and a reason at /qty, and its
// later seq 4 is parked (framed too), not published.
func testContractsFormat(ctx context.Context, t *testing.T, regURL string, fc formatCase) {
	slot := "ctfmt_" + strings.ReplaceAll(fc.format, "-", "")
	dsn, topic, addr, cfgPath := contractsProcess(t, slot, regURL, fmt.Sprintf(", format: %s, mode: encode", fc.format))
	admin, err := contracts.New(contracts.Config{Registry: contracts.RegistryConfig{URL: regURL}, Format: contracts.Format(fc.format)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ref, err := admin.Registry().Register(rctx, topic+"-OrderPlaced", fc.schema)
	cancel()
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	p := startProcess(t, cfgPath, addr)
	conn := pgConnect(t, dsn)
	ids := map[int]string{}
	for _, seqs := range [][]int{{1, 2, 3}, {4, 5, 6}} {
		committed(t, conn, func(tx pgx.Tx) {
			for _, s := range seqs {
				ids[s] = insert(t, tx, "outbox", "order", formatRows[s].key, "OrderPlaced", formatRows[s].payload)
			}
		})
	}

	dec := &frameDecoder{regURL: regURL, fc: fc, schemas: map[int]string{}}
	pub := consumeN(t, []string{topic}, 4, time.Minute, 2*time.Second)
	parked := consumeN(t, []string{"parking." + slot + "." + runID}, 1, time.Minute, 0)
	dlq := consumeN(t, []string{dlqFor(slot)}, 1, time.Minute, 0)
	got := map[string][]int{}
	for _, r := range pub {
		seq, err := dec.check(ctx, r, ref.ID)
		if err != nil {
			t.Fatalf("%s: record %s@%d: %v", fc.format, r.Key, r.Offset, err)
		}
		got[string(r.Key)] = append(got[string(r.Key)], seq)
	}
	if len(pub) != 4 || !slices.Equal(got["o-1"], []int{1, 5}) || !slices.Equal(got["o-3"], []int{3, 6}) {
		t.Fatalf("%s: the topic holds %v (%d records), want o-1 [1 5] and o-3 [3 6]", fc.format, got, len(pub))
	}
	if len(dlq) != 1 || string(dlq[0].Key) != "o-2" || seqOf(t, dlq[0]) != 2 {
		t.Fatalf("%s: %d dead letters, want o-2's seq 2 alone", fc.format, len(dlq))
	}
	checkContractHeaders(t, dlq[0], ref.Subject, fmt.Sprint(ref.Version), "/qty")
	seq, err := dec.check(ctx, parked[0], ref.ID)
	if q, _ := header(parked[0], quarantine.Header); err != nil || len(parked) != 1 || string(parked[0].Key) != "o-2" || seq != 4 || q != ids[2] {
		t.Fatalf("%s: parked %s seq %d (%v), quarantine %q; want o-2's seq 4 alone, behind %s", fc.format, parked[0].Key, seq, err, q, ids[2])
	}
	reason, _ := header(dlq[0], "error")
	t.Logf("%s: schema id %d; 4 records decoded by the consumer's library to their rows, seq 2 dead-lettered (%s), seq 4 parked",
		fc.format, ref.ID, reason)
	stopClean(t, p)
}

// frameDecoder is a consumer's deserializer: header, schema by id (asked
// of the registry once per id), body.
type frameDecoder struct {
	regURL  string
	fc      formatCase
	schemas map[int]string
}

// check decodes r, framed with schema want, compares it with the row of
// its seq (the key, then every field's meaning) and returns the seq.
func (d *frameDecoder) check(ctx context.Context, r *kgo.Record, want int) (int, error) {
	id, body, err := contracts.ParseHeader(r.Value)
	if err != nil || id != want {
		return 0, fmt.Errorf("frame %.16x: id %d (%v), want %d", r.Value, id, err, want)
	}
	schema, ok := d.schemas[id]
	if !ok {
		if schema, err = schemaText(ctx, d.regURL, id, d.fc.schemaType); err != nil {
			return 0, err
		}
		d.schemas[id] = schema
	}
	got, err := d.fc.decode(schema, body)
	if err != nil {
		return 0, fmt.Errorf("decode %x: %w", body, err)
	}
	seq, err := jsonInt(got["seq"])
	if err != nil {
		return 0, err
	}
	row, ok := formatRows[seq]
	if !ok || row.key != string(r.Key) {
		return seq, fmt.Errorf("seq %d under key %q: not a row of that aggregate_id", seq, r.Key)
	}
	rowJSON, err := decodeJSON("", []byte(row.payload))
	if err != nil {
		return seq, err
	}
	if diff := sameMeaning("", rowJSON, got, d.fc.defaults); diff != "" {
		return seq, fmt.Errorf("decoded %v differs from the row %s: %s", got, row.payload, diff)
	}
	return seq, nil
}

// schemaText is GET <registry>/schemas/ids/{id}, checking its schemaType
// (Apicurio leaves it out for Avro, the API's default).
func schemaText(ctx context.Context, regURL string, id int, schemaType string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/schemas/ids/%d", regURL, id), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct{ Schema, SchemaType string }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /schemas/ids/%d: HTTP %d, %v", id, resp.StatusCode, err)
	}
	if out.SchemaType != schemaType && (out.SchemaType != "" || schemaType != "AVRO") {
		return "", fmt.Errorf("schema %d is %q, want %s", id, out.SchemaType, schemaType)
	}
	return out.Schema, nil
}

// decodeAvro reads the body with goavro; unions (here only ["null",
// "string"]) come back as {"string": v} and are unwrapped, timestamps as
// RFC 3339 text in UTC.
func decodeAvro(schema string, body []byte) (map[string]any, error) {
	codec, err := goavro.NewCodec(schema)
	if err != nil {
		return nil, err
	}
	native, rest, err := codec.NativeFromBinary(body)
	if err != nil || len(rest) != 0 {
		return nil, fmt.Errorf("%v (%d bytes left)", err, len(rest))
	}
	m, ok := native.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("decoded %T, want a record", native)
	}
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			if s, ok := v["string"]; ok && len(v) == 1 {
				m[k] = s
			}
		case time.Time:
			m[k] = v.UTC().Format(time.RFC3339Nano)
		}
	}
	return m, nil
}

// decodeProto compiles the registry's text with protoparse, picks the
// message by the frame's indexes and reads the body into a dynamic message,
// as protojson text (int64 as a string, defaults left out).
func decodeProto(schema string, body []byte) (map[string]any, error) {
	fds, err := protoparse.Parser{Accessor: protoparse.FileContentsFromMap(map[string]string{"c.proto": schema})}.ParseFiles("c.proto")
	if err != nil {
		return nil, err
	}
	n, k := binary.Varint(body)
	if k <= 0 || n < 0 || n > 8 {
		return nil, fmt.Errorf("message indexes %x", body[:min(len(body), 8)])
	}
	body, idx := body[k:], []int64{0}
	if n > 0 {
		idx = idx[:0]
		for range n {
			i, k := binary.Varint(body)
			if k <= 0 {
				return nil, errors.New("message indexes cut short")
			}
			body, idx = body[k:], append(idx, i)
		}
	}
	msgs := fds[0].GetMessageTypes()
	if idx[0] >= int64(len(msgs)) {
		return nil, fmt.Errorf("message index %d of %d", idx[0], len(msgs))
	}
	md := msgs[idx[0]]
	for _, i := range idx[1:] {
		if nested := md.GetNestedMessageTypes(); i < int64(len(nested)) {
			md = nested[i]
		} else {
			return nil, fmt.Errorf("nested message index %d of %d", i, len(nested))
		}
	}
	dm := dynamic.NewMessage(md)
	if err := dm.Unmarshal(body); err != nil {
		return nil, err
	}
	js, err := dm.MarshalJSON()
	if err != nil {
		return nil, err
	}
	return decodeJSON("", js)
}

// decodeJSON: JSON Schema's body is the payload's JSON text.
func decodeJSON(_ string, body []byte) (map[string]any, error) {
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(string(body)))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

// sameMeaning says where got differs from the row want ("" if nowhere):
// numbers and numeric strings by their text (protojson writes int64 as a
// string), a null the decoder left out as absent, and a field the row left
// out only as the format's default.
func sameMeaning(at string, want, got any, defaults map[string]any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: %v, want an object", at, got)
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok && wv == nil {
				continue
			}
			if !ok {
				return fmt.Sprintf("%s/%s missing", at, k)
			}
			if d := sameMeaning(at+"/"+k, wv, gv, nil); d != "" {
				return d
			}
		}
		for k, gv := range g {
			if _, ok := w[k]; ok {
				continue
			}
			dv, ok := defaults[k]
			if !ok {
				return fmt.Sprintf("%s/%s: %v, not in the row", at, k, gv)
			}
			if d := sameMeaning(at+"/"+k, dv, gv, nil); d != "" {
				return d + " (the default)"
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: %v, want %v", at, got, want)
		}
		for i := range w {
			if d := sameMeaning(fmt.Sprintf("%s/%d", at, i), w[i], g[i], nil); d != "" {
				return d
			}
		}
	default:
		if (want == nil) != (got == nil) || fmt.Sprint(want) != fmt.Sprint(got) {
			return fmt.Sprintf("%s: %v (%T), want %v", at, got, got, want)
		}
	}
	return ""
}

// jsonInt is an integer as a decoder returns it.
func jsonInt(v any) (int, error) {
	var n int
	if _, err := fmt.Sscan(fmt.Sprint(v), &n); err != nil {
		return 0, fmt.Errorf("seq %v (%T): %w", v, v, err)
	}
	return n, nil
}
