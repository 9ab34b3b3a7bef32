package replication

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// status sends standby status updates (PG docs 55.4, "Standby status update (F)").
type status struct {
	conn    *pgconn.PgConn
	timeout time.Duration // a write blocked this long means a dead peer
	flush   lsn.LSN
	at      time.Time
	buf     [1 + 8 + 8 + 8 + 8 + 1]byte
	tick    *time.Ticker // push's, while the queue is full
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
//
// ping asks the server to reply at once (the last byte, "reply requested").
func (st *status) send(received, acked lsn.LSN, now time.Time, ping bool) error {
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
	if ping {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	wire, err := (&pgproto3.CopyData{Data: b}).Encode(nil)
	if err != nil {
		return fatalf("encode status update: %v", err)
	}
	// A peer that stopped reading fills the socket buffers at last; then the
	// write would block for ever, here or in a push waiting on Kafka.
	if st.timeout > 0 {
		_ = st.conn.Conn().SetWriteDeadline(time.Now().Add(st.timeout))
	}
	err = st.conn.Frontend().SendUnbufferedEncodedCopyData(wire)
	if st.timeout > 0 {
		_ = st.conn.Conn().SetWriteDeadline(time.Time{})
	}
	if err != nil {
		return fmt.Errorf("send status update: %w", err)
	}
	st.flush, st.at = acked, now
	return nil
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
