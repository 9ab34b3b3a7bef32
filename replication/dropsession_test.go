package replication

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestDropSessionWhileBlockedInPush: the queue is full (the processor is in
// the repair and reads nothing); Drop ends the session (the server sees the
// connection close), the batches queued before stay in order, then comes a
// Reset, and the next session starts where the Resume says.
func TestDropSessionWhileBlockedInPush(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFakeWalsender(t)
	s := newTestStream(f, func(c *Config) {
		c.StatusInterval = 20 * time.Millisecond
		c.QueueMessages = 4
		c.BackoffMax = 50 * time.Millisecond
	})
	s.Drop() // before Run: no session, nothing happens
	out := make(chan *Batch, 1)
	defer runStream(t, ctx, s, out)()
	w := next(t, ctx, f, out)
	for i := range 20 {
		if err := w.xlogData(lsn.LSN(0x100+i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until the stream blocks in push (status updates while full).
	for seen := 0; seen < 3; {
		select {
		case <-w.updates:
			seen++
		case <-ctx.Done():
			t.Fatal("no status updates while the queue is full")
		}
	}
	s.Drop()
	select {
	case <-w.closed:
	case <-ctx.Done():
		t.Fatal("Drop did not end the session")
	}
	// The last status update of the dropped session confirms Acked (0).
	var last update
	for len(w.updates) > 0 {
		last = <-w.updates
	}
	if last.flush != 0 {
		t.Fatalf("final flush %v", last.flush)
	}
	var data int
	for {
		var b *Batch
		select {
		case b = <-out:
		case <-ctx.Done():
			t.Fatal("no Reset after Drop")
		}
		if resumeAt(b, 0x4242) {
			b.Release()
			break
		}
		data += len(b.Msgs)
		b.Release()
	}
	t.Logf("%d data messages before the Reset", data)
	var w2 *walConn
	select {
	case w2 = <-f.conns:
	case <-ctx.Done():
		t.Fatal("no reconnect")
	}
	if !strings.Contains(w2.start, "0/4242") {
		t.Fatalf("second session %q, want it at the Resume", w2.start)
	}
	s.Drop() // again: the second session ends too
	select {
	case <-w2.closed:
	case <-ctx.Done():
		t.Fatal("second Drop did not end the session")
	}
	_ = next(t, ctx, f, out)
}
