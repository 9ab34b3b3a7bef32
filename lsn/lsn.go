// Package lsn defines the PostgreSQL write-ahead log position used by every
// package of outbox-cdc. Positions are values, never strings.
package lsn

import (
	"database/sql/driver"
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

// Scan implements sql.Scanner for pg_lsn columns read in text form.
func (l *LSN) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*l = 0
		return nil
	case string:
		return l.UnmarshalText([]byte(v))
	case []byte:
		return l.UnmarshalText(v)
	case int64:
		*l = LSN(v)
		return nil
	default:
		return fmt.Errorf("scan LSN: unsupported type %T", src)
	}
}

// Value implements driver.Valuer: LSNs are sent in text form, which pg_lsn accepts.
func (l LSN) Value() (driver.Value, error) { return l.String(), nil }
