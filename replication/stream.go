// Package replication owns the PostgreSQL side of outbox-cdc: prerequisite
// checks, publication and slot setup, and the logical replication stream. It
// is the only package that imports pglogrepl's streaming API.
package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/pgopt"
)

// Positions is what the stream needs to know of delivery: the acknowledged
// watermark it confirms, and whether anything is still in flight.
type Positions interface {
	Acked() lsn.LSN
	InFlight() int
	Advanced() <-chan struct{}
}

// Config tunes the stream.
type Config struct {
	Source
	// StatusInterval is the longest time between standby status updates.
	StatusInterval time.Duration
	// ConfirmDelay is how soon a moved watermark is confirmed; it batches
	// confirmations under load.
	ConfirmDelay time.Duration
	// BackoffMax caps the reconnect backoff.
	BackoffMax time.Duration
	// QueueBytes bounds the WAL data handed to out and not yet released
	// (Batch.Release), whatever the row sizes; default 64 MiB.
	QueueBytes int64
	// QueueMessages bounds the messages handed to out and not yet released;
	// default 1024.
	QueueMessages int
	// ReceiveTimeout ends a connection on which nothing arrived for this long
	// while reading (a half-open TCP connection); half-way through, a status
	// update asks the server for a reply. Default 60s.
	ReceiveTimeout time.Duration
	// StartLSN is where streaming starts; PostgreSQL skips transactions
	// whose commit record lies before it (zero: the slot's confirmed
	// position). Reconnects start after the last dispatched transaction.
	StartLSN lsn.LSN
	// Messages asks pgoutput for logical decoding messages too (PG 14+).
	Messages bool
	// MarksTable is the quoted history marks table (marks.go), "" when the
	// server decodes no marks (PostgreSQL 13): a reconnect then checks the
	// WAL end only. Marks ask pgoutput for messages too.
	MarksTable string
	// FirstMark is the mark the run wrote before it streams: the first
	// session checks it, so what the run decodes below it is proven by it.
	FirstMark uint64
	// Standby: the server is a hot standby, whose WAL end at a reconnect may
	// be below what it sent before (sameServer).
	Standby bool
	// CopyOf, when set, streams from a temporary copy of that slot made on
	// each connection (replay): Slot names the copy. The copy starts at the
	// original's confirmed position and vanishes with the connection, so a
	// connection loss is fatal.
	CopyOf string
}

// Stream reads the slot and confirms the acknowledged watermark.
type Stream struct {
	cfg Config
	pos Positions
	log *slog.Logger
	m   *metrics.Metrics
	buf *budget
	// batchMsgs and batchBytes: a batch this large goes even inside a
	// transaction; a quarter of the budget at most, so that batches share it.
	batchMsgs  int
	batchBytes int64

	stopOnce sync.Once
	stopRead chan struct{}
	readCtx  context.Context
	cancel   context.CancelFunc

	// OnConnected, when set before Run, learns when streaming starts and stops.
	OnConnected func(bool)
	// OnTimeline, when set before Run, learns the server's timeline at each
	// session that streams: positions confirmed from then on belong to it.
	OnTimeline func(int32)

	timeline int32  // the server's timeline at the first session (Run's goroutine only)
	systemID string // the cluster streamed (Run's goroutine only)

	dropMu sync.Mutex
	drop   context.CancelFunc // ends the current session (Drop); nil between sessions
}

// errDropped ends a session that Drop ended: the stream connects again.
var errDropped = errors.New("the session was dropped: the gap repair lost its server")

// Drop ends the current session, if any; the stream then connects again
// and resumes where the processor says (Reset). The gap repair calls it
// when it loses its server while the stream waits for it: a shutdown
// waits for the walsender, which exits only once it has sent all WAL and
// the client confirmed it (PostgreSQL src/backend/replication/walsender.c,
// WalSndDone), and a session whose queue waits for the repair does neither.
func (s *Stream) Drop() {
	s.dropMu.Lock()
	defer s.dropMu.Unlock()
	if s.drop != nil {
		s.drop()
	}
}

func (s *Stream) setDrop(f context.CancelFunc) {
	s.dropMu.Lock()
	s.drop = f
	s.dropMu.Unlock()
}

// NewStream prepares a stream; Run starts it.
func NewStream(cfg Config, pos Positions, m *metrics.Metrics, log *slog.Logger) *Stream {
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = pgopt.DefaultStatusInterval
	}
	if cfg.ConfirmDelay <= 0 {
		cfg.ConfirmDelay = 5 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = pgopt.DefaultBackoffMax
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = pgopt.DefaultQueueBytes
	}
	if cfg.QueueMessages <= 0 {
		cfg.QueueMessages = pgopt.DefaultQueueMessages
	}
	if cfg.ReceiveTimeout <= 0 {
		cfg.ReceiveTimeout = pgopt.DefaultReceiveTimeout
	}
	rc, cancel := context.WithCancel(context.Background())
	return &Stream{cfg: cfg, pos: pos, log: log, m: m, buf: newBudget(cfg.QueueBytes, int64(cfg.QueueMessages)),
		batchMsgs: max(1, min(batchMessages, cfg.QueueMessages/4)), batchBytes: min(batchBytes, cfg.QueueBytes/4), stopRead: make(chan struct{}), readCtx: rc, cancel: cancel}
}

// errSilent reports a connection on which the server stopped answering; it
// is retried like any other loss.
var errSilent = errors.New("nothing received from the server")

// holdMax is how long an incomplete transaction's messages wait for the
// rest before they are handed over anyway.
const holdMax = time.Millisecond

// burstEnd is a read deadline already passed: a read then returns only
// messages the connection has buffered, without a system call.
var burstEnd = time.Unix(1, 0)

// closeTimeout bounds the Terminate sent when a session ends: a dead peer
// must not hold the reconnect.
const closeTimeout = 5 * time.Second

// StopReading stops taking new WAL; the stream keeps confirming the
// watermark as in-flight events are acknowledged, until Run's context ends.
func (s *Stream) StopReading() {
	s.stopOnce.Do(func() {
		close(s.stopRead)
		s.cancel()
	})
}

func (s *Stream) reading() bool {
	select {
	case <-s.stopRead:
		return false
	default:
		return true
	}
}

// Run streams into out until ctx ends (then it confirms the watermark one
// last time and returns nil) or a fatal error occurs. Connection losses are
// retried with backoff for ever.
func (s *Stream) Run(ctx context.Context, out chan<- *Batch) error {
	defer s.StopReading()
	start := ResumeAt{Pos: s.cfg.StartLSN, Mark: s.cfg.FirstMark} // the start was proven by the run's start checks
	attempt := 0
	for {
		began := time.Now()
		err := s.session(ctx, start, out)
		s.connected(false)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil || !s.reading() {
			// Draining without a connection: wait for the end.
			<-ctx.Done()
			return nil
		}
		if fault.IsFatal(err) {
			return err
		}
		if s.cfg.CopyOf != "" {
			return &fault.FatalError{Err: fmt.Errorf("replay connection lost: %w", err)}
		}
		if time.Since(began) > time.Minute {
			attempt = 0
		}
		wait := backoff.Jitter(backoff.Nth(100*time.Millisecond, s.cfg.BackoffMax, attempt))
		s.log.Warn("replication connection lost; reconnecting", "err", err, "in", wait.Round(time.Millisecond))
		s.m.Reconnects.Inc()
		attempt++

		// Everything sent before the loss is in out; learn where it ends.
		reset, resumed := NewReset()
		select {
		case out <- NewBatch(reset):
		case <-ctx.Done():
			return nil
		}
		select {
		case start = <-resumed:
		case <-ctx.Done():
			return nil
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
	}
}

// identify checks the server a connection reached before streaming
// resumes at start there: a reconnect may reach another server (a
// promoted standby: its history must contain everything streamed so far)
// or the same one restored from an older copy (sameServer, and the mark
// that proves start: a restore that its WAL end passed again since).
func (s *Stream) identify(ctx context.Context, conn *pgconn.PgConn, at ResumeAt) error {
	start := at.Pos
	srv, err := identifySystem(ctx, conn)
	if err != nil {
		return err
	}
	if err := s.checkMark(ctx, conn, at); err != nil {
		return err
	}
	if s.timeline != 0 && srv.Timeline == s.timeline {
		if err := sameServer(s.systemID, start, srv, s.cfg.Standby); err != nil {
			return err
		}
	}
	if s.timeline != 0 && srv.Timeline != s.timeline {
		if err := srv.readHistory(ctx, conn); err != nil {
			return err
		}
		if err := followTimeline(s.timeline, start, srv); err != nil {
			return err
		}
		s.log.Warn("the server is on a new timeline (failover or restore); its history has everything streamed so far",
			"from_timeline", s.timeline, "timeline", srv.Timeline, "resume", start)
	}
	s.timeline, s.systemID = srv.Timeline, srv.SystemID
	if s.OnTimeline != nil {
		s.OnTimeline(srv.Timeline)
	}
	return nil
}

// session is one connection: connect, check the server, start
// replication, then read until the session ends (sessionLoop.run) or Drop
// ends it (errDropped).
func (s *Stream) session(parent context.Context, at ResumeAt, out chan<- *Batch) error {
	ctx, drop := context.WithCancel(parent)
	defer drop()
	s.setDrop(drop)
	defer s.setDrop(nil)
	err := s.connectAndRead(ctx, at, out)
	if parent.Err() == nil && ctx.Err() != nil && !fault.IsFatal(err) {
		return errDropped
	}
	return err
}

// connectAndRead is the body of a session.
func (s *Stream) connectAndRead(ctx context.Context, at ResumeAt, out chan<- *Batch) error {
	start := at.Pos
	conn, err := s.cfg.DB.replication(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", classify(err))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		conn.Close(cctx)
	}()

	if err := s.identify(ctx, conn, at); err != nil {
		return err
	}
	if s.cfg.CopyOf != "" {
		if err := s.copySlot(ctx, conn, start); err != nil {
			return err
		}
	}
	if err := pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, pglogrepl.LSN(start),
		pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(s.cfg.Publication, s.cfg.Messages || s.cfg.MarksTable != "")}); err != nil {
		return fmt.Errorf("start replication: %w", classify(err))
	}
	s.connected(true)
	s.log.Info("replication started", "slot", s.cfg.Slot, "from", start)

	l := &sessionLoop{s: s, conn: conn, nc: conn.Conn(), out: out, st: &status{conn: conn, timeout: s.cfg.ReceiveTimeout},
		live: liveness{heard: time.Now()}}
	defer l.releasePending()
	// Reads wait on the socket's deadline: ReceiveMessage with a context
	// other than Background arms pgconn's context watcher, and a deadline
	// context costs a timer, for every message (bench/results/HISTORY.md).
	// StopReading ends a read by moving the deadline to now; so does the
	// end of ctx: the last status update then goes at once.
	wakeRead := func() { _ = l.nc.SetReadDeadline(time.Now()) }
	defer context.AfterFunc(s.readCtx, wakeRead)()
	defer context.AfterFunc(ctx, wakeRead)()
	return l.run(ctx)
}

// copySlot makes the session's temporary copy of the slot a replay reads
// (a temporary slot belongs to the session that made it).
func (s *Stream) copySlot(ctx context.Context, conn *pgconn.PgConn, start lsn.LSN) error {
	sql := fmt.Sprintf("SELECT * FROM pg_copy_logical_replication_slot(%s, %s, true)", quoteLiteral(s.cfg.CopyOf), quoteLiteral(s.cfg.Slot))
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return fmt.Errorf("copy slot %s: %w", s.cfg.CopyOf, classify(err))
	}
	// The range was checked against the original slot before the copy;
	// the original may have moved on since, and a copy that starts after
	// the range's first LSN would skip the events before it, silently.
	return copyCovers(res, s.cfg.CopyOf, start)
}

// walCopy copies WAL data out of the connection's read buffer. Begin and
// Commit messages (two of a one-row transaction's three) are decoded into
// values and dropped, so they share slabs that only queued messages keep
// alive. Any other message may live on in a record (its bytes are the
// record's) and gets an allocation of its own: one slow record must not pin
// a slab of unrelated WAL.
type walCopy struct{ slab []byte }

const (
	walSlab = 16 << 10
	// Begin is 21 bytes and Commit 26 (PG docs 55.9, "Logical Replication
	// Message Formats"); anything longer is not one of them.
	walSmall = 32
)

func (c *walCopy) copy(b []byte) []byte {
	if len(b) == 0 || len(b) > walSmall || b[0] != 'B' && b[0] != 'C' {
		return append([]byte(nil), b...)
	}
	if cap(c.slab)-len(c.slab) < len(b) {
		c.slab = make([]byte, 0, walSlab)
	}
	n := len(c.slab)
	c.slab = append(c.slab, b...)
	return c.slab[n:len(c.slab):len(c.slab)] // capped: an append cannot reach the next message
}

// pluginArgs are the pgoutput options, PG docs 55.5 "Logical Streaming
// Replication Parameters". publication_names is a list of identifiers in a
// string (pgoutput splits it with SplitIdentifierString): quoted as an
// identifier, then as a literal.
func pluginArgs(publication string, messages bool) []string {
	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(pgx.Identifier{publication}.Sanitize())}
	if messages {
		args = append(args, "messages 'true'")
	}
	return args
}

// push hands b to the pipeline once its bytes fit in the queue budget and
// the queue has room. While the pipeline is full (Kafka slow or down) it
// keeps sending status updates, so the walsender does not time out.
func (s *Stream) push(ctx context.Context, st *status, out chan<- *Batch, b *Batch, received *lsn.LSN) error {
	b.budget, b.held, b.heldN = s.buf, b.bytes, int64(len(b.Msgs))
	taken := s.buf.take(b.held, b.heldN)
	if taken {
		select {
		case out <- b:
			return nil
		default:
		}
	}
	if !taken {
		b.budget = nil // Release must not return what was never taken
	}
	// One ticker per session: in a drain the queue is full and every
	// batch waits here.
	if st.tick == nil {
		st.tick = time.NewTicker(s.cfg.StatusInterval)
	} else {
		st.tick.Reset(s.cfg.StatusInterval)
	}
	t := st.tick
	defer t.Stop()
	for {
		var send chan<- *Batch // nil, so never ready, until the bytes are taken
		if taken {
			send = out
		}
		select {
		case send <- b:
			return nil
		case <-s.buf.freed:
			if !taken && s.buf.take(b.held, b.heldN) {
				taken, b.budget = true, s.buf
			}
		case <-ctx.Done():
			b.Release()
			return nil
		case <-s.stopRead:
			b.Release()
			return nil
		case now := <-t.C:
			acked := s.pos.Acked()
			if err := st.send(*received, acked, now, false); err != nil {
				b.Release()
				return err
			}
			s.m.ConfirmedLSN.Set(float64(acked))
		}
	}
}

func (s *Stream) connected(up bool) {
	if up {
		s.m.Connected.Set(1)
	} else {
		s.m.Connected.Set(0)
	}
	if s.OnConnected != nil {
		s.OnConnected(up)
	}
}

// observe records the highest position received. Replication lag is not
// the stream's to write: it is read from the slot (see metrics.LagBytes),
// which keeps moving while this connection is down.
func (s *Stream) observe(received lsn.LSN) { s.m.ReceivedLSN.Set(float64(received)) }
