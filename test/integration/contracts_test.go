package integration

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// Event contracts (contracts.*) against a real Apicurio Registry, started
// once by TestContracts for its subtests: every event is checked against
// the JSON Schema registered under <topic>-<event_type>.

// orderSchema is every subject's contract: seq and qty, both integers.
const orderSchema = `{"type": "object",
  "properties": {"seq": {"type": "integer"}, "qty": {"type": "integer"}},
  "required": ["seq", "qty"]}`

func TestContracts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	reg, err := testenv.StartRegistry(ctx)
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	admin, err := contracts.New(contracts.Config{Registry: contracts.RegistryConfig{URL: reg.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	register := func(t *testing.T, subject string) contracts.SchemaRef {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		ref, err := admin.Registry().Register(rctx, subject, orderSchema)
		if err != nil {
			t.Fatalf("register %s: %v", subject, err)
		}
		return ref
	}
	for _, delivery := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run("Quarantine/"+delivery, func(t *testing.T) { testContractsQuarantine(t, reg.URL(), delivery, register) })
	}
	t.Run("EncodeDLQ", func(t *testing.T) { testContractsEncode(t, reg.URL(), register) })
	t.Run("RegistryDown", func(t *testing.T) { testContractsRegistryDown(t, reg.URL(), register) })
	t.Run("Fail", func(t *testing.T) { testContractsFail(t, reg.URL(), register) })
}

// contractsConfig is a connector on a database of its own with contracts
// on (validate, quarantine) against url.
func contractsConfig(t *testing.T, slot, url string) (*config.Config, string) {
	t.Helper()
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", slot)
	cfg.Contracts.Registry.URL = url
	cfg.Kafka.ParkingTopic = "parking." + slot + "." + runID
	cfg.Kafka.QuarantineTopic = "quarantine." + slot + "." + runID
	return cfg, dsn
}

// committedRecords waits until read_committed sees at least n records on
// topic and returns them (control records left out).
func committedRecords(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	var out []*kgo.Record
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d records on %s", n, topic), func() bool {
		out = out[:0]
		for _, r := range readIsolated(t, true, topic) {
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		}
		return len(out) >= n
	})
	return out
}

// testContractsQuarantine: good events are published unchanged (validate);
// a violating one is dead-lettered with the contract's headers and its
// aggregate's later event is parked, not published; an unknown type is
// dead-lettered too.
func testContractsQuarantine(t *testing.T, url, delivery string, register func(*testing.T, string) contracts.SchemaRef) {
	slot := "ctq_" + strings.TrimSuffix(delivery, "_once")
	cfg, dsn := contractsConfig(t, slot, url)
	topic := topicFor(slot)
	cfg.Kafka.Topics = map[string]string{"order": topic}
	if delivery == config.DeliveryExactlyOnce {
		cfg.Kafka.Delivery, cfg.Kafka.PositionsTopic = delivery, positionsFor(slot)
		cfg.Kafka.TransactionInterval = 5 * time.Millisecond
	}
	ref := register(t, topic+"-OrderPlaced")
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	var badID string
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 1, "qty": 1}`)
		badID = insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 2, "qty": "two"}`)
		insert(t, tx, "outbox", "order", "o-3", "OrderLost", `{"seq": 3, "qty": 3}`)
	})
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 4, "qty": 4}`) // parked behind seq 2
		insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 5, "qty": 5}`)
	})
	committedRecords(t, cfg.Kafka.DLQTopic, 2)
	committedRecords(t, cfg.Kafka.ParkingTopic, 1)
	committedRecords(t, topic, 2)
	time.Sleep(2 * time.Second) // anything extra would have arrived by now
	dlq, parked, pub := committedRecords(t, cfg.Kafka.DLQTopic, 2), committedRecords(t, cfg.Kafka.ParkingTopic, 1), committedRecords(t, topic, 2)
	slices.SortFunc(dlq, func(a, b *kgo.Record) int { return seqOf(t, a) - seqOf(t, b) })
	if got := seqsByKey(t, pub); len(got) != 1 || !slices.Equal(got["o-1"], []int{1, 5}) {
		t.Fatalf("topic holds %v, want o-1 [1 5] only", got)
	}
	if string(pub[0].Value) != `{"qty": 1, "seq": 1}` { // jsonb's text, unchanged by validate
		t.Fatalf("validated value %q changed", pub[0].Value)
	}
	if got := seqsByKey(t, parked); len(got) != 1 || !slices.Equal(got["o-2"], []int{4}) {
		t.Fatalf("parking holds %v, want o-2 [4]", got)
	}
	if len(dlq) != 2 || seqOf(t, dlq[0]) != 2 || seqOf(t, dlq[1]) != 3 {
		t.Fatalf("%d dead letters, want seq 2 then 3", len(dlq))
	}
	checkContractHeaders(t, dlq[0], ref.Subject, fmt.Sprint(ref.Version), "/qty")
	if id, _ := header(dlq[0], wire.HeaderID); id != badID {
		t.Fatalf("dead letter id %s, want %s", id, badID)
	}
	checkContractHeaders(t, dlq[1], topic+"-OrderLost", "", "no subject registered")
	waitFor(t, 10*time.Second, "the connector logged the violation", func() bool { return c.logged("event dead-lettered", "/qty") })
}

// checkContractHeaders: error first, with the reason, then the topic the
// event was meant for, the subject and the version ("" for none).
func checkContractHeaders(t *testing.T, r *kgo.Record, subject, version, reason string) {
	t.Helper()
	if len(r.Headers) < 3 || r.Headers[0].Key != wire.HeaderError || !strings.Contains(string(r.Headers[0].Value), reason) ||
		r.Headers[1].Key != wire.HeaderTopic || !strings.HasPrefix(subject, string(r.Headers[1].Value)+"-") ||
		r.Headers[2].Key != wire.HeaderContractSubject || string(r.Headers[2].Value) != subject {
		t.Fatalf("dead letter headers %v; want error with %q, then topic, then contract_subject %s", r.Headers, reason, subject)
	}
	if v, ok := header(r, wire.HeaderContractVersion); v != version || ok != (version != "") {
		t.Fatalf("contract_version %q (present %v), want %q", v, ok, version)
	}
}

// testContractsEncode: encode frames good events with the subject's id;
// on_violation dlq dead-letters only the violating event (dlq.mode skip),
// so the aggregate's next event is published; unknown_type pass publishes
// an unknown type as it is.
func testContractsEncode(t *testing.T, url string, register func(*testing.T, string) contracts.SchemaRef) {
	cfg, dsn := contractsConfig(t, "ctenc", url)
	topic := topicFor("ctenc")
	cfg.Kafka.Topics = map[string]string{"order": topic}
	cfg.DLQ.Mode, cfg.Kafka.ParkingTopic, cfg.Kafka.QuarantineTopic = config.DLQSkip, "", ""
	cfg.Contracts.Mode, cfg.Contracts.OnViolation, cfg.Contracts.UnknownType = "encode", config.ContractsDLQ, config.ContractsPass
	ref := register(t, topic+"-OrderPlaced")
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 1, "qty": 1}`)
		insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 2, "qty": "two"}`)
		insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 3, "qty": 3}`)
		insert(t, tx, "outbox", "order", "o-3", "OrderLost", `{"seq": 4}`)
	})
	pub := consumeN(t, []string{topic}, 3, time.Minute, 2*time.Second)
	slices.SortFunc(pub, func(a, b *kgo.Record) int { return strings.Compare(string(a.Key), string(b.Key)) })
	dlq := consumeN(t, []string{cfg.Kafka.DLQTopic}, 1, time.Minute, 0)
	if len(pub) != 3 || len(dlq) != 1 {
		t.Fatalf("%d published, %d dead letters; want 3 and 1", len(pub), len(dlq))
	}
	for i, want := range []string{`{"qty": 1, "seq": 1}`, `{"qty": 3, "seq": 3}`} { // keys o-1, o-2
		id, body, err := contracts.ParseHeader(pub[i].Value)
		if err != nil || pub[i].Value[0] != 0 || id != ref.ID || string(body) != want {
			t.Fatalf("record %d: %x: id %d body %q (%v); want 0x00, id %d, %s", i, pub[i].Value, id, body, err, ref.ID, want)
		}
		if string(pub[i].Key) != fmt.Sprintf("o-%d", i+1) {
			t.Fatalf("record %d key %q: the key must stay the aggregate_id", i, pub[i].Key)
		}
	}
	if string(pub[2].Value) != `{"seq": 4}` {
		t.Fatalf("unknown type with pass: %q, want the payload unframed", pub[2].Value)
	}
	if seqOf(t, dlq[0]) != 2 {
		t.Fatalf("dead letter seq %d, want 2", seqOf(t, dlq[0]))
	}
	checkContractHeaders(t, dlq[0], ref.Subject, fmt.Sprint(ref.Version), "/qty")
}

// flakyProxy forwards to the registry while up; while down it closes every
// connection at once, as a registry that went away. It keeps the port, so
// the registry "comes back" where the connector looks for it.
type flakyProxy struct {
	down atomic.Bool
	url  string
}

func startFlakyProxy(t *testing.T, target string) *flakyProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &flakyProxy{}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.down.Load() {
			rp.ServeHTTP(w, r)
			return
		}
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	p.url = "http://" + ln.Addr().String() + u.Path
	return p
}

// testContractsRegistryDown runs the binary against the registry through
// a proxy. With the registry gone, a type resolved before keeps flowing;
// an event of a type never resolved waits: not published, the slot not
// confirmed past it, /readyz 503, outbox_cdc_contracts_waiting 1, its
// subject logged. Its schema is registered meanwhile; once the registry is
// back the event is delivered and the wait ends.
func testContractsRegistryDown(t *testing.T, regURL string, register func(*testing.T, string) contracts.SchemaRef) {
	const slot = "ctdown"
	proxy := startFlakyProxy(t, regURL)
	dsn, topic, addr, cfgPath := contractsProcess(t, slot, proxy.url, "")
	known, later := topic+"-OrderPlaced", topic+"-OrderShipped"
	register(t, known)
	p := startProcess(t, cfgPath, addr)
	conn := pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 1, "qty": 1}`) })
	consumeN(t, []string{topic}, 1, time.Minute, 0)

	proxy.down.Store(true)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 2, "qty": 2}`) })
	consumeN(t, []string{topic}, 2, time.Minute, 0) // known: from the cache
	before := currentLSN(t, conn)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "o-2", "OrderShipped", `{"seq": 3, "qty": 3}`) })
	p.waitMetric(t, time.Minute, "outbox_cdc_contracts_waiting", 1)
	if code, body := httpGet(t, addr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, later) {
		t.Fatalf("/readyz while waiting: %d %q; want 503 naming %s", code, body, later)
	}
	waitFor(t, 10*time.Second, "a log line naming the subject", func() bool {
		return strings.Contains(p.output(), "waits for the schema registry") && strings.Contains(p.output(), later)
	})
	time.Sleep(2 * time.Second) // status updates go out every 200ms: none may pass the event
	if recs := consumeN(t, []string{topic}, 2, time.Minute, time.Second); len(recs) != 2 {
		t.Fatalf("%d records while the event waits, want 2", len(recs))
	}
	if c := slotConfirmed(t, dsn, slot); c > before {
		t.Fatalf("slot confirmed %v, past %v before the waiting event", c, before)
	}
	if n := strings.Count(p.output(), "waits for the schema registry"); n != 1 {
		t.Fatalf("the wait was logged %d times, want once", n)
	}

	register(t, later)
	proxy.down.Store(false)
	recs := consumeN(t, []string{topic}, 3, time.Minute, time.Second)
	if got := seqsByKey(t, recs); !slices.Equal(got["o-2"], []int{3}) || !slices.Equal(got["o-1"], []int{1, 2}) {
		t.Fatalf("after the registry came back: %v", got)
	}
	waitFor(t, 30*time.Second, "the wait over", func() bool {
		v, err := metricValue(addr, "outbox_cdc_contracts_waiting")
		code, _ := httpGet(t, addr, "/readyz")
		return err == nil && v == 0 && code == http.StatusOK
	})
	waitFor(t, 30*time.Second, "the slot confirmed past the event", func() bool { return slotConfirmed(t, dsn, slot) > before })
	stopClean(t, p)
}

// contractsProcess is a database, topic, HTTP address and configuration
// file for the binary with contracts against url; more is more contracts
// keys (YAML flow mapping members).
func contractsProcess(t *testing.T, slot, url, more string) (dsn, topic, addr, cfgPath string) {
	t.Helper()
	dsn = newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	topic, addr = topicFor(slot), freeAddr(t)
	cfgPath = writeConfig(t, fmt.Sprintf(`postgres: {dsn: %q, slot: %s, publication: %s, status_interval: 200ms}
kafka: {brokers: [%s], dlq_topic: %s, topic: %q, topics: {order: %s}, parking_topic: parking.%s.%s, quarantine_topic: quarantine.%s.%s}
http: {listen: %q}
contracts: {registry: {url: %q}%s}
`, dsn, slot, slot, strings.Join(kafkaServer.Brokers(), ", "), dlqFor(slot), topicTemplate, topic, slot, runID, slot, runID, addr, url, more))
	return dsn, topic, addr, cfgPath
}

// testContractsFail: on_violation fail stops the binary (exit 1) at the
// violating event with a message naming the subject, the version and the
// reason; the event before it is published, nothing from it on, and the
// slot is not confirmed past it.
func testContractsFail(t *testing.T, url string, register func(*testing.T, string) contracts.SchemaRef) {
	const slot = "ctfail"
	dsn, topic, addr, cfgPath := contractsProcess(t, slot, url, ", on_violation: fail")
	ref := register(t, topicFor(slot)+"-OrderPlaced")
	p := startProcess(t, cfgPath, addr)
	conn := pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "o-1", "OrderPlaced", `{"seq": 1, "qty": 1}`) })
	consumeN(t, []string{topic}, 1, time.Minute, 0)
	waitFor(t, 10*time.Second, "the first event confirmed", func() bool { return slotConfirmed(t, dsn, slot) > 0 })
	var xid string
	committed(t, conn, func(tx pgx.Tx) {
		insert(t, tx, "outbox", "order", "o-2", "OrderPlaced", `{"seq": 2, "qty": "two"}`)
		insert(t, tx, "outbox", "order", "o-3", "OrderPlaced", `{"seq": 3, "qty": 3}`)
		if err := tx.QueryRow(context.Background(), "SELECT txid_current()::text").Scan(&xid); err != nil {
			t.Fatal(err)
		}
	})
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatal("the connector did not stop at the violation")
	}
	out := p.output()
	if code := p.proc.ExitCode(); code != 1 || !strings.Contains(out, "contracts.on_violation is fail") ||
		// the log line quotes the error: its quotes are escaped
		!strings.Contains(out, fmt.Sprintf(`subject \"%s\" version %d`, ref.Subject, ref.Version)) || !strings.Contains(out, "/qty") {
		t.Fatalf("exit %d; want 1 and a message naming the subject, version %d and /qty:\n%s", code, ref.Version, out)
	}
	if recs := consumeN(t, []string{topic, dlqFor(slot)}, 1, time.Minute, 2*time.Second); len(recs) != 1 || seqOf(t, recs[0]) != 1 {
		t.Fatalf("%d records after the stop, want only seq 1", len(recs))
	}
	// The slot still holds the violating transaction: PostgreSQL decodes it
	// again (a confirmed position is compared with its commit, and the
	// connector's own history marks may commit in between, so a WAL position
	// read before it bounds nothing).
	var left int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1::name, NULL, NULL,
		'proto_version', '1', 'publication_names', $1::text) WHERE xid::text = $2`, slot, xid).Scan(&left); err != nil {
		t.Fatalf("peek the slot: %v", err)
	}
	if left == 0 {
		t.Fatalf("slot confirmed %v: past the violating transaction %s (the slot no longer holds it)", slotConfirmed(t, dsn, slot), xid)
	}
}

// httpGet returns the status and body of GET path on addr.
func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		b.WriteString(sc.Text())
	}
	return resp.StatusCode, b.String()
}
