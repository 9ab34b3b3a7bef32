package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// sessionLoop is one connection's streaming state. Receiving (run) is kept
// apart from handling a message (handle) and from the decisions, which are
// pure functions of the clock (timing, liveness) and table-tested.
type sessionLoop struct {
	s    *Stream
	conn *pgconn.PgConn
	nc   net.Conn
	out  chan<- *Batch
	st   *status
	live liveness

	wal      walCopy
	received lsn.LSN // the highest position received
	replyNow bool    // the server asked for a reply
	armed    time.Time
	// pend holds messages read and not yet handed over. It goes when a
	// transaction is complete and nothing more has already arrived (if some
	// has, the read below only takes what the connection buffered), when it
	// is full, or when a read times out. Inside a transaction it waits up to
	// holdMax for the rest: the walsender sends a decoded transaction back to
	// back (protocol version 1 decodes it only after its commit), but it may
	// pass over many changes of unpublished tables between two messages.
	pend   *Batch
	pendAt time.Time
	inTxn  bool
}

// liveness, as PostgreSQL's walreceiver keeps it (walreceiver.c,
// wal_receiver_timeout): the walsender only sends keepalives when it has not
// heard from us for wal_sender_timeout/2, which our status updates prevent,
// so an idle server may rightly say nothing. After half the timeout without
// a message, a status update requests a reply, which the walsender answers
// at once (walsender.c, ProcessStandbyReplyMessage).
type liveness struct {
	heard  time.Time // when the last message was handled
	pinged bool      // a reply was requested since
	// fresh: a message was handled; heard is taken at the next turn, after
	// the handling, so the time a push waited on a full queue (not
	// reading) does not count as silence.
	fresh bool
}

// turn starts a loop turn at now.
func (l *liveness) turn(now time.Time) {
	if l.fresh {
		l.heard, l.pinged, l.fresh = now, false, false
	}
}

// silent returns errSilent when nothing was heard for timeout while reading.
func (l liveness) silent(now time.Time, reading bool, timeout time.Duration) error {
	if d := now.Sub(l.heard); reading && d >= timeout {
		return fmt.Errorf("receive: %w for %v", errSilent, d.Round(time.Millisecond))
	}
	return nil
}

// pingDue reports whether the next status update must request a reply.
func (l liveness) pingDue(now time.Time, reading bool, timeout time.Duration) bool {
	return reading && !l.pinged && now.Sub(l.heard) >= timeout/2
}

// wake is when the loop must look at liveness again.
func (l liveness) wake(timeout time.Duration) time.Time {
	if l.pinged {
		return l.heard.Add(timeout)
	}
	return l.heard.Add(timeout / 2)
}

// timing holds the stream's intervals.
type timing struct {
	status, confirmDelay, receive time.Duration
}

// statusDue reports whether a status update goes now: a reply is asked for
// (by the server or by liveness), the interval passed since the last one
// (sent at last, confirming flushed), or the watermark moved and waited
// confirmDelay.
func (c timing) statusDue(now, last time.Time, acked, flushed lsn.LSN, reply bool) bool {
	return reply || now.Sub(last) >= c.status || acked != flushed && now.Sub(last) >= c.confirmDelay
}

// statusDeadline is when the next status update is due if nothing
// arrives: soon while events are in flight or a moved watermark waits,
// else one interval after the last update.
func (c timing) statusDeadline(now, last time.Time, busy bool) time.Time {
	if busy {
		return now.Add(c.confirmDelay)
	}
	return last.Add(c.status)
}

// readDeadline bounds the next read: the status deadline, liveness, and
// messages held (pending since pendAt, inTxn: their transaction is not
// complete). A complete batch with more already buffered reads only what
// is buffered (burstEnd).
func (c timing) readDeadline(status time.Time, l liveness, pending, inTxn bool, pendAt time.Time) time.Time {
	d := status
	if w := l.wake(c.receive); w.Before(d) {
		d = w
	}
	switch {
	case pending && !inTxn:
		return burstEnd
	case pending:
		if held := pendAt.Add(holdMax); held.Before(d) {
			d = held
		}
	}
	return d
}

func (l *sessionLoop) timing() timing {
	return timing{status: l.s.cfg.StatusInterval, confirmDelay: l.s.cfg.ConfirmDelay, receive: l.s.cfg.ReceiveTimeout}
}

// run reads until the session ends: nil once ctx ended (after a last status
// update), the error that ended the connection otherwise.
func (l *sessionLoop) run(ctx context.Context) error {
	c := l.timing()
	for {
		now := time.Now()
		l.live.turn(now)
		acked := l.s.pos.Acked()
		if ctx.Err() != nil {
			// Shutting down: confirm what was delivered, once more.
			l.s.m.ConfirmedLSN.Set(float64(acked))
			return l.st.send(l.received, acked, now, false)
		}
		reading := l.s.reading()
		if err := l.live.silent(now, reading, c.receive); err != nil {
			return err
		}
		ping := l.live.pingDue(now, reading, c.receive)
		if c.statusDue(now, l.st.at, acked, l.st.flush, ping || l.replyNow) {
			if err := l.st.send(l.received, acked, now, ping); err != nil {
				return err
			}
			l.s.m.ConfirmedLSN.Set(float64(acked))
			l.replyNow = false
			l.live.pinged = l.live.pinged || ping
		}
		deadline := c.statusDeadline(now, l.st.at, l.s.pos.InFlight() > 0 || acked != l.st.flush)
		if !reading {
			l.drain(ctx, deadline)
			continue
		}
		if err := l.arm(now, c.readDeadline(deadline, l.live, l.pend != nil, l.inTxn, l.pendAt)); err != nil {
			return err
		}
		if l.s.readCtx.Err() != nil || ctx.Err() != nil {
			continue // stopped before the deadline above was set: it would not end the read
		}
		msg, err := l.conn.ReceiveMessage(context.Background())
		if err != nil {
			if pgconn.Timeout(err) || l.s.readCtx.Err() != nil {
				if l.pend != nil && l.s.readCtx.Err() == nil {
					if err := l.flush(ctx); err != nil {
						return err
					}
				}
				continue
			}
			return fmt.Errorf("receive: %w", classify(err))
		}
		l.live.fresh = true
		if err := l.handle(ctx, msg); err != nil {
			return err
		}
	}
}

// drain waits, while no new WAL is read, until the deadline, an ack or the
// end of ctx: the loop then confirms what was acknowledged.
func (l *sessionLoop) drain(ctx context.Context, deadline time.Time) {
	l.releasePending() // not taken: the WAL is read again on the next start
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-l.s.pos.Advanced():
	case <-t.C:
	}
}

// arm moves the socket's read deadline. A deadline sooner than needed only
// wakes the loop early, so it moves only when it must come sooner or has
// passed.
func (l *sessionLoop) arm(now, deadline time.Time) error {
	if l.armed.IsZero() || deadline.Before(l.armed) || !l.armed.After(now) {
		if err := l.nc.SetReadDeadline(deadline); err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		l.armed = deadline
	}
	return nil
}

// handle takes one message from the server.
func (l *sessionLoop) handle(ctx context.Context, msg pgproto3.BackendMessage) error {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return fatalf("empty CopyData message from server")
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			if err := l.keepalive(msg.Data[1:]); err != nil {
				return err
			}
		case pglogrepl.XLogDataByteID:
			if err := l.xlogData(msg.Data[1:]); err != nil {
				return err
			}
		}
		// A complete batch goes now when nothing more is buffered (the
		// common case at steady rates: no read is tried for it).
		if l.pend != nil && (l.pend.full(l.s.batchMsgs, l.s.batchBytes) || !l.inTxn && l.conn.Frontend().ReadBufferLen() == 0) {
			return l.flush(ctx)
		}
	case *pgproto3.ErrorResponse:
		return fmt.Errorf("replication: %w", classify(pgconn.ErrorResponseToPgError(msg)))
	case *pgproto3.CopyDone:
		return errors.New("server ended the replication stream")
	}
	return nil
}

func (l *sessionLoop) keepalive(data []byte) error {
	ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data)
	if err != nil {
		return fatalf("parse keepalive: %v", err)
	}
	end := lsn.LSN(ka.ServerWALEnd)
	l.received = max(l.received, end)
	l.s.observe(l.received)
	l.replyNow = ka.ReplyRequested
	k := Message{Kind: Keepalive, WALEnd: end}
	if l.pend != nil {
		l.pend.add(k)
		return nil
	}
	// Best effort: a full queue means data is pending anyway.
	b := NewBatch(k)
	select {
	case l.out <- b:
	default:
		b.Release()
	}
	return nil
}

func (l *sessionLoop) xlogData(data []byte) error {
	xld, err := pglogrepl.ParseXLogData(data)
	if err != nil {
		return fatalf("parse XLogData: %v", err)
	}
	// The connection reuses its read buffer: copy once, here.
	m := Message{Kind: Data, WALStart: lsn.LSN(xld.WALStart), WALEnd: lsn.LSN(xld.ServerWALEnd), Data: l.wal.copy(xld.WALData)}
	l.received = max(l.received, m.WALStart)
	l.s.observe(l.received)
	if l.pend == nil {
		l.pend, l.pendAt = NewBatch(), time.Now() // not the loop's now: that was before the read
	}
	l.pend.add(m)
	// Begin and Commit bracket a transaction (PG docs 55.9); any other
	// message outside them (a non-transactional logical message) is
	// complete by itself.
	switch {
	case len(m.Data) > 0 && m.Data[0] == 'B':
		l.inTxn = true
	case len(m.Data) > 0 && m.Data[0] == 'C':
		l.inTxn = false
	}
	return nil
}

// flush hands the pending batch over (Stream.push).
func (l *sessionLoop) flush(ctx context.Context) error {
	b := l.pend
	l.pend = nil
	return l.s.push(ctx, l.st, l.out, b, &l.received)
}

func (l *sessionLoop) releasePending() {
	if l.pend != nil {
		l.pend.Release()
		l.pend = nil
	}
}
