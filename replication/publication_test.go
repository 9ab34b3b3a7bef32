package replication

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

func TestLeftStream(t *testing.T) {
	src := Source{Publication: "pub", OutboxTable: OutboxTable{Schema: "public", Table: "outbox"}}
	start := Membership{Publication: true, PubOID: 5, PubXmin: 1000, PubInsert: true, RelID: 100, PubRelID: 7, Member: true}
	tests := []struct {
		name string
		now  func(m *Membership)
		want string // "" for still in the stream
	}{
		{"unchanged", func(m *Membership) {}, ""},
		{"publication dropped", func(m *Membership) { *m = Membership{RelID: 100} }, "publication pub was dropped"},
		{"renamed", func(m *Membership) { m.RelID, m.Member, m.StartName = 0, false, "public.outbox_v2" }, "was renamed to public.outbox_v2"},
		{"dropped", func(m *Membership) { m.RelID, m.Member = 0, false }, `"public"."outbox" was dropped`},
		{"renamed and name taken", func(m *Membership) { m.RelID, m.StartName = 101, "public.old" }, "renamed to public.old and another table took its name"},
		{"dropped and created", func(m *Membership) { m.RelID, m.Member = 101, false }, "dropped and created again (oid 101, was 100)"},
		{"removed", func(m *Membership) { m.Member, m.PubRelID = false, 0 }, "was removed from publication pub"},
		{"removed and added", func(m *Membership) { m.PubRelID = 8 }, "removed from publication pub and added again"},
		{"publication created again", func(m *Membership) { m.PubOID = 9 }, "publication pub was dropped and created again (oid 9, was 5)"},
		{"publication altered", func(m *Membership) { m.PubXmin = 1234 }, "publication pub was altered (ALTER PUBLICATION ... SET)"},
		{"inserts off", func(m *Membership) { m.PubInsert = false }, "no longer publishes inserts"},
		{"via root off", func(m *Membership) { m.Partitioned = true }, "no longer has publish_via_partition_root"},
		{"partitioned via root", func(m *Membership) { m.Partitioned, m.ViaRoot = true, true }, ""},
		{"column dropped is no stream change", func(m *Membership) { m.Missing = []string{"tenant"} }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := start
			tc.now(&now)
			got := now.LeftStream(src, start)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("LeftStream = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSchemaProblem(t *testing.T) {
	src := Source{OutboxTable: OutboxTable{Schema: "public", Table: "outbox"}}
	if got := (Membership{RelID: 1}).SchemaProblem(src); got != "" {
		t.Errorf("no missing column: %q", got)
	}
	got := (Membership{RelID: 1, Missing: []string{"tenant", "payload"}}).SchemaProblem(src)
	// The decoder's wording for a Relation message that lacks them: either
	// path may notice first, and the message must not depend on which.
	if want := `columns "tenant", "payload" missing from table public.outbox`; got != want {
		t.Errorf("SchemaProblem = %q, want %q", got, want)
	}
	if got := (Membership{Missing: []string{"x"}}).SchemaProblem(src); got != "" {
		t.Errorf("a missing table is LeftStream's to report, got %q", got)
	}
}

// TestCopyCovers: a replay whose slot copy starts after --from-lsn (the
// original slot moved on between the range check and the copy) is refused
// instead of skipping the events in between.
func TestCopyCovers(t *testing.T) {
	res := func(pos string) []*pgconn.Result {
		return []*pgconn.Result{{Rows: [][][]byte{{[]byte("copy"), []byte(pos)}}}}
	}
	tests := []struct {
		name    string
		res     []*pgconn.Result
		from    lsn.LSN
		wantErr string
	}{
		{"copy at from", res("0/100"), 0x100, ""},
		{"copy before from", res("0/F0"), 0x100, ""},
		{"copy moved past from", res("0/180"), 0x100, "it moved to 0/180 while the replay started"},
		{"no row", []*pgconn.Result{{}}, 0x100, "unexpected result"},
		{"bad position", res("nonsense"), 0x100, "copy slot s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := copyCovers(tc.res, "s", tc.from)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("copyCovers: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("copyCovers = %v, want %q", err, tc.wantErr)
			}
			if !fault.IsFatal(err) {
				t.Errorf("%v is retried, want fatal", err)
			}
		})
	}
}
