package pipeline

// Adversarial review reproductions (history marks). Each test states the
// behaviour the guarantee needs; a failure is the finding.

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/pgwire"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// startProcessWithHistory is startProcess with a marks-enabled history
// whose start proof is pr (what begin sets from decideStart).
func startProcessWithHistory(t *testing.T, pl *plan, tune func(*Config), pr proof) *harness {
	t.Helper()
	c := newCluster(t)
	p := newPipeline(t, c, pl, tune)
	p.history = newHistory(&replication.Marks{})
	p.history.start(pr, proof{})
	return runProcess(t, c, p)
}

func (h *harness) reconnect() replication.ResumeAt {
	h.t.Helper()
	reset, resumed := replication.NewReset()
	h.send(reset)
	select {
	case at := <-resumed:
		return at
	case <-h.done:
		h.t.Fatalf("processor ended: %v", h.err)
	case <-h.ctx.Done():
		h.t.Fatal("no resume")
	}
	return replication.ResumeAt{}
}

// TestReviewMessageOnlyTxnReconnect: a transaction whose only events are
// table-less outbox messages (outbox.message_prefix) is published, but
// history.committed is told published = w.rows && !w.skip, and w.rows is set
// by rows only: the transaction never joins the tail. A plain reconnect (a
// network blip, no restore) resumes at the proof, below it; decoded again it
// is "unknown", and message() returns diverged: exit 1 with
// fatal_errors_total{reason="server_rewound"} on an unrestored server.
func TestReviewMessageOnlyTxnReconnect(t *testing.T) {
	const start = 0x50
	msg := []byte(`{"id":"m1","aggregate_type":"order","aggregate_id":"o-1","event_type":"Created","payload":{"n":1}}`)
	h := startProcessWithHistory(t, &plan{start: start}, func(c *Config) { c.MessagePrefix = "outbox" }, proof{mark: 7, at: start})
	h.data(txn(0x100, 1, pgwire.Message(true, 0x100, "outbox", msg))...)
	h.acked(0x110)
	if at := h.reconnect(); at != (replication.ResumeAt{Pos: start, Mark: 7}) {
		t.Fatalf("resumed at %+v, want the proof", at)
	}
	// The same server sends the same transaction again.
	h.data(txn(0x100, 1, pgwire.Message(true, 0x100, "outbox", msg))...)
	h.data(txn(0x200, 2, pgwire.Message(true, 0x200, "outbox",
		[]byte(`{"id":"m2","aggregate_type":"order","aggregate_id":"o-1","event_type":"Created","payload":{"n":2}}`)))...)
	select {
	case <-h.done:
		t.Fatalf("a reconnect to the same, unrestored server stopped the processor: %v", h.err)
	case <-time.After(500 * time.Millisecond):
	}
	h.acked(0x210)
	if got := records(h.ctx, t, h.c, topic); !equal(got, []string{"m1", "m2"}) {
		t.Errorf("%s holds %q, want [m1 m2]", topic, got)
	}
}

// TestReviewTailOrderAfterForgotten: once the tail's bound dropped its oldest
// half, a reconnect re-publishes those (forgotten) and committed() appends
// them at the END of the tail, behind higher commit LSNs: the tail is no
// longer sorted, the binary searches in redecoded and committed miss, and a
// later overflow takes forgot from the unsorted middle, so forgot moves
// BACKWARD. A transaction published before the reconnect is then
// "unknown" (a false diverged fatal if it has rows) and others below the new
// forgot are published a second time.
func TestReviewTailOrderAfterForgotten(t *testing.T) {
	h := newHistory(&replication.Marks{})
	h.tailCap = 4
	h.start(proof{mark: 1, at: 0x100}, proof{})
	at := time.Unix(1_700_000_000, 0)
	id := func(i int) txnID {
		end := lsn.LSN(0x110 + 0x10*i)
		return txnID{final: end - 8, xid: uint32(100 + i), commit: at.Add(time.Duration(i) * time.Microsecond)}
	}
	end := func(i int) lsn.LSN { return lsn.LSN(0x110 + 0x10*i) }
	for i := range 5 { // T0..T4 published; the bound drops T0, T1
		h.committed(id(i), end(i), true)
	}
	h.resume(end(4))
	// The processor decodes T0..T4 again, in order, as begin/commit do.
	got := map[int]again{}
	for i := range 5 {
		a := h.redecoded(id(i))
		got[i] = a
		h.committed(id(i), end(i), a != published) // published again unless skipped
	}
	for i, want := range []again{forgotten, forgotten, published, published, published} { // forgotten: the processor stops
		if got[i] != want {
			t.Errorf("T%d decoded again: %v, want %v (the tail: %v, forgot %v)", i, got[i], want, h.tail, h.forgot)
		}
	}
}

// TestReviewProofFrozenDuringCatchUp: at start the proof is {mark, skip}
// (decideStart keeps proof.at = skip even when the fresh mark is used). Every
// mark the mark loop writes lands at the WAL insert position, ahead of what
// the processor decodes, so while the run catches up a backlog no mark is
// decoded: the proof, hence the slot's confirmed position (proven) and the
// checkpoint (checkpointer.save), stay at the start for the whole catch-up, and
// the tail holds every published transaction of it (forgetting past tailMax).
// The docs say they trail "by up to ~0.5 s under load".
func TestReviewProofFrozenDuringCatchUp(t *testing.T) {
	r := startReadings{slot: 0x1000, fresh: markReading{id: 9, at: 0x9000_0000, found: true}}
	st, err := decideStart(r)
	if err != nil {
		t.Fatal(err)
	}
	h := newHistory(&replication.Marks{})
	h.tailCap = 1 << 10
	h.start(st.proof, proof{mark: r.fresh.id, at: r.fresh.at})
	at := time.Unix(1_700_000_000, 0)
	// A backlog of 4096 published transactions, all below the fresh mark's
	// commit (and below every mark the loop wrote meanwhile).
	pos := lsn.LSN(0x1000)
	for i := range 4096 {
		pos += 0x100
		h.committed(txnID{final: pos - 8, xid: uint32(i), commit: at.Add(time.Duration(i))}, pos, true)
	}
	acked := pos
	capped := proven{Positions: fixedAcked(acked), h: h}.Acked()
	if capped < acked/2 {
		t.Errorf("after catching up to %v (all below the fresh mark written at 0x9000_0000, which proves them), the slot "+
			"may be confirmed only to %v; the tail forgot up to %v", acked, capped, h.forgot)
	}
}

type fixedAcked lsn.LSN

func (f fixedAcked) Acked() lsn.LSN { return lsn.LSN(f) }

func (fixedAcked) InFlight() int             { return 0 }
func (fixedAcked) Advanced() <-chan struct{} { return nil }

// TestReviewFlushBoundedWhileMarkLoopStuck: a clean stop stops the side
// loops, the mark loop among them, then writes its last mark with a 2 s
// bound. With PostgreSQL unreachable (a partition, a black-holed
// connection), neither the loop's write nor the last mark may hold SIGTERM
// until the TCP stack gives up (minutes): the orchestrator's SIGKILL would
// skip the drain and the last checkpoint.
func TestReviewFlushBoundedWhileMarkLoopStuck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	go func() { // accepts, never answers
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	db, err := replication.ParseDB("postgres://u@"+ln.Addr().String()+"/db?sslmode=disable", nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHistory(replication.NewMarks(replication.Source{DB: db, Slot: "s"}, "outbox_cdc.history_marks"))
	h.start(proof{mark: 1, at: 0x100}, proof{})
	sides, stopSides := context.WithCancel(context.Background())
	defer stopSides()
	var n atomic.Int64
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		h.markLoop(sides, func() lsn.LSN { return 0x200 }, func() int64 { return n.Add(1) }, func(error) {})
	}()
	time.Sleep(700 * time.Millisecond) // the loop's first write is under way
	stopSides()                        // the shutdown stops the side loops first
	select {
	case <-loopDone:
	case <-time.After(markWriteTimeout + 3*time.Second):
		t.Fatalf("the mark loop has not ended %v after its stop: its write is not bounded", markWriteTimeout+3*time.Second)
	}
	returned := make(chan bool, 1)
	go func() { returned <- h.finalMark(context.Background(), markFlushTimeout) }()
	select {
	case ok := <-returned:
		if ok {
			t.Fatal("finalMark reports a mark decoded on a server that never answered")
		}
	case <-time.After(markFlushTimeout + 3*time.Second):
		t.Fatalf("finalMark (bound %v) has not returned after %v: the shutdown waits for a server that does not answer",
			markFlushTimeout, markFlushTimeout+3*time.Second)
	}
}

// TestReviewStaleKafkaPositionBelowCheckpoint: a position committed to Kafka
// below the checkpoint decides nothing (decideSaved ignores it: committed <=
// skip), yet its missing mark is checked first and refuses the start "for
// good". A Kafka position left by an exactly_once period months ago (then
// at_least_once, then exactly_once again) has a mark the 7-day pruning
// deleted long since: the switch back is refused with a restore's message.
func TestReviewStaleKafkaPositionBelowCheckpoint(t *testing.T) {
	_, err := decideStart(startReadings{slot: 0x9000, ckpt: 0x9000, ckptMark: markReading{id: 3, at: 0x9000, found: true},
		committed: 0x1000, committedMark: markReading{id: 1, at: 0x1000, found: false},
		fresh: markReading{id: 4, at: 0xA000, found: true}})
	if err != nil {
		t.Errorf("a Kafka position below the proven checkpoint, which decides nothing, refuses the start: %v", err)
	}
}
