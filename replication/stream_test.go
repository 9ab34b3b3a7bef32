package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// fakeWalsender speaks just enough of the replication protocol for the
// stream: startup, IDENTIFY_SYSTEM and TIMELINE_HISTORY, START_REPLICATION,
// then CopyBoth. Each connection is handed to the test goroutine, which
// decides what the server says.
type fakeWalsender struct {
	ln    net.Listener
	conns chan *walConn
	errs  chan error // server-side failures, reported to the test goroutine
	wg    sync.WaitGroup

	mu       sync.Mutex
	timeline int32   // IDENTIFY_SYSTEM's timeline; 0 means 1
	history  string  // TIMELINE_HISTORY's content for the current timeline
	walEnd   lsn.LSN // IDENTIFY_SYSTEM's xlogpos; 0 means FF/0, past all the tests send
}

// restore makes the server's WAL end at walEnd, as a data directory
// restored from an older copy does.
func (f *fakeWalsender) restore(walEnd lsn.LSN) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.walEnd = walEnd
}

// promote moves the server to timeline tli with the given history file.
func (f *fakeWalsender) promote(tli int32, history string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timeline, f.history = tli, history
}

// command answers a replication command other than START_REPLICATION
// (text format, as pglogrepl reads them); false for START_REPLICATION.
func (f *fakeWalsender) command(be *pgproto3.Backend, q string) bool {
	f.mu.Lock()
	tli, history, walEnd := max(f.timeline, 1), f.history, f.walEnd
	f.mu.Unlock()
	if walEnd == 0 {
		walEnd = 0xFF00000000
	}
	var names, values []string
	switch {
	case q == "IDENTIFY_SYSTEM":
		names = []string{"systemid", "timeline", "xlogpos", "dbname"}
		values = []string{"7300000000000000001", fmt.Sprint(tli), walEnd.String(), "d"}
	case strings.HasPrefix(q, "TIMELINE_HISTORY"):
		names = []string{"filename", "content"}
		values = []string{fmt.Sprintf("%08X.history", tli), history}
	default:
		return false
	}
	rd := &pgproto3.RowDescription{}
	row := &pgproto3.DataRow{}
	for i, n := range names {
		rd.Fields = append(rd.Fields, pgproto3.FieldDescription{Name: []byte(n), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1})
		row.Values = append(row.Values, []byte(values[i]))
	}
	be.Send(rd)
	be.Send(row)
	be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT")})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	return true
}

// walConn is one replication connection as the server sees it.
type walConn struct {
	c       net.Conn
	be      *pgproto3.Backend
	updates chan update // standby status updates, in order
	closed  chan struct{}
	start   string     // the START_REPLICATION command
	mu      sync.Mutex // guards be's send side
}

// update is one standby status update from the client.
type update struct {
	write, flush lsn.LSN
	ping         bool
}

func newFakeWalsender(t testing.TB) *fakeWalsender {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeWalsender{ln: ln, conns: make(chan *walConn, 16), errs: make(chan error, 16)}
	f.wg.Go(f.accept)
	t.Cleanup(func() {
		ln.Close()
		f.wg.Wait()
	})
	return f
}

func (f *fakeWalsender) dsn() string {
	host, port, _ := net.SplitHostPort(f.ln.Addr().String())
	return fmt.Sprintf("host=%s port=%s user=u dbname=d sslmode=disable", host, port)
}

func (f *fakeWalsender) report(err error) {
	select {
	case f.errs <- err:
	default:
	}
}

func (f *fakeWalsender) accept() {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		conns = append(conns, c)
		f.wg.Go(func() { f.serve(c) })
	}
}

func (f *fakeWalsender) serve(c net.Conn) {
	be := pgproto3.NewBackend(c, c)
	sm, err := be.ReceiveStartupMessage()
	if err != nil {
		f.report(fmt.Errorf("startup: %w", err))
		return
	}
	if _, ok := sm.(*pgproto3.CancelRequest); ok {
		return // pgconn cancels a read interrupted by its context on a connection of its own
	}
	be.Send(&pgproto3.AuthenticationOk{})
	be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		f.report(err)
		return
	}
	var q *pgproto3.Query
	for {
		msg, err := be.Receive()
		if err != nil {
			f.report(fmt.Errorf("receive START_REPLICATION: %w", err))
			return
		}
		var ok bool
		if q, ok = msg.(*pgproto3.Query); !ok {
			f.report(fmt.Errorf("got %T, want START_REPLICATION", msg))
			return
		}
		if !f.command(be, q.String) {
			break
		}
		if err := be.Flush(); err != nil {
			f.report(err)
			return
		}
	}
	be.Send(&pgproto3.CopyBothResponse{})
	if err := be.Flush(); err != nil {
		f.report(err)
		return
	}
	w := &walConn{c: c, be: be, updates: make(chan update, 1024), closed: make(chan struct{}), start: q.String}
	f.conns <- w
	defer close(w.closed)
	for {
		msg, err := be.Receive()
		if err != nil {
			return // the client closed the connection (or the test ended)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) != 34 || cd.Data[0] != pglogrepl.StandbyStatusUpdateByteID {
			continue
		}
		u := update{
			write: lsn.LSN(binary.BigEndian.Uint64(cd.Data[1:])),
			flush: lsn.LSN(binary.BigEndian.Uint64(cd.Data[9:])),
			ping:  cd.Data[33] == 1,
		}
		select {
		case w.updates <- u:
		default:
			f.report(errors.New("too many status updates unread"))
		}
	}
}

// send writes one CopyData payload to the client.
func (w *walConn) send(data []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.be.Send(&pgproto3.CopyData{Data: data})
	return w.be.Flush()
}

func (w *walConn) keepalive(end lsn.LSN) error {
	b := []byte{pglogrepl.PrimaryKeepaliveMessageByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(end))
	b = binary.BigEndian.AppendUint64(b, 0)
	return w.send(append(b, 0))
}

func (w *walConn) xlogData(start lsn.LSN, payload []byte) error {
	return w.xlogBurst(start, payload)
}

// xlogBurst sends the payloads at start, start+1, ... in one write, as
// the walsender's messages arrive when they pile up in the socket.
func (w *walConn) xlogBurst(start lsn.LSN, payloads ...[]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, p := range payloads {
		b := []byte{pglogrepl.XLogDataByteID}
		b = binary.BigEndian.AppendUint64(b, uint64(start)+uint64(i))
		b = binary.BigEndian.AppendUint64(b, uint64(start)+uint64(i))
		b = binary.BigEndian.AppendUint64(b, 0)
		w.be.Send(&pgproto3.CopyData{Data: append(b, p...)})
	}
	return w.be.Flush()
}

// fixedPositions is a tracker with nothing in flight.
type fixedPositions struct{ advanced chan struct{} }

func (fixedPositions) Acked() lsn.LSN              { return 0 }
func (fixedPositions) InFlight() int               { return 0 }
func (p fixedPositions) Advanced() <-chan struct{} { return p.advanced }

func newTestStream(f *fakeWalsender, tune func(*Config)) *Stream {
	db, err := ParseDB(f.dsn(), nil)
	if err != nil {
		panic(err) // a constant DSN
	}
	cfg := Config{Source: Source{DB: db, Slot: "s", Publication: "p"}}
	tune(&cfg)
	return NewStream(cfg, fixedPositions{make(chan struct{})}, metrics.New(), slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// runStream runs s until the returned stop is called; stop waits for Run.
func runStream(t *testing.T, ctx context.Context, s *Stream, out chan *Batch) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, out) }()
	return func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of the cancel")
		}
	}
}

// next waits for the next connection, answering the Reset of a lost one.
func next(t *testing.T, ctx context.Context, f *fakeWalsender, out chan *Batch) *walConn {
	t.Helper()
	for {
		select {
		case w := <-f.conns:
			return w
		case b := <-out:
			resumeAt(b, 0)
			b.Release()
		case err := <-f.errs:
			t.Fatalf("fake walsender: %v", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for a replication connection")
		}
	}
}

// resumeAt answers the Resets in b with pos and reports whether it held one.
func resumeAt(b *Batch, pos lsn.LSN) bool {
	reset := false
	for i := range b.Msgs {
		if b.Msgs[i].Kind == Reset {
			b.Msgs[i].Resume(ResumeAt{Pos: pos})
			reset = true
		}
	}
	return reset
}

// TestStreamReceiveTimeout: a server that says nothing is first asked for a
// reply; one that answers keeps its connection however long it is idle, one
// that does not is given up and the stream reconnects.
func TestStreamReceiveTimeout(t *testing.T) {
	const timeout = 150 * time.Millisecond
	tests := []struct {
		name      string
		answer    bool // the server answers each ping with a keepalive
		reconnect bool
	}{
		{"silent server is given up", false, true},
		{"answering server is kept", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f := newFakeWalsender(t)
			s := newTestStream(f, func(c *Config) {
				c.StatusInterval = 50 * time.Millisecond
				c.ReceiveTimeout = timeout
				c.BackoffMax = 100 * time.Millisecond
			})
			out := make(chan *Batch, 16)
			defer runStream(t, ctx, s, out)()

			w := next(t, ctx, f, out)
			pings := 0
			// Watch the first connection for five timeouts, or until it closes.
			watch := time.After(5 * timeout)
		loop:
			for {
				select {
				case u := <-w.updates:
					if !u.ping {
						continue
					}
					pings++
					if tt.answer {
						if err := w.keepalive(100); err != nil {
							t.Fatalf("keepalive: %v", err)
						}
					}
				case <-w.closed:
					break loop
				case <-watch:
					break loop
				case b := <-out:
					resumeAt(b, 0)
					b.Release()
				case err := <-f.errs:
					t.Fatalf("fake walsender: %v", err)
				case <-ctx.Done():
					t.Fatal("test deadline")
				}
			}
			if pings == 0 {
				t.Fatal("no status update asked the server for a reply")
			}
			select {
			case <-w.closed:
				if !tt.reconnect {
					t.Fatalf("the stream dropped a connection whose server answered %d pings", pings)
				}
				next(t, ctx, f, out) // and it reconnects
			default:
				if tt.reconnect {
					t.Fatalf("the stream kept a silent connection for %v", 5*timeout)
				}
				if pings < 5 {
					t.Fatalf("%d pings in %v, want one every %v of silence", pings, 5*timeout, timeout/2)
				}
			}
		})
	}
}

// TestStreamQueueBytes: the stream hands over at most QueueBytes of WAL data
// not yet released, lets a message larger than that through alone, keeps
// sending status updates while it waits, and loses nothing.
func TestStreamQueueBytes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFakeWalsender(t)
	const limit = 1000
	s := newTestStream(f, func(c *Config) {
		c.StatusInterval = 20 * time.Millisecond
		c.QueueBytes = limit
	})
	out := make(chan *Batch, 1024) // the byte budget, not the count, must bind
	defer runStream(t, ctx, s, out)()
	w := next(t, ctx, f, out)

	sizes := []int{300, 300, 300, 300, 300, 5000, 10, 10, 300, 300, 300, 300}
	for i, n := range sizes {
		if err := w.xlogData(lsn.LSN(i+1), make([]byte, n)); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	// waitBlocked returns once the stream has sent a few status updates
	// with nothing read from out: it is waiting in push by then.
	waitBlocked := func() {
		t.Helper()
		for seen := 0; seen < 3; {
			select {
			case <-w.updates:
				seen++
			case err := <-f.errs:
				t.Fatalf("fake walsender: %v", err)
			case <-ctx.Done():
				t.Fatal("no status updates while the queue is full")
			}
		}
	}
	// queued takes what out holds now, without releasing it.
	queued := func() (batches []*Batch, bytes int) {
		for len(out) > 0 {
			b := <-out
			batches = append(batches, b)
			for _, m := range b.Msgs {
				bytes += len(m.Data)
			}
		}
		return batches, bytes
	}

	var got []int
	var held []*Batch
	for len(got) < len(sizes) {
		waitBlocked()
		batches, bytes := queued()
		heldBytes := 0
		for _, b := range held {
			for _, m := range b.Msgs {
				heldBytes += len(m.Data)
			}
		}
		if total := heldBytes + bytes; total > limit && len(held)+len(batches) > 1 {
			t.Fatalf("%d bytes in %d batches handed over and not released, want at most %d or one batch",
				total, len(held)+len(batches), limit)
		}
		if len(batches) == 0 && len(held) == 0 {
			t.Fatalf("stream blocked with nothing handed over (after %d messages)", len(got))
		}
		for _, b := range batches {
			for _, m := range b.Msgs {
				got = append(got, len(m.Data))
			}
		}
		held = append(held, batches...)
		// Release the oldest one, as the processor does after handling it.
		held[0].Release()
		held = held[1:]
	}
	if fmt.Sprint(got) != fmt.Sprint(sizes) {
		t.Fatalf("message sizes %v, want %v", got, sizes)
	}
	for _, b := range held {
		b.Release()
	}
	if used := s.buf.used.Load(); used != 0 {
		t.Fatalf("%d bytes still taken after every message was released", used)
	}
}

// TestStreamBatches: messages go to the receiver in batches cut after a
// Commit (or a message outside a transaction) once nothing more has
// arrived; an incomplete transaction waits at most holdMax for the rest, and
// a long one streams in batches of at most a quarter of the queue.
func TestStreamBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFakeWalsender(t)
	const queue = 64 // batches of at most 16 messages
	s := newTestStream(f, func(c *Config) {
		c.StatusInterval = time.Minute // no read deadline would end a wait
		c.ReceiveTimeout = 2 * time.Minute
		c.QueueMessages = queue
	})
	out := make(chan *Batch, queue)
	defer runStream(t, ctx, s, out)()
	w := next(t, ctx, f, out)

	// recv returns the next batch as its messages' first bytes.
	recv := func() string {
		t.Helper()
		select {
		case b := <-out:
			var kinds []byte
			for _, m := range b.Msgs {
				if m.Kind != Data || len(m.Data) == 0 {
					t.Fatalf("unexpected message %+v", m)
				}
				kinds = append(kinds, m.Data[0])
			}
			b.Release()
			return string(kinds)
		case err := <-f.errs:
			t.Fatalf("fake walsender: %v", err)
		case <-ctx.Done():
			t.Fatal("no batch handed over")
		}
		return ""
	}
	msgs := func(kinds string) [][]byte {
		var ps [][]byte
		for _, k := range kinds {
			ps = append(ps, []byte{byte(k), 0, 0})
		}
		return ps
	}
	send := func(kinds string) {
		t.Helper()
		if err := w.xlogBurst(0x100, msgs(kinds)...); err != nil {
			t.Fatalf("send: %v", err)
		}
	}

	steps := []struct {
		send, want string
	}{
		{"BICBIIC", "BICBIIC"}, // two whole transactions that arrived together: one batch
		{"BI", "BI"},           // an incomplete transaction goes after holdMax,
		{"IC", "IC"},           // the rest when it comes
		{"M", "M"},             // a message outside a transaction is complete by itself
	}
	for _, st := range steps {
		send(st.send)
		if got := recv(); got != st.want {
			t.Fatalf("sent %q: batch %q, want %q", st.send, got, st.want)
		}
	}
	// A long transaction streams in batches of a quarter of the queue.
	long := "B" + strings.Repeat("I", 40) + "C"
	send(long)
	var got string
	for len(got) < len(long) {
		b := recv()
		if len(b) > queue/4 {
			t.Fatalf("batch of %d messages, want at most %d", len(b), queue/4)
		}
		got += b
	}
	if got != long {
		t.Fatalf("messages %q, want %q in order", got, long)
	}
	if used, n := s.buf.used.Load(), s.buf.msgs.Load(); used != 0 || n != 0 {
		t.Fatalf("%d bytes in %d messages still taken after every batch was released", used, n)
	}
}

// TestBudgetMessages: the count binds as the bytes do, and a batch larger
// than the whole count goes alone.
func TestBudgetMessages(t *testing.T) {
	b := newBudget(1<<20, 4)
	if !b.take(10, 3) || b.take(10, 2) {
		t.Fatal("3 + 2 messages fit in a budget of 4")
	}
	b.release(10, 3)
	if !b.take(10, 4) || b.take(0, 1) {
		t.Fatal("want 4 messages to fit an empty budget of 4, and no fifth")
	}
	b.release(10, 4)
	if !b.take(10, 9) {
		t.Fatal("a batch larger than the budget must go when nothing is taken")
	}
}

func TestBudget(t *testing.T) {
	tests := []struct {
		name  string
		limit int64
		ops   []int64 // positive: take, negative: release
		want  []bool  // result of each take
	}{
		{"fits until full", 100, []int64{40, 40, 40}, []bool{true, true, false}},
		{"exactly full", 100, []int64{60, 40, 1}, []bool{true, true, false}},
		{"larger than the budget goes alone", 100, []int64{500, 1, -500, 1}, []bool{true, false, true}},
		{"larger than the budget waits for an empty queue", 100, []int64{10, 500, -10, 500}, []bool{true, false, true}},
		{"release makes room", 100, []int64{80, 30, -80, 30}, []bool{true, false, true}},
		{"empty message always fits", 100, []int64{100, 0}, []bool{true, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBudget(tt.limit, 1<<20)
			var got []bool
			for _, op := range tt.ops {
				if op < 0 {
					b.release(-op, 1)
					select {
					case <-b.freed:
					default:
						t.Fatal("release did not signal")
					}
					continue
				}
				got = append(got, b.take(op, 1))
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("takes %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStreamLeavesLagToTheMonitor: the stream records what it received, but
// replication lag has one writer, the slot monitor (SlotInfo.LagBytes): a
// second writer with its own reading made the gauge jump between the two.
func TestStreamLeavesLagToTheMonitor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFakeWalsender(t)
	s := newTestStream(f, func(c *Config) { c.StatusInterval = 50 * time.Millisecond })
	out := make(chan *Batch, 16)
	defer runStream(t, ctx, s, out)()

	w := next(t, ctx, f, out)
	const end = lsn.LSN(0x5000) // acked stays 0 (fixedPositions)
	if err := w.keepalive(end); err != nil {
		t.Fatalf("keepalive: %v", err)
	}
	for testutil.ToFloat64(s.m.ReceivedLSN) != float64(end) {
		select {
		case b := <-out:
			b.Release()
		case err := <-f.errs:
			t.Fatalf("fake walsender: %v", err)
		case <-ctx.Done():
			t.Fatalf("received_lsn = %v, want %v", testutil.ToFloat64(s.m.ReceivedLSN), float64(end))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if lag := testutil.ToFloat64(s.m.LagBytes); lag != 0 {
		t.Fatalf("the stream wrote replication_lag_bytes = %v; only the slot monitor writes it", lag)
	}
}

// TestStreamStopReadingEndsRead: StopReading ends a read blocked on an idle
// connection at once (the socket's deadline moves to now), so WAL sent after
// it is not handed over, while status updates go on.
func TestStreamStopReadingEndsRead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFakeWalsender(t)
	s := newTestStream(f, func(c *Config) {
		// Nothing else would wake the read for a minute.
		c.StatusInterval = time.Minute
		c.ReceiveTimeout = 2 * time.Minute
	})
	out := make(chan *Batch, 16)
	defer runStream(t, ctx, s, out)()
	w := next(t, ctx, f, out)
	if err := w.xlogData(10, []byte("B")); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-out:
		b.Release()
	case <-ctx.Done():
		t.Fatal("first message not handed over")
	}
	time.Sleep(50 * time.Millisecond) // the stream is back in a read
	s.StopReading()
	time.Sleep(50 * time.Millisecond)
	if err := w.xlogData(20, []byte("C")); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-out:
		t.Fatalf("message at %v handed over after StopReading", b.Msgs[0].WALStart)
	case err := <-f.errs:
		t.Fatalf("fake walsender: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestWALCopy: Begin and Commit share a slab, capped so that appending to
// one cannot overwrite the next; every other message is a copy of its own.
func TestWALCopy(t *testing.T) {
	var c walCopy
	src := [][]byte{
		append([]byte{'B'}, make([]byte, 20)...),
		append([]byte{'I'}, make([]byte, 10)...),
		append([]byte{'C'}, make([]byte, 25)...),
		append([]byte{'B'}, make([]byte, 40)...), // too long for a Begin: not shared
		{},
	}
	var got [][]byte
	for _, b := range src {
		got = append(got, c.copy(b))
	}
	for i, b := range src {
		if string(got[i]) != string(b) {
			t.Errorf("copy %d = %q, want %q", i, got[i], b)
		}
		if len(b) > 0 && &got[i][0] == &b[0] {
			t.Errorf("copy %d shares the read buffer", i)
		}
		if shared := i == 0 || i == 2; shared && cap(got[i]) != len(got[i]) {
			t.Errorf("copy %d: cap %d, len %d", i, cap(got[i]), len(got[i]))
		}
	}
	if &got[0][0] != &c.slab[0] || &got[2][0] != &c.slab[len(got[0])] {
		t.Error("Begin and Commit are not in one slab")
	}
	_ = append(got[0], 'x')
	if got[2][0] != 'C' {
		t.Error("an append to the Begin overwrote the Commit")
	}
	src[0][1] = 9
	if got[0][1] != 0 {
		t.Error("the copy changed with its source")
	}
}
