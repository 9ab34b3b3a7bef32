package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/decode"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// calls is what the processor told its producer and its boundary, in order.
type calls struct {
	mu  sync.Mutex
	log []string
}

func (c *calls) add(format string, args ...any) {
	c.mu.Lock()
	c.log = append(c.log, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func (c *calls) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// recordingProducer acknowledges each record at once and notes its id.
type recordingProducer struct{ c *calls }

func (r recordingProducer) Produce(_ context.Context, rec *router.Record, done sink.Done) error {
	id := ""
	for _, h := range rec.Headers {
		if h.Key == "id" {
			id = string(h.Value)
		}
	}
	r.c.add("produce %s", id)
	done.Delivered(sink.Outcome{})
	return nil
}
func (recordingProducer) Flush(context.Context) error { return nil }

// recordingBoundary is an exactly_once boundary that notes each call.
type recordingBoundary struct {
	atLeastOnce
	c *calls
}

func (b recordingBoundary) note(xid uint32, final lsn.LSN) { b.c.add("note %d %v", xid, final) }
func (b recordingBoundary) end(end lsn.LSN)                { b.c.add("end %v", end) }
func (b recordingBoundary) abort()                         { b.c.add("abort") }
func (b recordingBoundary) decoded(pos lsn.LSN)            { b.c.add("decoded %v", pos) }
func (b recordingBoundary) pass(pos lsn.LSN)               { b.c.add("pass %v", pos) }

// newProcessor builds a pipeline whose processor produces to out and tells
// b, with no server and no broker.
func newProcessor(t *testing.T, pl *plan, out producer, b boundary) *Pipeline {
	t.Helper()
	cfg := Config{
		Mapping: decode.Mapping{Schema: "public", Table: "outbox", ID: "id", AggregateType: "aggregate_type",
			AggregateID: "aggregate_id", EventType: "event_type", Payload: "payload"},
		Routes: router.Config{TopicTemplate: "outbox.event.{aggregate_type}", DLQTopic: dlqTopic},
	}
	p, err := New(cfg, metrics.New(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	p.plan, p.out, p.b, p.tracker = pl, out, b, offsets.NewTracker(pl.start)
	p.history = newHistory(nil)
	return p
}

// TestProcessorTellsTheBoundary: what the boundary hears, and when,
// relative to the records: a transaction's records, then its outbox xid,
// its end and the frontier; a keepalive between transactions moves the
// frontier and passes; a reconnect inside a transaction aborts it; a
// transaction below the start is noted (the hold needs it) but not
// produced.
func TestProcessorTellsTheBoundary(t *testing.T) {
	c := &calls{}
	p := newProcessor(t, &plan{start: 0x200}, recordingProducer{c}, recordingBoundary{c: c})
	h := runProcess(t, nil, p)
	h.data(txn(0x100, 7, outboxRelation(""), insert("below"))...)
	h.data(txn(0x300, 8, insert("e1"), insert("e2"))...)
	h.keepalive(0x400)
	h.data(pgwire.Begin(0x500, at, 9), insert("cut"))
	reset, _ := replication.NewReset()
	h.send(reset)
	h.acked(0x400)
	want := []string{
		"note 7 0/100", "end 0/110", "decoded 0/110",
		"produce e1", "produce e2", "note 8 0/300", "end 0/310", "decoded 0/310",
		"decoded 0/400", "pass 0/400",
		"produce cut", "abort",
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(c.get(), want) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := c.get(); !slices.Equal(got, want) {
		t.Fatalf("calls:\n got %q\nwant %q", got, want)
	}
}
