package replication

import (
	"strings"
	"testing"
)

func TestTableStoreForget(t *testing.T) {
	db, err := ParseDB("postgres://x@h/db", nil)
	if err != nil {
		t.Fatal(err)
	}
	s := NewTableStore(db, "outbox_cdc.checkpoints", "it's")
	if got, want := s.Forget(), `DELETE FROM "outbox_cdc"."checkpoints" WHERE slot = 'it''s'`; got != want {
		t.Errorf("Forget() = %s, want %s", got, want)
	}
}

func TestQuoteLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"":          `''`,
		"outbox":    `'outbox'`,
		"it's":      `'it''s'`,
		"''":        `''''''`,
		`back\zero`: `'back\zero'`, // standard_conforming_strings: a backslash is itself
	} {
		if got := quoteLiteral(in); got != want {
			t.Errorf("quoteLiteral(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestPluginArgs(t *testing.T) {
	got := strings.Join(pluginArgs(`Pub "x"'s`, true), ", ")
	want := `proto_version '1', publication_names '"Pub ""x""''s"', messages 'true'`
	if got != want {
		t.Errorf("pluginArgs = %s, want %s", got, want)
	}
	if got := pluginArgs("pub", false); len(got) != 2 {
		t.Errorf("pluginArgs without messages = %q", got)
	}
}
