package replication

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// BenchmarkStreamReceive is the stream's cost per WAL message: read, copy
// and hand to the queue, with the receiver releasing each message. The
// server writes pre-encoded XLogData in bursts of 63, as a walsender does
// under load, so the allocations counted are the client's.
func BenchmarkStreamReceive(b *testing.B) {
	b.Run("queue=1024", func(b *testing.B) { benchStreamReceive(b, 1024) })
	// The receiver is never waiting ahead: every message waits in push, as
	// in a drain where Kafka is the slower stage.
	b.Run("queue=0", func(b *testing.B) { benchStreamReceive(b, 0) })
}

func benchStreamReceive(b *testing.B, queue int) {
	const burst = 63 // 21 transactions
	f := newFakeWalsender(b)
	s := newTestStream(f, func(*Config) {})
	out := make(chan *Batch, queue)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, out) }()
	var w *walConn
	select {
	case w = <-f.conns:
	case <-ctx.Done():
		b.Fatal("no replication connection")
	}
	// One burst of CopyData('w') messages: one-row transactions, pgoutput's
	// Begin (21 bytes), Insert (here 60) and Commit (26).
	var wire []byte
	for i := range burst {
		payload := [][]byte{make([]byte, 21), make([]byte, 60), make([]byte, 26)}[i%3]
		payload[0] = "BIC"[i%3]
		msg := []byte{pglogrepl.XLogDataByteID}
		msg = binary.BigEndian.AppendUint64(msg, uint64(i+1))
		msg = binary.BigEndian.AppendUint64(msg, uint64(i+1))
		msg = binary.BigEndian.AppendUint64(msg, 0)
		msg = append(msg, payload...)
		wire = append(wire, 'd')
		wire = binary.BigEndian.AppendUint32(wire, uint32(4+len(msg)))
		wire = append(wire, msg...)
	}
	writeErr := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		for sent := 0; sent < b.N; sent += burst {
			if _, err := w.c.Write(wire); err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- nil
	}()
	for got := 0; got < b.N; {
		select {
		case bt := <-out:
			for _, m := range bt.Msgs {
				if m.Kind == Data {
					got++
				}
			}
			bt.Release()
		case err := <-f.errs:
			b.Fatalf("fake walsender: %v", err)
		case <-ctx.Done():
			b.Fatalf("received %d of %d messages", got, b.N)
		}
	}
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Errorf("Run: %v", err)
	}
	// The writer may be blocked on a burst nobody reads any more: its error
	// after the close says nothing.
	w.c.Close()
	<-writeErr
}
