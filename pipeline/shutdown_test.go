package pipeline

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/replication"
)

// fakeStream hands the test's messages to the processor, as the stream
// would, until its context ends.
type fakeStream struct {
	in      chan replication.Message
	once    sync.Once
	stopped chan struct{}
}

func newFakeStream() *fakeStream {
	return &fakeStream{in: make(chan replication.Message), stopped: make(chan struct{})}
}

func (f *fakeStream) Run(ctx context.Context, out chan<- *replication.Batch) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-f.in:
			select {
			case out <- replication.NewBatch(m):
			case <-ctx.Done():
				return nil
			}
		}
	}
}

func (f *fakeStream) StopReading() { f.once.Do(func() { close(f.stopped) }) }

// TestShutdownBrokerDown: a stop while the producer's buffer is full and
// the broker does not answer ends within the drain deadline, armed when the
// stop begins, and confirms nothing that was not acknowledged.
func TestShutdownBrokerDown(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t)
	const drain = 300 * time.Millisecond
	p := newPipeline(t, c, &plan{start: 0x50}, func(cfg *Config) {
		cfg.DrainTimeout = drain
		cfg.Sink.MaxBufferedRecords = 1
	})
	// The broker is down for produce requests: the connection is cut each
	// time and the client retries for ever.
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, errors.New("broker down"), true
	})
	fs := newFakeStream()
	r := p.start(ctx, fs)
	for _, w := range txn(0x100, 1, outboxRelation(""), insert("e1"), insert("e2"), insert("e3")) {
		select {
		case fs.in <- replication.Message{Kind: replication.Data, Data: w}:
		case <-ctx.Done():
			t.Fatal("the stream's messages are not taken")
		}
	}
	// The second record waits for room in the full buffer.
	for p.tracker.InFlight() < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("%d records in flight, want the processor blocked on the second", p.tracker.InFlight())
		case <-time.After(time.Millisecond):
		}
	}
	began := time.Now()
	err := p.shutdown(ctx, r, nil)
	took := time.Since(began)
	if err != nil {
		t.Errorf("shutdown: %v, want a clean stop", err)
	}
	if took < drain || took > drain+time.Second {
		t.Errorf("shutdown took %v, want the drain deadline %v and little more", took, drain)
	}
	if got := p.tracker.Acked(); got != 0x50 {
		t.Errorf("watermark %v after the stop, want 0/50: nothing was acknowledged", got)
	}
	select {
	case <-fs.stopped:
	default:
		t.Error("the stream was not told to stop reading")
	}
}

// TestShutdownErrorRule: which error a stop returns.
func TestShutdownErrorRule(t *testing.T) {
	fatal, stream, proc := errors.New("fatal"), errors.New("stream"), errors.New("processor")
	tests := []struct {
		name                      string
		cause, streamErr, procErr error
		want                      error
	}{
		{"clean stop", nil, nil, nil, nil},
		{"end of a replay", errReplayDone, nil, nil, nil},
		{"the first fatal error wins", fatal, stream, proc, fatal},
		{"then the stream's", nil, stream, proc, stream},
		{"then the processor's", nil, nil, proc, proc},
	}
	c := newCluster(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPipeline(t, c, &plan{start: 0x50}, nil)
			closed := make(chan struct{})
			close(closed)
			nop := func() {}
			r := &running{stream: newFakeStream(), stopStream: nop, streamDone: closed, streamErr: tt.streamErr,
				stopProc: nop, procDone: closed, procErr: tt.procErr, stopProduce: nop, stopSides: nop}
			if err := p.shutdown(testCtx(t), r, tt.cause); !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Fatalf("shutdown returned %v, want %v", err, tt.want)
			}
		})
	}
}
