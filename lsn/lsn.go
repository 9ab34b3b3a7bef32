// Package lsn defines the PostgreSQL write-ahead log position used by every
// package of outbox-cdc. Positions are values, never strings.
package lsn

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// LSN is a PostgreSQL log sequence number: a byte offset into the WAL.
// Its text form is two hexadecimal halves, "16/B374D848" (PG docs 8.20, pg_lsn).
type LSN uint64

// Invalid is the zero position, which PostgreSQL prints as 0/0 and treats as
// "no position".
const Invalid LSN = 0

// IsZero reports whether l is the zero position.
func (l LSN) IsZero() bool { return l == 0 }

// String returns the PostgreSQL text form.
func (l LSN) String() string {
	return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l))
}

// Parse reads the PostgreSQL text form ("16/B374D848").
func Parse(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || hi == "" || lo == "" || len(hi) > 8 || len(lo) > 8 {
		return 0, fmt.Errorf("invalid LSN %q: want the form XXX/XXX in hexadecimal", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("invalid LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("invalid LSN %q: %w", s, err)
	}
	return LSN(h<<32 | l), nil
}

// MarshalText lets LSNs appear in JSON and YAML in their PostgreSQL form.
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (l *LSN) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// Scan implements sql.Scanner, so a pg_lsn column (or its ::text) scans
// straight into an LSN with pgx or database/sql. pgx has no codec for pg_lsn
// and reads it in text form, which is what Scan parses.
//
// NULL is an error rather than Invalid: 0/0 is a position a caller could act
// on, and a NULL where none was expected is a bug to surface. Scan a column
// that may be NULL into a *LSN (pgx and database/sql then store nil without
// calling Scan) or a sql.Null[LSN].
func (l *LSN) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		return errors.New("scan LSN: NULL (scan into a *lsn.LSN where the column may be NULL)")
	case string:
		return l.UnmarshalText([]byte(v))
	case []byte:
		return l.UnmarshalText(v)
	case int64:
		if v < 0 {
			return fmt.Errorf("scan LSN: negative position %d", v)
		}
		*l = LSN(v)
		return nil
	default:
		return fmt.Errorf("scan LSN: unsupported type %T", src)
	}
}

// Value implements driver.Valuer: LSNs are sent in text form, which pg_lsn accepts.
func (l LSN) Value() (driver.Value, error) { return l.String(), nil }
