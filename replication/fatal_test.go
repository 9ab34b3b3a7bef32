package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestTransient(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection reset", fmt.Errorf("backfill: read rows: %w", reset), true},
		{"unexpected EOF", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true},
		{"conn closed", fmt.Errorf("query: %w", pgconn.ErrConnClosed), true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"starting up", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "57P03"}), true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, false},
		{"permission denied", fmt.Errorf("backfill: %w", &pgconn.PgError{Code: "42501"}), false},
		{"out of disk", &pgconn.PgError{Code: "53100"}, false},
		{"canceled", context.Canceled, false},
		{"scan", errors.New("scan: cannot scan int into string"), false},
	} {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
