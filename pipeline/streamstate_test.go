package pipeline

import (
	"strings"
	"testing"

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
