package replication

import "testing"

func TestTableStoreForget(t *testing.T) {
	db, err := ParseDB("postgres://x@h/db", "")
	if err != nil {
		t.Fatal(err)
	}
	s := NewTableStore(db, "outbox_cdc.checkpoints", "it's")
	if got, want := s.Forget(), `DELETE FROM "outbox_cdc"."checkpoints" WHERE slot = 'it''s'`; got != want {
		t.Errorf("Forget() = %s, want %s", got, want)
	}
}
