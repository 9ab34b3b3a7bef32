package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Redrive and verify --repair under event contracts, against Apicurio: a
// redrive checks the dead letter's payload against the subject's latest
// version, and verify's repair checks rows as the stream does.

// widerSchema is version 2 of orderSchema: qty may be a string too; seq and
// qty stay required.
const widerSchema = `{"type": "object",
  "properties": {"seq": {"type": "integer"}, "qty": {"type": ["integer", "string"]}},
  "required": ["seq", "qty"]}`

func TestContractsRedrive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	reg := startContractsRegistry(ctx, t)
	for _, delivery := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(delivery, func(t *testing.T) { testContractsRedrive(ctx, t, reg, delivery) })
	}
}

// contractsRegistry is the registry's URL and a client to register with.
type contractsRegistry struct {
	url   string
	admin *contracts.Contracts
}

func startContractsRegistry(ctx context.Context, t *testing.T) *contractsRegistry {
	t.Helper()
	reg, err := testenv.StartRegistry(ctx)
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	admin, err := contracts.New(contracts.Config{Registry: contracts.RegistryConfig{URL: reg.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	return &contractsRegistry{url: reg.URL(), admin: admin}
}

func (r *contractsRegistry) register(ctx context.Context, t *testing.T, subject, schema string) contracts.SchemaRef {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ref, err := r.admin.Registry().Register(rctx, subject, schema)
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ref
}

// contractsEncodeConfig is a database and the binary's configuration with
// contracts in encode mode and dlq.mode quarantine; kafkaMore are more
// kafka keys (YAML flow mapping members, each followed by ", ").
func contractsEncodeConfig(t *testing.T, slot, url, kafkaMore string) (dsn, topic, addr, cfgPath string) {
	t.Helper()
	dsn = newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	topic, addr = topicFor(slot), freeAddr(t)
	cfgPath = writeConfig(t, fmt.Sprintf(`postgres: {dsn: %q, slot: %s, publication: %s, status_interval: 200ms}
kafka: {%sbrokers: [%s], dlq_topic: %s, topic: %q, topics: {order: %s}, parking_topic: parking.%s.%s, quarantine_topic: quarantine.%s.%s}
http: {listen: %q}
contracts: {registry: {url: %q}, mode: encode}
`, dsn, slot, slot, kafkaMore, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, topic, slot, runID, slot, runID, addr, url))
	return dsn, topic, addr, cfgPath
}

// framedAs checks that r is seq framed with schema id.
func framedAs(t *testing.T, r *kgo.Record, id, seq int) {
	t.Helper()
	got, body, err := contracts.ParseHeader(r.Value)
	var v struct{ Seq int }
	if err != nil || got != id || json.Unmarshal(body, &v) != nil || v.Seq != seq {
		t.Fatalf("record %q %x: want seq %d framed with id %d (%v)", r.Key, r.Value, seq, id, err)
	}
	for _, h := range r.Headers {
		switch h.Key {
		case wire.HeaderError, wire.HeaderTopic, wire.HeaderContractSubject, wire.HeaderContractVersion, quarantine.Header:
			t.Fatalf("record seq %d keeps header %s: %v", seq, h.Key, r.Headers)
		}
	}
}

// testContractsRedrive: o-2's event violates version 1 and is quarantined,
// its next event parked; o-3's event lacks qty. Version 2 accepts o-2's
// string qty: the redrive of o-2 publishes its dead-lettered event framed
// with version 2's id, then the parked one as it was parked (version 1's
// id), and lifts the quarantine; o-2's next event is published directly,
// under version 2. The redrive of o-3, which version 2 refuses too, fails
// with the reason, and o-3 stays quarantined with nothing published.
func testContractsRedrive(ctx context.Context, t *testing.T, reg *contractsRegistry, delivery string) {
	slot, more := "ctrd_"+strings.TrimSuffix(delivery, "_once"), ""
	if delivery == config.DeliveryExactlyOnce {
		more = fmt.Sprintf("delivery: exactly_once, transaction_interval: 5ms, positions_topic: %s, ", positionsFor(slot))
	}
	dsn, topic, addr, cfgPath := contractsEncodeConfig(t, slot, reg.url, more)
	v1 := reg.register(ctx, t, topic+"-OrderPlaced", orderSchema)
	p := startProcess(t, cfgPath, addr)
	conn := pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 1, "qty": 1}`)
		insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 2, "qty": "two"}`)
		insert(t, tx, "outbox", "order", "o-3", "OrderPlaced", `{"seq": 3}`)
	})
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 4, "qty": 4}`) })
	committedRecords(t, dlqFor(slot), 2)
	committedRecords(t, "parking."+slot+"."+runID, 1)
	committedRecords(t, topic, 1)
	redrive := func(key string) (int, string) {
		return runBinary(t, 3*time.Minute, nil, "redrive", "--config", cfgPath, "--aggregate", key, "--wait", "1m")
	}

	v2 := reg.register(ctx, t, topic+"-OrderPlaced", widerSchema)
	if v2.Version != v1.Version+1 || v2.ID == v1.ID {
		t.Fatalf("version 2 registered as %v after %v", v2, v1)
	}
	if code, out := redrive("o-3"); code != 1 || !strings.Contains(out, "still violates its contract") ||
		!strings.Contains(out, fmt.Sprintf("version %d", v2.Version)) || !strings.Contains(out, "qty") {
		t.Fatalf("redrive of o-3, which version 2 refuses too: exit %d, want 1 naming version %d and qty:\n%s", code, v2.Version, out)
	}
	if code, out := redrive("o-2"); code != 0 || !strings.Contains(out, "quarantine lifted") {
		t.Fatalf("redrive of o-2: exit %d:\n%s", code, out)
	}
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 5, "qty": "five"}`) })
	recs := committedRecords(t, topic, 4)
	time.Sleep(2 * time.Second) // anything extra would have arrived by now
	recs = committedRecords(t, topic, 4)
	var o2 []*kgo.Record
	for _, r := range recs {
		switch string(r.Key) {
		case "o-2":
			o2 = append(o2, r)
		case "o-3":
			t.Fatalf("o-3 published after its refused redrive: %q", r.Value)
		}
	}
	if len(recs) != 4 || len(o2) != 3 {
		t.Fatalf("%d records, %d of o-2; want 4: o-1, and o-2's three", len(recs), len(o2))
	}
	framedAs(t, o2[0], v2.ID, 2) // the dead letter's event, under version 2
	framedAs(t, o2[1], v1.ID, 4) // parked as version 1 framed it
	framedAs(t, o2[2], v2.ID, 5) // after the lift, under version 2
	code, out := runBinary(t, time.Minute, nil, "redrive", "--config", cfgPath, "--list", "--json")
	var ls []quarantine.StateRecord
	if code != 0 || json.Unmarshal([]byte(out), &ls) != nil || len(ls) != 1 || ls[0].Key != "o-3" ||
		ls[0].State != quarantine.StateFailed || ls[0].Topic != topic {
		t.Fatalf("redrive --list: exit %d %+v; want o-3 alone, failed, meant for %s:\n%s", code, ls, topic, out)
	}
	stopClean(t, p)
}

// TestContractsVerify: verify --repair in encode mode republishes rows no
// connector published (none ran) as the stream would: a fitting row framed
// with its subject's id, a violating one dead-lettered with the contract's
// headers (its aggregate quarantined, its next row parked); a second verify
// finds nothing missing.
func TestContractsVerify(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	reg := startContractsRegistry(ctx, t)
	const slot = "ctverify"
	dsn, topic, _, cfgPath := contractsEncodeConfig(t, slot, reg.url, "")
	ref := reg.register(ctx, t, topic+"-OrderPlaced", orderSchema)
	conn := pgConnect(t, dsn)
	var since time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&since); err != nil {
		t.Fatal(err)
	}
	var badID string
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 1, "qty": 1}`)
		badID = insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 2, "qty": "two"}`)
		insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 3, "qty": 3}`)
	})
	sinceArg := since.Add(-time.Second).UTC().Format(time.RFC3339Nano)
	code, v, out := runVerifyJSON(t, 3*time.Minute, "--config", cfgPath, "--since", sinceArg, "--repair")
	if code != 0 || v.Missing.Count != 3 || v.Repair == nil || v.Repair.Published != 1 || v.Repair.DeadLettered != 1 ||
		v.Repair.Parked != 1 || v.Repair.Failed != 0 {
		t.Fatalf("verify --repair: exit %d, %+v (repair %+v); want 0 with 1 published, 1 dead-lettered, 1 parked:\n%s", code, v, v.Repair, out)
	}
	pub := consumeN(t, []string{topic}, 1, time.Minute, time.Second)
	if len(pub) != 1 || string(pub[0].Value) != string(contracts.AppendHeader(nil, ref.ID))+`{"qty": 1, "seq": 1}` {
		t.Fatalf("%d records; want o-1 framed with id %d as the stream frames it: %x", len(pub), ref.ID, pub[0].Value)
	}
	dlq := consumeN(t, []string{dlqFor(slot)}, 1, time.Minute, time.Second)
	checkContractHeaders(t, dlq[0], ref.Subject, fmt.Sprint(ref.Version), "/qty")
	if id, _ := header(dlq[0], wire.HeaderID); id != badID || string(dlq[0].Value) != `{"qty": "two", "seq": 2}` {
		t.Fatalf("dead letter %s %q, want %s with its payload", id, dlq[0].Value, badID)
	}
	parked := consumeN(t, []string{"parking." + slot + "." + runID}, 1, time.Minute, time.Second)
	if got := seqsOfFramed(t, parked); !slices.Equal(got, []int{3}) {
		t.Fatalf("parking holds %v, want o-2's seq 3", got)
	}
	code, out = runBinary(t, 2*time.Minute, nil, "verify", "--config", cfgPath, "--since", sinceArg)
	if code != 0 || !strings.Contains(out, "missing         0\n") {
		t.Fatalf("verify after the repair: exit %d, want 0 with 0 missing:\n%s", code, out)
	}
}

// seqsOfFramed is the seq of each framed record.
func seqsOfFramed(t *testing.T, recs []*kgo.Record) []int {
	t.Helper()
	var out []int
	for _, r := range recs {
		_, body, err := contracts.ParseHeader(r.Value)
		var v struct{ Seq int }
		if err != nil || json.Unmarshal(body, &v) != nil {
			t.Fatalf("record %x is not framed JSON: %v", r.Value, err)
		}
		out = append(out, v.Seq)
	}
	return out
}
