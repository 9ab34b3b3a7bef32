package pipeline

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// eosLike mirrors sink/exactlyonce.Txn for the processor: Produce keeps
// the record in the open PostgreSQL transaction, end commits it (outcome
// ok), abort forgets it with kgo.ErrAborting (Txn.AbortTxn).
type eosLike struct {
	atLeastOnce
	c    *calls
	mu   sync.Mutex
	open []sink.Done
}

func (e *eosLike) Produce(_ context.Context, rec *router.Record, done sink.Done) error {
	for _, h := range rec.Headers {
		if h.Key == "id" {
			e.c.add("produce %s", h.Value)
		}
	}
	e.mu.Lock()
	e.open = append(e.open, done)
	e.mu.Unlock()
	return nil
}
func (*eosLike) Flush(context.Context) error { return nil }
func (e *eosLike) take() []sink.Done {
	e.mu.Lock()
	defer e.mu.Unlock()
	o := e.open
	e.open = nil
	return o
}
func (e *eosLike) end(end lsn.LSN) {
	e.c.add("end %v", end)
	for _, d := range e.take() {
		d.Delivered(sink.Outcome{})
	}
}
func (e *eosLike) abort() {
	e.c.add("abort")
	for _, d := range e.take() {
		d.Delivered(sink.Outcome{Err: kgo.ErrAborting})
	}
}
func (e *eosLike) decoded(pos lsn.LSN) { e.c.add("decoded %v", pos) }
func (e *eosLike) pass(pos lsn.LSN)    { e.c.add("pass %v", pos) }

// deadDB is a DSN nobody listens on: the repair's connect fails at once
// with a transient error (a server restarting).
func deadDB(t *testing.T) *replication.DB {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close()
	db, err := replication.ParseDB(fmt.Sprintf("host=127.0.0.1 port=%d user=u dbname=d sslmode=disable connect_timeout=2", addr.Port), nil)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func repairPipeline(t *testing.T, since lsn.LSN) (*Pipeline, *eosLike, *int) {
	c := &calls{}
	e := &eosLike{c: c}
	p := newProcessor(t, &plan{start: 0x50, stream: replication.Config{StartLSN: 0x50}}, e, e)
	p.cfg.Source.DB = deadDB(t)
	p.rep.bf = newBackfill(gapInfo{Since: since, Xmin: 1})
	drops := new(int)
	p.conn.drop = func() { *drops++ }
	return p, e, drops
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestDropSessionKeepalivePath: the repair alone at a keepalive loses its
// server: the session is dropped, what follows is passed over, nothing past
// the gap is acknowledged, and the Reset resumes at the last commit.
func TestDropSessionKeepalivePath(t *testing.T) {
	p, e, drops := repairPipeline(t, 0x300)
	h := runProcess(t, nil, p)
	h.data(txn(0x100, 7, outboxRelation(""), insert("a"))...)
	h.keepalive(0x400) // past Since: the repair runs, fails, drops
	h.data(txn(0x500, 8, insert("b"))...)
	h.keepalive(0x600)
	reset, resumed := replication.NewReset()
	h.send(reset)
	var at replication.ResumeAt
	select {
	case at = <-resumed:
	case <-h.done:
		t.Fatalf("processor ended: %v", h.err)
	}
	if *drops != 1 {
		t.Fatalf("%d drops", *drops)
	}
	if at.Pos != 0x110 {
		t.Fatalf("resumed at %v, want 0/110", at.Pos)
	}
	if a := p.tracker.Acked(); a != 0x110 {
		t.Fatalf("acked %v", a)
	}
	if got := e.c.get(); slices.Contains(got, "produce b") || slices.Contains(got, "pass 0/400") {
		t.Fatalf("passed-over messages handled: %q", got)
	}
}

// TestDropSessionCommitPathForgetsInFlight: a transaction whose commit
// straddles Since (the repair joins it at commit) had its own event produced
// when the repair loses its server. The Reset aborts it (exactly_once:
// Txn.AbortTxn delivers kgo.ErrAborting), and delivery.Delivered returns on
// the error without tracker.Ack; the abort forgets them (found by review: the
// in-flight count never returned to 0).
func TestDropSessionCommitPathForgetsInFlight(t *testing.T) {
	p, e, drops := repairPipeline(t, 0x305)
	h := runProcess(t, nil, p)
	h.data(txn(0x100, 7, outboxRelation(""), insert("a"))...)
	h.acked(0x110)
	h.data(txn(0x300, 8, insert("b"))...) // ends at 0x310 > Since
	reset, resumed := replication.NewReset()
	h.send(reset)
	select {
	case at := <-resumed:
		if at.Pos != 0x110 {
			t.Fatalf("resumed at %v", at.Pos)
		}
	case <-h.done:
		t.Fatalf("processor ended: %v", h.err)
	}
	waitFor(t, "abort", func() bool { return slices.Contains(e.c.get(), "abort") })
	if *drops != 1 {
		t.Fatalf("%d drops", *drops)
	}
	if n := p.tracker.InFlight(); n != 0 {
		t.Errorf("in flight %d after the abort, with nothing in the producer's hands", n)
	}
}

// TestDropSessionBeginPath: the repair at the Begin of the first transaction
// past Since loses its server; the rest of that transaction is passed over,
// the Reset aborts it, and the same transaction sent again runs the repair
// again (a second drop while the server is still away).
func TestDropSessionBeginPath(t *testing.T) {
	p, e, drops := repairPipeline(t, 0x300)
	h := runProcess(t, nil, p)
	h.data(txn(0x100, 7, outboxRelation(""), insert("a"))...)
	h.acked(0x110)
	h.data(txn(0x400, 8, insert("b"))...)
	h.keepalive(0x500)
	at := h.reconnect()
	if at.Pos != 0x110 || *drops != 1 {
		t.Fatalf("resumed at %v after %d drops", at.Pos, *drops)
	}
	h.data(txn(0x400, 8, outboxRelation(""), insert("b"))...)
	at = h.reconnect()
	if at.Pos != 0x110 || *drops != 2 {
		t.Fatalf("resumed at %v after %d drops", at.Pos, *drops)
	}
	if a := p.tracker.Acked(); a != 0x110 {
		t.Fatalf("acked %v", a)
	}
	if slices.Contains(e.c.get(), "produce b") {
		t.Fatal("b produced before the repair")
	}
}
