package pipeline

import (
	"context"
	"errors"
	"hash/maphash"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

const (
	topic    = "outbox.event.order"
	dlqTopic = "outbox.dlq"
	outboxID = 16390
	// testTimeout bounds every test; each takes well under a second.
	testTimeout = 10 * time.Second
)

var at = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// outboxRelation is the Relation message of the outbox table; drop leaves
// out a column, so the relation lacks it.
func outboxRelation(drop string) pgwire.Wire {
	var cols []pgwire.Col
	for _, c := range []pgwire.Col{{Name: "id", OID: pgwire.OIDUUID}, {Name: "aggregate_type", OID: pgwire.OIDText},
		{Name: "aggregate_id", OID: pgwire.OIDText}, {Name: "event_type", OID: pgwire.OIDText}, {Name: "payload", OID: pgwire.OIDJSONB}} {
		if c.Name != drop {
			cols = append(cols, c)
		}
	}
	return pgwire.Relation(outboxID, "public", "outbox", cols...)
}

func insert(id string) pgwire.Wire {
	return pgwire.Insert(outboxID, pgwire.Txt(id), pgwire.Txt("order"), pgwire.Txt("o-1"), pgwire.Txt("Created"), pgwire.Txt(`{"n":1}`))
}

// backfilled is a backfill done, whose snapshot saw commits before clearAt,
// that published the rows insert(id) decodes to, for each of ids.
func backfilled(clearAt lsn.LSN, ids ...string) *backfill {
	b := &backfill{gapInfo: gapInfo{Since: 0x80}, done: true, published: map[uint64]struct{}{}, seed: maphash.MakeSeed(), clearAt: clearAt}
	for _, id := range ids {
		b.record(&decode.Event{ID: decode.Value{Bytes: []byte(id)}, AggregateType: decode.Value{Bytes: []byte("order")},
			AggregateID: decode.Value{Bytes: []byte("o-1")}, EventType: decode.Value{Bytes: []byte("Created")}})
	}
	return b
}

// txn is one whole transaction committing at final, ending at final+0x10.
func txn(final uint64, xid uint32, body ...pgwire.Wire) []pgwire.Wire {
	out := append([]pgwire.Wire{pgwire.Begin(final, at, xid)}, body...)
	return append(out, pgwire.Commit(final, final+0x10, at))
}

// harness runs the processor on hand-built pgoutput messages against a real
// sink on kfake: no PostgreSQL, no Kafka server.
type harness struct {
	t     *testing.T
	ctx   context.Context
	c     *kfake.Cluster
	p     *Pipeline
	queue chan *replication.Batch
	done  chan struct{} // closed when the processor returned err
	err   error
}

func newCluster(t *testing.T) *kfake.Cluster {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic, "replay."+topic, dlqTopic))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// newPipeline builds a pipeline on c for pl, without setup.
func newPipeline(t *testing.T, c *kfake.Cluster, pl *plan, tune func(*Config)) *Pipeline {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	cfg := Config{
		Mapping: decode.Mapping{Schema: "public", Table: "outbox", ID: "id", AggregateType: "aggregate_type",
			AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"},
		Routes: router.Config{TopicTemplate: "outbox.event.{aggregate_type}", DLQTopic: dlqTopic},
		Sink: sink.Config{Brokers: c.ListenAddrs(), DLQTopic: dlqTopic,
			TestOpts: []kgo.Opt{kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })}},
	}
	if tune != nil {
		tune(&cfg)
	}
	p, err := New(cfg, metrics.New(), log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s, err := sink.New(p.cfg.Sink, log)
	if err != nil {
		t.Fatalf("sink: %v", err)
	}
	t.Cleanup(s.Close)
	p.plan, p.out, p.tracker = pl, s, offsets.NewTracker(pl.start)
	p.prog.snapDone.Store(true)
	return p
}

// startProcess runs the processor until the test ends or it returns.
func startProcess(t *testing.T, c *kfake.Cluster, pl *plan, tune func(*Config)) *harness {
	t.Helper()
	return runProcess(t, c, newPipeline(t, c, pl, tune))
}

// runProcess runs p's processor until the test ends or it returns.
func runProcess(t *testing.T, c *kfake.Cluster, p *Pipeline) *harness {
	t.Helper()
	ctx := testCtx(t)
	h := &harness{t: t, ctx: ctx, c: c, p: p, queue: make(chan *replication.Batch, 16), done: make(chan struct{})}
	procCtx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(h.done)
		h.err = h.p.process(procCtx, ctx, h.queue)
	}()
	t.Cleanup(func() {
		cancel()
		<-h.done
	})
	return h
}

func (h *harness) send(ms ...replication.Message) {
	h.t.Helper()
	select {
	case h.queue <- replication.NewBatch(ms...):
	case <-h.done:
		h.t.Fatalf("processor ended early: %v", h.err)
	case <-h.ctx.Done():
		h.t.Fatal("processor does not take messages")
	}
}

// data hands ws over in one batch, as the stream does with a read burst.
func (h *harness) data(ws ...pgwire.Wire) {
	h.t.Helper()
	ms := make([]replication.Message, len(ws))
	for i, w := range ws {
		ms[i] = replication.Message{Kind: replication.Data, Data: w}
	}
	h.send(ms...)
}

func (h *harness) keepalive(end lsn.LSN) {
	h.t.Helper()
	h.send(replication.Message{Kind: replication.Keepalive, WALEnd: end})
}

// acked waits until the watermark reaches want.
func (h *harness) acked(want lsn.LSN) {
	h.t.Helper()
	for h.p.tracker.Acked() < want {
		select {
		case <-h.done:
			h.t.Fatalf("processor ended at watermark %v, want %v: %v", h.p.tracker.Acked(), want, h.err)
		case <-h.ctx.Done():
			h.t.Fatalf("watermark %v, want %v", h.p.tracker.Acked(), want)
		case <-time.After(time.Millisecond):
		}
	}
	if got := h.p.tracker.Acked(); got != want {
		h.t.Fatalf("watermark %v, want %v", got, want)
	}
}

// ended waits for the processor's error.
func (h *harness) ended() error {
	h.t.Helper()
	select {
	case <-h.done:
		return h.err
	case <-h.ctx.Done():
		h.t.Fatal("processor did not end")
		return nil
	}
}

// records reads the ids of every record in topic.
func records(ctx context.Context, t *testing.T, c *kfake.Cluster, topic string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	if n == 0 {
		return nil
	}
	cl.AddConsumeTopics(topic)
	var ids []string
	for int64(len(ids)) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(ids), n, topic)
		}
		fs.EachRecord(func(r *kgo.Record) {
			id := ""
			for _, h := range r.Headers {
				if h.Key == "id" {
					id = string(h.Value)
				}
			}
			ids = append(ids, id)
		})
	}
	return ids
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

func TestProcess(t *testing.T) {
	const start = 0x50
	tests := []struct {
		name  string
		plan  plan
		bf    *backfill // the repair this run has
		tune  func(*Config)
		run   func(h *harness)
		topic string
		want  []string // ids in topic
		dlq   []string // ids in the dead-letter topic
		err   func(error) bool
	}{{
		name: "an event is published and acknowledged",
		run: func(h *harness) {
			h.data(txn(0x100, 1, outboxRelation(""), insert("e1"))...)
			h.acked(0x110)
		},
		want: []string{"e1"},
	}, {
		name: "Reset in the middle of a transaction resumes after the last whole one",
		run: func(h *harness) {
			h.data(txn(0x100, 1, outboxRelation(""), insert("e1"))...)
			h.data(pgwire.Begin(0x200, at, 2), insert("e2"))
			reset, resumed := replication.NewReset()
			h.send(reset)
			select {
			case pos := <-resumed:
				if pos != (replication.ResumeAt{Pos: 0x110}) {
					h.t.Errorf("resumed at %v, want 0/110", pos)
				}
			case <-h.ctx.Done():
				h.t.Fatal("no resume")
			}
			h.data(txn(0x200, 2, outboxRelation(""), insert("e2"))...)
			h.acked(0x210)
		},
		// The open transaction's record was handed over before the loss:
		// sent again, it is the one duplicate a reconnect allows.
		want: []string{"e1", "e2", "e2"},
	}, {
		name: "keepalives move the watermark only between transactions",
		run: func(h *harness) {
			h.data(pgwire.Begin(0x100, at, 1), outboxRelation(""), insert("e1"))
			h.keepalive(0x500)
			h.data(pgwire.Commit(0x100, 0x110, at))
			h.acked(0x110)
			h.keepalive(0x600)
			h.acked(0x600)
		},
		want: []string{"e1"},
	}, {
		name: "a transaction below the start was delivered before",
		plan: plan{start: 0x300},
		run: func(h *harness) {
			h.data(txn(0x200, 1, outboxRelation(""), insert("old"))...)
			h.data(txn(0x300, 2, insert("new"))...)
			h.acked(0x310)
		},
		want: []string{"new"},
	}, {
		name: "replay publishes under the prefix and stops at its end",
		plan: plan{stopAt: 0x300, topicPrefix: "replay."},
		run: func(h *harness) {
			h.data(txn(0x100, 1, outboxRelation(""), insert("e1"))...)
			h.acked(0x110)
			h.data(pgwire.Begin(0x300, at, 2))
			if err := h.ended(); !errors.Is(err, errReplayDone) {
				h.t.Fatalf("processor ended with %v, want the end of the replay", err)
			}
		},
		topic: "replay." + topic,
		want:  []string{"e1"},
	}, {
		name: "replay stops at a keepalive past its end",
		plan: plan{stopAt: 0x300},
		run: func(h *harness) {
			h.keepalive(0x300)
			if err := h.ended(); !errors.Is(err, errReplayDone) {
				h.t.Fatalf("processor ended with %v, want the end of the replay", err)
			}
		},
	}, {
		name: "a relation lacking a mapped column after start is a schema problem",
		plan: plan{schemaFrom: []lsn.LSN{0x100}},
		run: func(h *harness) {
			h.data(pgwire.Begin(0x200, at, 1), outboxRelation("event_type"))
			var f *fault.FatalError
			if err := h.ended(); !errors.As(err, &f) || f.Reason != "schema_mismatch" {
				h.t.Fatalf("processor ended with %v, want a schema_mismatch fatal error", err)
			}
		},
	}, {
		name: "rows written while a column was missing, before start, are dead-lettered",
		plan: plan{schemaFrom: []lsn.LSN{0x500}},
		run: func(h *harness) {
			h.data(txn(0x200, 1, outboxRelation("event_type"),
				pgwire.Insert(outboxID, pgwire.Txt("e1"), pgwire.Txt("order"), pgwire.Txt("o-1"), pgwire.Txt("{}")))...)
			h.acked(0x210)
		},
		dlq: []string{"e1"},
	}, {
		name: "an emitted message is an event; heartbeats are not",
		tune: func(c *Config) { c.MessagePrefix = "outbox" },
		run: func(h *harness) {
			h.data(pgwire.Message(false, 0x90, replication.HeartbeatPrefix, nil))
			h.data(txn(0x100, 1, pgwire.Message(true, 0x100, "outbox",
				[]byte(`{"id":"m1","aggregate_type":"order","aggregate_id":"o-1","event_type":"Created","payload":{"n":1}}`)),
				pgwire.Message(true, 0x101, "other", []byte(`{}`)))...)
			h.acked(0x110)
		},
		want: []string{"m1"},
	}, {
		name: "the backfill's rows are not published twice",
		bf:   backfilled(0x300, "backfilled"),
		run: func(h *harness) {
			h.data(txn(0x100, 7, outboxRelation(""), insert("backfilled"))...)
			h.data(txn(0x200, 8, insert("e2"))...)
			h.acked(0x210)
		},
		want: []string{"e2"},
	}, {
		name: "a backfilled transaction's messages and rows not read back are published",
		tune: func(c *Config) { c.MessagePrefix = "outbox" },
		bf:   backfilled(0x300, "backfilled"),
		run: func(h *harness) {
			h.data(txn(0x100, 7, outboxRelation(""), insert("backfilled"), insert("deleted-since"),
				pgwire.Message(true, 0x101, "outbox",
					[]byte(`{"id":"m1","aggregate_type":"order","aggregate_id":"o-1","event_type":"Created","payload":{"n":1}}`)))...)
			h.acked(0x110)
		},
		want: []string{"deleted-since", "m1"},
	}, {
		name: "past the backfill's snapshot nothing is skipped",
		bf:   backfilled(0x200, "backfilled"),
		run: func(h *harness) {
			h.data(txn(0x100, 7, outboxRelation(""), insert("e1"))...)
			h.data(txn(0x200, 8, insert("backfilled"))...)
			h.acked(0x210)
		},
		want: []string{"e1", "backfilled"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t)
			pl := tt.plan
			if pl.start == 0 {
				pl.start = start
			}
			p := newPipeline(t, c, &pl, tt.tune)
			p.rep.bf = tt.bf
			h := runProcess(t, c, p)
			tt.run(h)
			if tt.topic == "" {
				tt.topic = topic
			}
			if got := records(h.ctx, t, c, tt.topic); !equal(got, tt.want) {
				t.Errorf("%s holds %q, want %q", tt.topic, got, tt.want)
			}
			if got := records(h.ctx, t, c, dlqTopic); !equal(got, tt.dlq) {
				t.Errorf("%s holds %q, want %q", dlqTopic, got, tt.dlq)
			}
		})
	}
}

// TestRefusedRecordIsDeadLettered: a record the broker refuses, alone, goes
// to the dead-letter topic and its transaction is acknowledged.
func TestRefusedRecordIsDeadLettered(t *testing.T) {
	c := newCluster(t)
	h := startProcess(t, c, &plan{start: 0x50}, nil)
	dlqID := topicID(h.ctx, t, c, dlqTopic)
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		refused := false
		for _, rt := range req.Topics {
			if rt.Topic == dlqTopic || (rt.Topic == "" && rt.TopicID == dlqID) {
				return nil, nil, false
			}
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.InvalidRecord.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
			refused = true
		}
		return resp, nil, refused
	})
	h.data(txn(0x100, 1, outboxRelation(""), insert("e1"))...)
	h.acked(0x110)
	if got := records(h.ctx, t, c, dlqTopic); !equal(got, []string{"e1"}) {
		t.Fatalf("%s holds %q, want [e1]", dlqTopic, got)
	}
}

// topicID is the id kfake gave topic (produce v13+ addresses topics by id).
func topicID(ctx context.Context, t *testing.T, c *kfake.Cluster, name string) [16]byte {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, name)
	if err != nil || td.Error() != nil {
		t.Fatalf("topic %s: %v %v", name, err, td.Error())
	}
	return td[name].ID
}
