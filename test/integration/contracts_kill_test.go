package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/linkedin/goavro/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/contracts"
	"github.com/outbox-cdc/outbox-cdc/internal/testenv"
	"github.com/outbox-cdc/outbox-cdc/pipeline"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Event contracts under failure: the connector killed with SIGKILL in
// exactly_once (TestContractsKill), the registry killed while events flow
// (TestContractsRegistryKilled, behind registryProxy).

const avroKillSchema = `{"type": "record", "name": "OrderPlaced", "namespace": "it.kill",
  "fields": [{"name": "seq", "type": "long"}, {"name": "qty", "type": "int"}]}`

// startTestRegistry starts an Apicurio of the test's own, stopped at its end.
func startTestRegistry(ctx context.Context, t *testing.T) *testenv.Registry {
	t.Helper()
	reg, err := testenv.StartRegistry(ctx)
	if err != nil {
		t.Fatalf("start registry: %v", err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	return reg
}

// registerSchema registers text of format under subject at url.
func registerSchema(ctx context.Context, t *testing.T, url string, format contracts.Format, subject, text string) contracts.SchemaRef {
	t.Helper()
	admin, err := contracts.New(contracts.Config{Registry: contracts.RegistryConfig{URL: url}, Format: format})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ref, err := admin.Registry().Register(ctx, subject, text)
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ref
}

// contractsWriter commits, until stop is closed (at least min, at most
// max), transactions of one OrderPlaced event per aggregate of aggs,
// seq the transaction's number and qty seq%100+1; the event of aggregate a
// in transaction bad[a] has qty "many", which no schema here accepts.
type contractsWriter struct {
	written atomic.Int64 // transactions committed
	done    chan struct{}
	last    int   // the last transaction committed, set before done is closed
	err     error // likewise
}

func startContractsWriter(ctx context.Context, dsn string, aggs []string, bad map[string]int, min, max int, stop <-chan struct{}) *contractsWriter {
	w := &contractsWriter{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			w.err = err
			return
		}
		defer conn.Close(context.Background())
		for txn := 1; txn <= max; txn++ {
			if txn > min {
				select {
				case <-stop:
					return
				default:
				}
			}
			b := &pgx.Batch{}
			for _, a := range aggs {
				payload := fmt.Sprintf(`{"seq": %d, "qty": %d}`, txn, txn%100+1)
				if bad[a] == txn {
					payload = fmt.Sprintf(`{"seq": %d, "qty": "many"}`, txn)
				}
				b.Queue(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'OrderPlaced', $2)`, a, payload)
			}
			tx, err := conn.Begin(ctx)
			if err == nil {
				err = tx.SendBatch(ctx, b).Close()
			}
			if err == nil {
				err = tx.Commit(ctx)
			}
			if err != nil {
				w.err = fmt.Errorf("transaction %d: %w", txn, err)
				return
			}
			w.last = txn
			w.written.Add(1)
			time.Sleep(5 * time.Millisecond) // pacing: a steady stream over the kills
		}
	}()
	return w
}

// failed fails the test if the writer stopped with an error.
func (w *contractsWriter) failed(t *testing.T) {
	t.Helper()
	select {
	case <-w.done:
		if w.err != nil {
			t.Fatalf("writer: %v", w.err)
		}
	default:
	}
}

// stopAndWait closes stop and returns the last transaction committed.
func (w *contractsWriter) stopAndWait(ctx context.Context, t *testing.T, stop chan struct{}) int {
	t.Helper()
	close(stop)
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatal("the writer did not stop")
	}
	w.failed(t)
	return w.last
}

// avroFrames decodes framed Avro records with goavro and returns their seq
// by key, in offset order. Every frame must name id, every qty be
// seq%100+1, and every (topic, key, seq) have the bytes it has in values,
// where a first copy is added.
func avroFrames(codec *goavro.Codec, id int, recs []*kgo.Record, values map[string][]byte) (map[string][]int, error) {
	seqs := map[string][]int{}
	for _, r := range recs {
		got, body, err := contracts.ParseHeader(r.Value)
		if err != nil || got != id {
			return nil, fmt.Errorf("%s %s@%d: frame %.16x: id %d (%v), want %d", r.Topic, r.Key, r.Offset, r.Value, got, err, id)
		}
		native, rest, err := codec.NativeFromBinary(body)
		m, _ := native.(map[string]any)
		seq, _ := m["seq"].(int64)
		qty, _ := m["qty"].(int32)
		if err != nil || len(rest) != 0 || qty != int32(seq%100+1) {
			return nil, fmt.Errorf("%s %s@%d: goavro decoded %v (%v, %d bytes left), want seq and qty seq%%100+1", r.Topic, r.Key, r.Offset, native, err, len(rest))
		}
		k := fmt.Sprintf("%s/%s/%d", r.Topic, r.Key, seq)
		if v, ok := values[k]; ok && !bytes.Equal(v, r.Value) {
			return nil, fmt.Errorf("%s@%d framed %x, another copy %x", k, r.Offset, r.Value, v)
		}
		values[k] = r.Value
		seqs[string(r.Key)] = append(seqs[string(r.Key)], int(seq))
	}
	return seqs, nil
}

// TestContractsKill: contracts in encode mode (Avro), kafka.delivery
// exactly_once, on_violation quarantine. A writer commits transactions of
// one event for each of 8 aggregates, 3 of which get one violating event
// at spaced moments; the binary is killed (SIGKILL) 3 times during the
// load and restarted. read_committed then sees every valid event once, in
// order per aggregate, framed with the subject's id and decoded by goavro;
// each violating event once in the DLQ with its contract's headers; each
// later event of its aggregate once on the parking topic, not on the event
// topic. Every copy of an event read_uncommitted shows (the aborted
// attempts' too) has the committed copy's bytes.
func TestContractsKill(t *testing.T) {
	const slot, minTxns = "ctkill", 500
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	reg := startTestRegistry(ctx, t)
	dsn, topic, addr, cfgPath := contractsProcess(t, slot, reg.URL(), ", format: avro, mode: encode")
	base, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	yaml := strings.Replace(string(base), "kafka: {", fmt.Sprintf(
		"kafka: {delivery: exactly_once, transaction_interval: 5ms, topic_partitions: 3, positions_topic: %s, ", positionsFor(slot)), 1)
	cfgPath = writeConfig(t, yaml)
	parking := "parking." + slot + "." + runID
	ref := registerSchema(ctx, t, reg.URL(), contracts.FormatAvro, topic+"-OrderPlaced", avroKillSchema)
	p := startProcess(t, cfgPath, addr)

	good := []string{"g0", "g1", "g2", "g3", "g4"}
	bad := map[string]int{"b0": minTxns / 8, "b1": 3 * minTxns / 8, "b2": 5 * minTxns / 8}
	aggs := append(slices.Clone(good), "b0", "b1", "b2")
	stop := make(chan struct{})
	w := startContractsWriter(ctx, dsn, aggs, bad, minTxns, 10*minTxns, stop)
	for k := 1; k <= 3; k++ {
		at := int64(k * minTxns / 4)
		waitFor(t, 2*time.Minute, fmt.Sprintf("%d transactions written before kill %d", at, k), func() bool {
			w.failed(t)
			return w.written.Load() >= at
		})
		// Killed after it committed some: the next one starts from there.
		p.waitMetric(t, 2*time.Minute, "outbox_cdc_events_published_total", 40)
		p.kill()
		p = startProcess(t, cfgPath, addr)
	}
	n := w.stopAndWait(ctx, t, stop)

	wantTopic, wantParked := len(good)*n, 0
	for _, at := range bad {
		wantTopic += at - 1
		wantParked += n - at
	}
	waitCommitted(t, topic, wantTopic, 3*time.Minute)
	waitCommitted(t, dlqFor(slot), len(bad), time.Minute)
	waitCommitted(t, parking, wantParked, time.Minute)
	schema, err := schemaText(ctx, reg.URL(), ref.ID, "AVRO")
	if err != nil {
		t.Fatal(err)
	}
	codec, err := goavro.NewCodec(schema)
	if err != nil {
		t.Fatalf("goavro: schema %d: %v", ref.ID, err)
	}
	onTopicRecs, parkedRecs := readIsolated(t, true, topic), readIsolated(t, true, parking)
	values := map[string][]byte{}
	onTopic, err := avroFrames(codec, ref.ID, onTopicRecs, values)
	if err != nil {
		t.Fatalf("read_committed %s: %v", topic, err)
	}
	parked, err := avroFrames(codec, ref.ID, parkedRecs, values)
	if err != nil {
		t.Fatalf("read_committed %s: %v", parking, err)
	}
	dlqRecs := readIsolated(t, true, dlqFor(slot))
	dlq := seqsByKey(t, dlqRecs)

	var problems []string
	check := func(where, key string, got, want []int) {
		if d := seqDiff(got, want); d != "" {
			problems = append(problems, fmt.Sprintf("%s %s: %s", where, key, d))
		}
	}
	for _, a := range aggs {
		if at, isBad := bad[a]; isBad {
			check("topic", a, onTopic[a], seqRange(1, at-1))
			check("DLQ", a, dlq[a], []int{at})
			check("parking", a, parked[a], seqRange(at+1, n))
		} else {
			check("topic", a, onTopic[a], seqRange(1, n))
			check("DLQ", a, dlq[a], nil)
			check("parking", a, parked[a], nil)
		}
	}
	if len(onTopic) != len(aggs) || len(dlq) != len(bad) || len(parked) != len(bad) {
		problems = append(problems, fmt.Sprintf("keys: %d on the topic, %d in the DLQ, %d parked; want %d, %d and %d",
			len(onTopic), len(dlq), len(parked), len(aggs), len(bad), len(bad)))
	}
	if len(problems) > 0 {
		t.Fatalf("%d transactions of %d events over 3 kills; read_committed:\n%s", n, len(aggs), strings.Join(problems, "\n"))
	}
	for _, r := range dlqRecs {
		checkContractHeaders(t, r, ref.Subject, fmt.Sprint(ref.Version), "/qty")
	}
	for _, r := range parkedRecs {
		if q, _ := header(r, quarantine.Header); q == "" {
			t.Fatalf("parked %s@%d has no quarantine header", r.Key, r.Offset)
		}
	}

	// Every attempt, aborted or committed, framed the same event the same.
	distinct := len(values)
	all := readIsolated(t, false, topic, parking)
	if _, err := avroFrames(codec, ref.ID, all, values); err != nil || len(values) != distinct {
		t.Fatalf("read_uncommitted: %v; %d events, %d committed", err, len(values), distinct)
	}
	t.Logf("%d transactions (%d events, %d violating) over 3 kills: read_committed %d on the topic, %d parked, %d dead letters, "+
		"all framed with id %d; read_uncommitted %d records, each with its committed copy's bytes",
		n, n*len(aggs), len(bad), len(onTopicRecs), len(parkedRecs), len(dlqRecs), ref.ID, len(all))
	stopClean(t, p)
}

// registryProxy is the registry's address as the connector knows it: a
// TCP proxy whose kill closes its listener and cuts every connection, so
// the connector sees what a registry process killed mid-request looks
// like (connections reset, then refused), and whose restart listens on the
// same port again, in front of the same Apicurio and its schemas (a new
// Apicurio would have lost them: it keeps them in memory).
type registryProxy struct {
	target, addr, url string

	mu    sync.Mutex
	ln    net.Listener // nil while killed
	conns map[net.Conn]bool
	cut   int // connections cut by kills
}

func startRegistryProxy(t *testing.T, regURL string) *registryProxy {
	t.Helper()
	u, err := url.Parse(regURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &registryProxy{target: u.Host, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	p.url = "http://" + p.addr + u.Path
	p.serve(ln)
	t.Cleanup(p.kill)
	return p
}

func (p *registryProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // killed
			}
			go p.pipe(c)
		}
	}()
}

// pipe copies both ways until either side closes or a kill cuts both.
func (p *registryProxy) pipe(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	alive := p.ln != nil
	if alive {
		p.conns[c], p.conns[up] = true, true
	}
	p.mu.Unlock()
	if alive {
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
		<-done
	}
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// kill refuses new connections and cuts the open ones.
func (p *registryProxy) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		p.cut++
	}
	clear(p.conns)
}

// restart listens on the proxy's port again.
func (p *registryProxy) restart() error {
	var err error
	for range 50 {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serve(ln)
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the port is briefly someone else's
	}
	return err
}

// topicEnd is the sum of topic's end offsets: its record count when no
// transaction ever wrote to it.
func topicEnd(t *testing.T, adm *kadm.Client, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			n += o.Offset
		}
	})
	return n
}

// TestContractsRegistryKilled: contracts on (JSON Schema, validate) with
// the registry behind registryProxy, and a writer committing events of a
// type resolved before. The registry is killed while they flow: they keep
// flowing from the cache, though the connector asks the registry again
// every 300ms (contracts.RegistryConfig.Refresh, 1m in the binary, here
// short so that refreshes fail during the outage) and each ask fails. An
// event of a type never resolved then waits: nothing after it is
// published and the slot is not confirmed past it, while the writer goes
// on. Once the registry is back, everything is delivered: every event
// once, in order per aggregate, nothing skipped.
func TestContractsRegistryKilled(t *testing.T) {
	const slot = "ctkilled"
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	reg := startTestRegistry(ctx, t)
	proxy := startRegistryProxy(t, reg.URL())
	cfg, dsn := contractsConfig(t, slot, proxy.url)
	topic := topicFor(slot)
	cfg.Kafka.Topics = map[string]string{"order": topic}
	cached, uncached := topic+"-OrderPlaced", topic+"-OrderShipped"
	registerSchema(ctx, t, reg.URL(), contracts.FormatJSONSchema, cached, orderSchema)
	refreshing, err := contracts.New(contracts.Config{Registry: contracts.RegistryConfig{URL: proxy.url,
		Refresh: 300 * time.Millisecond, Timeout: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	c := startConnector(t, cfg, func(pc *pipeline.Config) { pc.Contracts.Apply = refreshing })
	unreachable := c.m.Contracts.RegistryErrors.WithLabelValues("unreachable")
	adm := newAdmin(t)
	conn := pgConnect(t, dsn)

	aggs := []string{"c-0", "c-1", "c-2", "c-3"}
	stop := make(chan struct{})
	w := startContractsWriter(ctx, dsn, aggs, nil, 100, 100_000, stop)
	waitFor(t, time.Minute, "200 events published before the kill", func() bool {
		w.failed(t)
		return topicEnd(t, adm, topic) >= 200
	})
	errsBefore := testutil.ToFloat64(unreachable)
	proxy.kill()
	killedAt, n0 := time.Now(), topicEnd(t, adm, topic)
	waitFor(t, time.Minute, "400 more events of the cached type, over 2s and failed refreshes", func() bool {
		w.failed(t)
		return topicEnd(t, adm, topic) >= n0+400 && time.Since(killedAt) > 2*time.Second && testutil.ToFloat64(unreachable) >= errsBefore+3
	})

	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "order", "s-1", "OrderShipped", `{"seq": 1, "qty": 1}`) })
	after := currentLSN(t, conn)
	waitFor(t, time.Minute, "the uncached type waiting", func() bool { return c.p.ContractsWaiting() == uncached })
	time.Sleep(time.Second) // what was handed to the producer before the wait lands
	n1, w1 := topicEnd(t, adm, topic), w.written.Load()
	time.Sleep(2 * time.Second) // the writer commits meanwhile: none of it may be published
	if n2, w2 := topicEnd(t, adm, topic), w.written.Load(); n2 != n1 || w2 <= w1 {
		t.Fatalf("while the uncached type waits: %d then %d records on the topic, %d then %d transactions written; want the records still and the writer on", n1, n2, w1, w2)
	}
	if conf := slotConfirmed(t, dsn, slot); conf >= after {
		t.Fatalf("slot confirmed %v, past %v after the waiting event", conf, after)
	}
	errsDown := testutil.ToFloat64(unreachable) - errsBefore

	registerSchema(ctx, t, reg.URL(), contracts.FormatJSONSchema, uncached, orderSchema)
	if err := proxy.restart(); err != nil {
		t.Fatalf("restart the proxy: %v", err)
	}
	waitFor(t, time.Minute, "the wait over", func() bool { return c.p.ContractsWaiting() == "" })
	n := w.stopAndWait(ctx, t, stop)

	recs := consumeN(t, []string{topic, cfg.Kafka.DLQTopic, cfg.Kafka.ParkingTopic}, n*len(aggs)+1, 2*time.Minute, 2*time.Second)
	got := seqsByKey(t, recs)
	for _, a := range aggs {
		if d := seqDiff(got[a], seqRange(1, n)); d != "" {
			t.Errorf("%s: %s", a, d)
		}
	}
	if len(recs) != n*len(aggs)+1 || !slices.Equal(got["s-1"], []int{1}) {
		t.Fatalf("%d records (s-1 %v), want %d: each event once", len(recs), got["s-1"], n*len(aggs)+1)
	}
	proxy.mu.Lock()
	cut := proxy.cut
	proxy.mu.Unlock()
	t.Logf("registry killed after %d records: %d more of the cached type flowed, %d refreshes failed, %d connections cut; "+
		"the uncached event waited with %d on the topic; after the restart all %d events once, in order",
		n0, n1-n0, int(errsDown), cut, n1, len(recs))
}
