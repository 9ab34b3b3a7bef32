// Package replication owns the PostgreSQL side of outbox-cdc: prerequisite
// checks, publication and slot setup, and the logical replication stream. It
// is the only package that imports pglogrepl's streaming API.
package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-cdc/outbox-cdc/internal/metrics"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Kind says what a Message carries.
type Kind uint8

const (
	// Data is one pgoutput message.
	Data Kind = iota + 1
	// Keepalive reports that the server has sent everything before WALEnd.
	Keepalive
	// Reset says the connection was lost: the receiver forgets any open
	// transaction and calls Resume with the end LSN of the last transaction it
	// fully dispatched; streaming restarts after it.
	Reset
)

// Message is one item of the stream, delivered in WAL order.
type Message struct {
	Kind     Kind
	WALStart lsn.LSN // Data: position of the message
	WALEnd   lsn.LSN // server's sent position (Keepalive) or WAL end (Data)
	Data     []byte  // Data: the pgoutput message, owned by the receiver
	resume   chan lsn.LSN
}

// Resume answers a Reset message.
func (m *Message) Resume(pos lsn.LSN) { m.resume <- pos }

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
	// StartLSN is where streaming starts; PostgreSQL skips transactions
	// whose commit record lies before it (zero: the slot's confirmed
	// position). Reconnects start after the last dispatched transaction.
	StartLSN lsn.LSN
	// Messages asks pgoutput for logical decoding messages too (PG 14+).
	Messages bool
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

	stopOnce sync.Once
	stopRead chan struct{}
	readCtx  context.Context
	cancel   context.CancelFunc

	// OnConnected, when set before Run, learns when streaming starts and stops.
	OnConnected func(bool)
}

// NewStream prepares a stream; Run starts it.
func NewStream(cfg Config, pos Positions, m *metrics.Metrics, log *slog.Logger) *Stream {
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	if cfg.ConfirmDelay <= 0 {
		cfg.ConfirmDelay = 5 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 30 * time.Second
	}
	rc, cancel := context.WithCancel(context.Background())
	return &Stream{cfg: cfg, pos: pos, log: log, m: m, stopRead: make(chan struct{}), readCtx: rc, cancel: cancel}
}

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
func (s *Stream) Run(ctx context.Context, out chan<- Message) error {
	defer s.StopReading()
	start := s.cfg.StartLSN
	backoff := 100 * time.Millisecond
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
		if IsFatal(err) {
			return err
		}
		if s.cfg.CopyOf != "" {
			return &FatalError{Err: fmt.Errorf("replay connection lost: %w", err)}
		}
		if time.Since(began) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		s.log.Warn("replication connection lost; reconnecting", "err", err, "in", wait.Round(time.Millisecond))
		s.m.Reconnects.Inc()
		backoff = min(backoff*2, s.cfg.BackoffMax)

		// Everything sent before the loss is in out; learn where it ends.
		reset := Message{Kind: Reset, resume: make(chan lsn.LSN, 1)}
		select {
		case out <- reset:
		case <-ctx.Done():
			return nil
		}
		select {
		case start = <-reset.resume:
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

// session is one connection: connect, start replication, loop.
func (s *Stream) session(ctx context.Context, start lsn.LSN, out chan<- Message) error {
	conn, err := Connect(ctx, s.cfg.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	// pgoutput options, PG docs 55.5 "Logical Streaming Replication Parameters".
	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(quoteIdent(s.cfg.Publication))}
	if s.cfg.Messages {
		args = append(args, "messages 'true'")
	}
	if s.cfg.CopyOf != "" {
		// A temporary slot belongs to the session that made it.
		sql := fmt.Sprintf("SELECT pg_copy_logical_replication_slot(%s, %s, true)", quoteLiteral(s.cfg.CopyOf), quoteLiteral(s.cfg.Slot))
		if _, err := conn.Exec(ctx, sql).ReadAll(); err != nil {
			return fmt.Errorf("copy slot %s: %w", s.cfg.CopyOf, classify(err))
		}
	}
	if err := pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, pglogrepl.LSN(start),
		pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return fmt.Errorf("start replication: %w", classify(err))
	}
	s.connected(true)
	s.log.Info("replication started", "slot", s.cfg.Slot, "from", start)

	st := &status{conn: conn}
	var received lsn.LSN
	replyNow := false
	for {
		now := time.Now()
		acked := s.pos.Acked()
		if ctx.Err() != nil {
			// Shutting down: confirm what was delivered, once more.
			s.m.ConfirmedLSN.Set(float64(acked))
			return st.send(received, acked, now)
		}
		if replyNow || now.Sub(st.at) >= s.cfg.StatusInterval ||
			(acked != st.flush && now.Sub(st.at) >= s.cfg.ConfirmDelay) {
			if err := st.send(received, acked, now); err != nil {
				return err
			}
			s.m.ConfirmedLSN.Set(float64(acked))
			replyNow = false
		}
		deadline := st.at.Add(s.cfg.StatusInterval)
		if s.pos.InFlight() > 0 || acked != st.flush {
			deadline = now.Add(s.cfg.ConfirmDelay)
		}
		if !s.reading() {
			// Draining: no new WAL; keep confirming as acks arrive.
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-ctx.Done():
			case <-s.pos.Advanced():
			case <-t.C:
			}
			t.Stop()
			continue
		}

		rctx, cancel := context.WithDeadline(s.readCtx, deadline)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) || s.readCtx.Err() != nil {
				continue
			}
			return fmt.Errorf("receive: %w", classify(err))
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				return fatalf("empty CopyData message from server")
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fatalf("parse keepalive: %v", err)
				}
				end := lsn.LSN(ka.ServerWALEnd)
				received = max(received, end)
				s.observe(received, end, acked)
				replyNow = ka.ReplyRequested
				// Best effort: a full queue means data is pending anyway.
				select {
				case out <- Message{Kind: Keepalive, WALEnd: end}:
				default:
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fatalf("parse XLogData: %v", err)
				}
				// The connection reuses its read buffer: copy once, here.
				m := Message{Kind: Data, WALStart: lsn.LSN(xld.WALStart), WALEnd: lsn.LSN(xld.ServerWALEnd),
					Data: append([]byte(nil), xld.WALData...)}
				received = max(received, m.WALStart)
				s.observe(received, m.WALEnd, acked)
				if err := s.push(ctx, st, out, m, &received); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication: %w", classify(pgconn.ErrorResponseToPgError(msg)))
		case *pgproto3.CopyDone:
			return errors.New("server ended the replication stream")
		}
	}
}

// push hands m to the pipeline. While the pipeline is full (Kafka slow or
// down) it keeps sending status updates, so the walsender does not time out.
func (s *Stream) push(ctx context.Context, st *status, out chan<- Message, m Message, received *lsn.LSN) error {
	select {
	case out <- m:
		return nil
	default:
	}
	t := time.NewTicker(s.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case out <- m:
			return nil
		case <-ctx.Done():
			return nil
		case <-s.stopRead:
			return nil
		case now := <-t.C:
			acked := s.pos.Acked()
			if err := st.send(*received, acked, now); err != nil {
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

func (s *Stream) observe(received, walEnd, acked lsn.LSN) {
	s.m.ReceivedLSN.Set(float64(received))
	if walEnd > acked {
		s.m.LagBytes.Set(float64(walEnd - acked))
	} else {
		s.m.LagBytes.Set(0)
	}
}

// status sends standby status updates (PG docs 55.4, "Standby status update (F)").
type status struct {
	conn  *pgconn.PgConn
	flush lsn.LSN
	at    time.Time
	buf   [1 + 8 + 8 + 8 + 8 + 1]byte
}

// send reports write = what was received and flush = apply = acked. For a
// logical slot PostgreSQL confirms the flush position
// (LogicalConfirmReceivedLocation), so flush is set explicitly and never
// derived from write.
//
// Flush is reported only when it moved since the last update, and as zero
// ("invalid": confirms nothing, PostgreSQL keeps the highest one it got)
// otherwise. A server shutting down waits until the client's flush, or its
// write when flush is invalid, reaches what was sent (walsender.c,
// WalSndDone); with events stuck behind an unreachable broker a repeated
// flush would hold a fast shutdown for as long as Kafka is down.
func (st *status) send(received, acked lsn.LSN, now time.Time) error {
	flush := acked
	if acked == st.flush {
		flush = 0
	}
	b := st.buf[:0]
	b = append(b, pglogrepl.StandbyStatusUpdateByteID)
	b = binary.BigEndian.AppendUint64(b, uint64(max(received, acked)))
	b = binary.BigEndian.AppendUint64(b, uint64(flush))
	b = binary.BigEndian.AppendUint64(b, uint64(flush))
	b = binary.BigEndian.AppendUint64(b, uint64(now.Sub(pgEpoch).Microseconds()))
	b = append(b, 0)
	wire, err := (&pgproto3.CopyData{Data: b}).Encode(nil)
	if err != nil {
		return fatalf("encode status update: %v", err)
	}
	if err := st.conn.Frontend().SendUnbufferedEncodedCopyData(wire); err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	st.flush, st.at = acked, now
	return nil
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Connect opens a replication connection (replication=database) for dsn.
func Connect(ctx context.Context, dsn string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, &FatalError{Err: fmt.Errorf("postgres.dsn: %w", err)}
	}
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outbox-cdc"
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", classify(err))
	}
	return conn, nil
}

// FatalError is an error that retrying cannot fix.
type FatalError struct {
	Err error
	// Reason is a short label for metrics: slot_missing, slot_invalidated, ...
	Reason string
}

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

func fatalf(format string, args ...any) error {
	return &FatalError{Err: fmt.Errorf(format, args...)}
}

// IsFatal reports whether err must stop the connector rather than be retried.
func IsFatal(err error) bool {
	var f *FatalError
	var p *PrerequisiteError
	return errors.As(err, &f) || errors.As(err, &p)
}

// classify marks server errors that retrying cannot fix as fatal, with a
// hint. Network errors, shutdowns and a slot held by another connector
// (standby) stay retryable.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == "55006": // object_in_use: another connector holds the slot
		return err
	case strings.HasPrefix(pgErr.Code, "08"), strings.HasPrefix(pgErr.Code, "57P"),
		strings.HasPrefix(pgErr.Code, "53"), strings.HasPrefix(pgErr.Code, "58"):
		return err
	case pgErr.Code == "42704": // undefined_object: slot or publication
		return &FatalError{Reason: "slot_or_publication_missing", Err: fmt.Errorf("%w (the slot or the publication was dropped: "+
			"restart to recreate it; if the same error returns, the WAL written while the publication was missing cannot be decoded: "+
			"drop the slot, restart, and reconcile events committed after the checkpoint LSN (docs/operations.md))", err)}
	case pgErr.Code == "55000": // object_not_in_prerequisite_state, e.g. an invalidated slot
		return &FatalError{Reason: "slot_invalidated", Err: fmt.Errorf("%w (the slot was invalidated, likely by max_slot_wal_keep_size: "+
			"drop and recreate it, then reconcile events after the checkpoint LSN)", err)}
	}
	return &FatalError{Reason: "server_error", Err: err}
}

func quoteIdent(s string) string   { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
