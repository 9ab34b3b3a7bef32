package lsn_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// pgLSNOID is pg_lsn's type OID (pg_type.dat). pgx registers no codec for
// it, so it asks for the text form and hands it to LSN.Scan.
const pgLSNOID = 3220

// TestPgxScan runs pgx's own scan plans (the ones Rows.Scan uses) for the
// columns the connector reads: pg_lsn and text, NULL into a *lsn.LSN and
// into a sql.Null, and NULL into an lsn.LSN, which must fail.
func TestPgxScan(t *testing.T) {
	m := pgtype.NewMap()
	for _, oid := range []uint32{pgLSNOID, pgtype.TextOID} {
		var l lsn.LSN
		if err := m.Scan(oid, pgtype.TextFormatCode, []byte("16/B374D848"), &l); err != nil || l != 0x16B374D848 {
			t.Errorf("oid %d: scan into lsn.LSN = %v, %v", oid, l, err)
		}
		if err := m.Scan(oid, pgtype.TextFormatCode, []byte("16/"), &l); err == nil {
			t.Errorf("oid %d: bad text scanned as %v", oid, l)
		}
		if err := m.Scan(oid, pgtype.TextFormatCode, nil, &l); err == nil {
			t.Errorf("oid %d: NULL scanned into lsn.LSN as %v", oid, l)
		}

		p := new(lsn.LSN)
		if err := m.Scan(oid, pgtype.TextFormatCode, nil, &p); err != nil || p != nil {
			t.Errorf("oid %d: NULL into *lsn.LSN = %v, %v; want nil", oid, p, err)
		}
		if err := m.Scan(oid, pgtype.TextFormatCode, []byte("0/10"), &p); err != nil || p == nil || *p != 0x10 {
			t.Errorf("oid %d: scan into *lsn.LSN = %v, %v", oid, p, err)
		}

		n := sql.Null[lsn.LSN]{V: 1, Valid: true}
		if err := m.Scan(oid, pgtype.TextFormatCode, nil, &n); err != nil || n.Valid {
			t.Errorf("oid %d: NULL into sql.Null[lsn.LSN] = %+v, %v", oid, n, err)
		}
		if err := m.Scan(oid, pgtype.TextFormatCode, []byte("1/0"), &n); err != nil || !n.Valid || n.V != 1<<32 {
			t.Errorf("oid %d: scan into sql.Null[lsn.LSN] = %+v, %v", oid, n, err)
		}
	}
}
