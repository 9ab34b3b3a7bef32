package pipeline

import (
	"strings"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
)

// TestStreamChange: every change that can keep inserts from the stream while
// the connector is stopped is seen, and nothing else counts (the guard's
// xmin bound moves all the time).
func TestStreamChange(t *testing.T) {
	was := offsets.TableStream{Table: "public.outbox", RelID: 10, PubOID: 20, PubXmin: 30, PubRelID: 40, Xmin: 50}
	cases := []struct {
		name string
		set  func(*offsets.TableStream)
		want string // a part of the reason; "" for none
	}{
		{"nothing", func(*offsets.TableStream) {}, ""},
		{"a later bound", func(n *offsets.TableStream) { n.Xmin = 99 }, ""},
		{"table created again", func(n *offsets.TableStream) { n.RelID, n.PubRelID = 11, 41 }, "dropped and created again"},
		{"publication created again", func(n *offsets.TableStream) { n.PubOID, n.PubXmin, n.PubRelID = 21, 31, 42 }, "publication was dropped"},
		{"removed and added", func(n *offsets.TableStream) { n.PubRelID = 43 }, "removed from the publication and added again"},
		{"options altered", func(n *offsets.TableStream) { n.PubXmin = 32 }, "ALTER PUBLICATION"},
		{"member through the schema now", func(n *offsets.TableStream) { n.PubRelID = 0 }, "removed from the publication"},
	}
	for _, c := range cases {
		now := was
		c.set(&now)
		got := streamChange(was, now)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestStoppedBound: the repair of a change found at start reads every
// transaction committing past its position in at_least_once (the floor),
// and only the saved bound in exactly_once, where the start is held for it.
func TestStoppedBound(t *testing.T) {
	cases := []struct {
		name               string
		saved, floor, want uint64
		exactlyOnce        bool
	}{
		{"the checkpoint trails the bound", 500, 450, 450, false},
		{"the floor above the bound", 500, 520, 500, false},
		{"no floor known (an older checkpoint)", 500, 0, 500, false},
		{"exactly_once keeps the saved bound", 500, 450, 500, true},
		{"exactly_once, no floor", 500, 0, 500, true},
	}
	for _, c := range cases {
		if got := stoppedBound(c.saved, c.floor, c.exactlyOnce); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestChangedTables: the bound is the lowest of the changed tables', and
// where they had all ended the lowest of their positions, unknown when one
// of them does not say (a checkpoint of an older version).
func TestChangedTables(t *testing.T) {
	st := func(table string, relID uint32, xmin uint64, verified lsn.LSN) offsets.TableStream {
		return offsets.TableStream{Table: table, RelID: relID, PubOID: 1, Xmin: xmin, Verified: verified}
	}
	cases := []struct {
		name       string
		saved, now []offsets.TableStream
		want       savedChange
	}{
		{"nothing changed", []offsets.TableStream{st("a", 1, 500, 0x100)}, []offsets.TableStream{st("a", 1, 600, 0x200)}, savedChange{}},
		{"one changed", []offsets.TableStream{st("a", 1, 500, 0x100)}, []offsets.TableStream{st("a", 2, 600, 0x200)},
			savedChange{why: "a: " + streamChange(st("a", 1, 0, 0), st("a", 2, 0, 0)), xmin: 500, ended: 0x100}},
		{"two changed: the lowest of each",
			[]offsets.TableStream{st("a", 1, 500, 0x300), st("b", 3, 450, 0x200)},
			[]offsets.TableStream{st("a", 2, 0, 0), st("b", 4, 0, 0)},
			savedChange{why: "a: " + streamChange(st("a", 1, 0, 0), st("a", 2, 0, 0)), xmin: 450, ended: 0x200}},
		{"one changed table without a position: unknown",
			[]offsets.TableStream{st("a", 1, 500, 0x300), st("b", 3, 450, 0)},
			[]offsets.TableStream{st("a", 2, 0, 0), st("b", 4, 0, 0)},
			savedChange{why: "a: " + streamChange(st("a", 1, 0, 0), st("a", 2, 0, 0)), xmin: 450, ended: 0}},
		{"an unchanged table without a position does not count",
			[]offsets.TableStream{st("a", 1, 500, 0x300), st("b", 3, 450, 0)},
			[]offsets.TableStream{st("a", 2, 0, 0), st("b", 3, 0, 0)},
			savedChange{why: "a: " + streamChange(st("a", 1, 0, 0), st("a", 2, 0, 0)), xmin: 500, ended: 0x300}},
	}
	for _, c := range cases {
		if got := changedTables(c.saved, c.now); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestStoppedSince: the repair goes where every transaction below its
// bound had ended, never before the start.
func TestStoppedSince(t *testing.T) {
	cases := []struct{ since, ended, want lsn.LSN }{
		{0x100, 0x300, 0x300}, // the checkpoint trailed the guard
		{0x300, 0x100, 0x300}, // the start is past it
		{0x100, 0, 0x100},     // unknown
	}
	for _, c := range cases {
		if got := stoppedSince(c.since, c.ended); got != c.want {
			t.Errorf("stoppedSince(%v, %v) = %v, want %v", c.since, c.ended, got, c.want)
		}
	}
}
