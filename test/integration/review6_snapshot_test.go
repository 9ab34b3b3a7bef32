package integration

import (
	"os"
	"strings"
	"testing"
	"time"
)

// review6: reproductions for the pending snapshot in exactly_once.

// TestReview6SnapshotRedoCloudEventsStructured: as
// TestExactlyOnceSnapshotKilledMidway, with kafka.format
// cloudevents-structured. The structured value carries "time", which for a
// snapshot row is the snapshot's start (publishRows' time.Now(),
// pipeline/snapshot.go). The redo's read-back looks rows up by topic, key,
// id and value: the value of every row differs from the interrupted run's,
// nothing is found, and everything the interrupted snapshot committed is
// published again.
func TestReview6SnapshotRedoCloudEventsStructured(t *testing.T) {
	review6KilledRedo(t, "r6snapce", true, "OUTBOX_CDC_KAFKA_FORMAT=cloudevents-structured")
}

// TestReview6SnapshotRedoWithoutIDHeader: outbox.standard_headers without
// id. The read-back keeps only records with an id header (readback.go load:
// !r.HasID), so a snapshot taken again would find none of the interrupted
// one's records and publish them all again (the review's reproduction:
// 4000 duplicates). The combination is refused at start now, naming the key
// and the fix; nothing is published.
func TestReview6SnapshotRedoWithoutIDHeader(t *testing.T) {
	const slot = "r6snapnoid"
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	dropSlotAtEnd(t, dsn, slot)
	addr := freeAddr(t)
	base, err := os.ReadFile(eosConfig(t, dsn, slot, addr))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := writeConfig(t, string(base)+"snapshot:\n  mode: pending\n")
	code, out := runBinary(t, time.Minute, []string{"OUTBOX_CDC_OUTBOX_STANDARD_HEADERS=event_type,aggregate_type"}, "run", "--config", cfgPath)
	if code != 2 || !strings.Contains(out, "outbox.standard_headers") || !strings.Contains(out, "keep id in the list") {
		t.Fatalf("exit %d, want 2 naming outbox.standard_headers and the fix:\n%s", code, out)
	}
}

// review6KilledRedo: 40,000 rows, parts of 2,000, SIGKILL once 4,000 are
// committed, a restart that takes the snapshot again; every row once for
// read_committed.
func review6KilledRedo(t *testing.T, slot string, structured bool, extra ...string) {
	const rows = 40_000
	k := killSnapshot(t, slot, rows, 4000, extra...)
	p := k.redo(t)
	waitCommitted(t, k.topic, rows, 2*time.Minute)
	k.eachOnce(t, snapshotSeqs(t, k.topic, structured), rows)
	stopClean(t, p)
}

// TestReview6SnapshotInterruptedThenModeNone: the snapshot is interrupted
// (SIGKILL after some parts committed), and the operator gives it up:
// snapshot.mode none, which the start allows with a warning ("the
// checkpoint records an unfinished initial snapshot, which snapshot.mode
// none does not take again", plan.go) and which at_least_once follows by
// streaming from the slot. In exactly_once the position committed by the
// snapshot's last part, Part{Final: consistent point, Xid: 0}, is a
// resume the stream can never satisfy: SetFloor keeps it (its Final is not
// below the slot's consistent point) and the first streamed transaction
// stops the run (failSplit: "was not decoded again: the stream is past
// it"), at every start, with a fix about changed rows or routing.
func TestReview6SnapshotInterruptedThenModeNone(t *testing.T) {
	const rows, later = 40_000, 10
	k := killSnapshot(t, "r6snapnone", rows, 4000)
	// Ready once it streams: the writes after it are decoded.
	p := startProc(t, k.config(t, "none"), k.addr, true, k.env...)
	writeEvents(t, k.conn, k.slot, rows+1, rows+1+later)
	waitFor(t, time.Minute, "the events written after the restart, committed", func() bool {
		if p.proc.Exited() {
			t.Fatalf("connector exited: %v\n%s", p.proc.Err(), p.output())
		}
		return committedSeqCount(t, k.topic) >= k.first+later
	})
	stopClean(t, p)
}
