package replication

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
)

func fatalf(format string, args ...any) error {
	return &fault.FatalError{Err: fmt.Errorf(format, args...)}
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
		return &fault.FatalError{Reason: "slot_or_publication_missing", Err: fmt.Errorf("%w (the slot or the publication was dropped: "+
			"restart to recreate it; if the same error returns, the WAL written while the publication was missing cannot be decoded: "+
			"drop the slot, restart, and reconcile events committed after the checkpoint LSN (docs/operations.md))", err)}
	case pgErr.Code == "55000": // object_not_in_prerequisite_state, e.g. an invalidated slot
		return &fault.FatalError{Reason: "slot_invalidated", Err: fmt.Errorf("%w (the slot was invalidated, likely by max_slot_wal_keep_size: "+
			"drop and recreate it, then reconcile events after the checkpoint LSN)", err)}
	}
	return &fault.FatalError{Reason: "server_error", Err: err}
}

// Transient reports whether err says the server or the way to it went away
// (a restart, a crash, a cut connection): the same work may succeed on a
// new connection. A server's answer to the statement itself is not, nor is
// any other error: retrying those would repeat them forever.
func Transient(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Class 08 connection exception, 57P operator intervention
		// (admin_shutdown, crash_shutdown, cannot_connect_now), 53300
		// too_many_connections (PG docs, Appendix A).
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") || pgErr.Code == "53300"
	}
	var connect *pgconn.ConnectError
	var nerr net.Error
	return errors.As(err, &connect) || errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, pgconn.ErrConnClosed)
}
