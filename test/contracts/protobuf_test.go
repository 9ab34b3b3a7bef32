package contracts_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jhump/protoreflect/desc/protoparse"
	"github.com/jhump/protoreflect/dynamic"
	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/twmb/franz-go/pkg/sr"
)

// orderProtoV1 is the Protobuf contract; OrderCreated is its first message,
// the one events use.
const orderProtoV1 = `syntax = "proto3";
package shop.v1;

import "google/protobuf/timestamp.proto";

message OrderCreated {
  string id = 1;
  int64 qty = 2;
  Status status = 3;
  google.protobuf.Timestamp placed_at = 4;
  repeated Line lines = 5;
  message Line { string sku = 1; }
}

enum Status { STATUS_UNSPECIFIED = 0; NEW = 1; PAID = 2; }
`

// orderProtoV2 changes qty from int64 to string: a consumer on v2 reads a
// v1 event's varint as a length-delimited string, so under BACKWARD the
// registry must refuse it.
var orderProtoV2 = strings.Replace(orderProtoV1, "int64 qty = 2;", "string qty = 2;", 1)

// TestProtobufEncodeDecodes: a .proto registered under the subject is
// resolved and used to encode; a consumer that knows nothing but the
// framed value and the registry (schema by the framed id, compiled by
// another library, jhump/protoreflect) decodes the event with the
// payload's meaning. A payload that does not fit is a violation with its
// pointer, in both modes.
func TestProtobufEncodeDecodes(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	topic := uniqueTopic("proto")
	subject := topic + "-OrderCreated"
	cfg := contracts.Config{Format: contracts.FormatProtobuf}
	admin := newContracts(t, registry.URL(), cfg).Registry()
	ref, err := admin.Register(ctx, subject, orderProtoV1)
	if err != nil {
		t.Fatalf("register: %v", err)
	}

	payload := []byte(`{"id":"o1","qty":"12","status":"PAID","placed_at":"2024-05-01T12:00:00Z","lines":[{"sku":"a"},{"sku":"b"}]}`)
	cfg.Mode = contracts.ModeEncode
	enc := newContracts(t, registry.URL(), cfg)
	res, err := enc.Apply(ctx, topic, "OrderCreated", payload)
	if err != nil || res.Schema != ref {
		t.Fatalf("encode: %v under %v; want %v", err, res.Schema, ref)
	}
	again, err := enc.Apply(ctx, topic, "OrderCreated", payload)
	if err != nil || !bytes.Equal(again.Value, res.Value) {
		t.Fatalf("encode again: %x, %v; want the same bytes %x", again.Value, err, res.Value)
	}

	// The consumer's side: header, schema by id, indexes, message.
	v := res.Value
	if len(v) < 6 || v[0] != 0 {
		t.Fatalf("value %x is not framed", v)
	}
	id := int(binary.BigEndian.Uint32(v[1:5]))
	got, err := admin.Client().SchemaByID(ctx, id)
	if err != nil || id != ref.ID || got.Type != sr.TypeProtobuf {
		t.Fatalf("schema by the framed id %d: %+v, %v; want id %d, PROTOBUF", id, got, err, ref.ID)
	}
	if v[5] != 0 { // Confluent's first message: the single byte 0
		t.Fatalf("message indexes %x, want the single byte 0", v[5:])
	}
	fds, err := protoparse.Parser{Accessor: protoparse.FileContentsFromMap(map[string]string{"o.proto": got.Schema})}.ParseFiles("o.proto")
	if err != nil {
		t.Fatalf("the registry's text does not compile with protoparse: %v\n%s", err, got.Schema)
	}
	dm := dynamic.NewMessage(fds[0].GetMessageTypes()[0])
	if err := dm.Unmarshal(v[6:]); err != nil {
		t.Fatalf("decode %x: %v", v[6:], err)
	}
	js, err := dm.MarshalJSON()
	want := `{"id":"o1","qty":"12","status":"PAID","placedAt":"2024-05-01T12:00:00Z","lines":[{"sku":"a"},{"sku":"b"}]}`
	if err != nil || string(js) != want {
		t.Fatalf("decoded %s, %v; want %s", js, err, want)
	}

	// Violations, in both modes, with the pointer and the expectation.
	val := newContracts(t, registry.URL(), contracts.Config{Format: contracts.FormatProtobuf})
	if res, err := val.Apply(ctx, topic, "OrderCreated", payload); err != nil || !bytes.Equal(res.Value, payload) {
		t.Fatalf("validate good: %q, %v; want the payload unchanged", res.Value, err)
	}
	for _, c := range []*contracts.Contracts{val, enc} {
		_, err = c.Apply(ctx, topic, "OrderCreated", []byte(`{"id":"o1","lines":[{"sku":"a"},{"sku":7}]}`))
		var viol *contracts.Violation
		if !errors.As(err, &viol) || viol.Pointer != "/lines/1/sku" || !strings.Contains(viol.Reason, "want a string") ||
			viol.Keyword != "shop.v1.OrderCreated.Line.sku" || viol.Schema != ref {
			t.Fatalf("bad payload: %v; want a violation at /lines/1/sku under %v", err, ref)
		}
		t.Logf("violation: %v", viol)
	}
}

// TestProtobufIncompatibleRefused: under BACKWARD, changing a field's type
// is refused by Apicurio (409) and reported as ErrIncompatible with the
// registry's reason; the subject keeps version 1.
func TestProtobufIncompatibleRefused(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	subject := uniqueTopic("protocompat") + "-OrderCreated"
	reg := newContracts(t, registry.URL(), contracts.Config{Format: contracts.FormatProtobuf}).Registry()
	if _, err := reg.Register(ctx, subject, orderProtoV1); err != nil {
		t.Fatalf("register v1: %v", err)
	}
	for _, r := range reg.Client().SetCompatibility(ctx, sr.SetCompatibility{Level: sr.CompatBackward}, subject) {
		if r.Err != nil {
			t.Fatalf("set BACKWARD: %v", r.Err)
		}
	}
	_, err := reg.Register(ctx, subject, orderProtoV2)
	var resp *sr.ResponseError
	if !errors.Is(err, contracts.ErrIncompatible) || contracts.Retryable(err) || !errors.As(err, &resp) || resp.StatusCode != 409 ||
		!strings.Contains(err.Error(), "not backward compatible") {
		t.Fatalf("v2 changing qty's type: %v; want ErrIncompatible, the registry's 409 and its reason", err)
	}
	t.Logf("refused as expected: %v", err)
	// Adding a field is compatible: the check is a real one, not a refusal
	// of every change.
	v3 := strings.Replace(orderProtoV1, "repeated Line lines = 5;", "repeated Line lines = 5;\n  string currency = 6;", 1)
	ref, err := reg.Register(ctx, subject, v3)
	if err != nil || ref.Version != 2 {
		t.Fatalf("v3 adding a field: %v, %v; want version 2", ref, err)
	}
}
