package chaos

import (
	"testing"
	"time"
)

// The pieces of the restores under load (restore_writing_test.go,
// refusal_test.go, compacted_test.go), fed lines the connector printed in
// the suite's runs and made-up runs.

func TestRestoreMessages(t *testing.T) {
	const markRefused = `time=2026-12-06T18:55:19.527Z level=ERROR msg="connector failed" err="the kafka position 0/1A1B0C8 is not in this server's history: ` +
		`the server lacks history mark 4006361839835642057, written after it was reached (the server was restored from an older copy, a point-in-time ` +
		`restore or a promotion left that history, or the kafka belongs to another deployment); this stays so whatever the server's WAL end becomes; ` +
		`to stream from the slot's confirmed position, forget the position with a tombstone for its key (kafka-console-producer.sh --bootstrap-server ` +
		`127.0.0.1:35763 --topic chaos-67840f08-positions --property parse.key=true --property key.separator='|' --property null.marker=NULL <<< ` +
		`'7716266529346948518/chaos_67840f08_19833/chaos_67840f08|NULL'); the first transactions are then looked up in Kafka before they are published (docs/operations.md, Restores)"`
	topic, key, why := committedRefusal(markRefused)
	if !wantRefusal.MatchString(markRefused) || topic != "chaos-67840f08-positions" || key != "7716266529346948518/chaos_67840f08_19833/chaos_67840f08" || why == "" {
		t.Fatalf("mark refusal: %q %q %q", topic, key, why)
	}
	const walRefused = `level=ERROR msg="connector failed" err="exactly_once: the position 0/19BD078 committed to Kafka (topic chaos-1-positions, key 77/db/slot, ` +
		`timeline 1) lies beyond this server's WAL end 0/199D6F8 (it was written by another server"`
	if topic, key, _ := committedRefusal(walRefused); topic != "chaos-1-positions" || key != "77/db/slot" {
		t.Fatalf("WAL-end refusal: %q %q", topic, key)
	}
	const ckptRefused = `level=ERROR msg="connector failed" err="the checkpoint position 0/1A05848 is not in this server's history: the server lacks history mark ` +
		`8620222988097338294, written after it was reached (...); drop the checkpoint: DELETE FROM \"outbox_cdc\".\"checkpoints\" WHERE slot = 'chaos_1' (docs/operations.md, Restores)"`
	if !wantRefusal.MatchString(ckptRefused) || !wantCkptNotInHistory.MatchString(ckptRefused) || removeFile.MatchString(ckptRefused) {
		t.Fatal("table checkpoint refusal not told apart")
	}
	if m := removeFile.FindStringSubmatch(`drop the checkpoint: remove the file /var/lib/ckpt.json (docs/operations.md, Restores)`); m == nil || m[1] != "/var/lib/ckpt.json" {
		t.Fatalf("file checkpoint refusal: %q", m)
	}
	for _, line := range []string{
		`err="the server's WAL ends at 0/199D6F8 on timeline 1, before 0/19E3038, which it had sent the connector: it was restored from an older copy of its data directory"`,
		`err="the server lacks history mark 3937513601022851257 (\"outbox_cdc\".\"history_marks\"), which the connector decoded at or after 0/19E3038: it was restored from an older copy or replaced by a server that was behind"`,
		`err="after a reconnect the server sent a transaction (xid 812, commit 0/1A00000) the connector did not decode there before it reached 0/1A05848: the server was restored from an older copy"`,
	} {
		if !wantRewound.MatchString(line) {
			t.Errorf("wantRewound misses %s", line)
		}
	}
}

func TestOnlyKinds(t *testing.T) {
	t.Setenv(EnvOnly, "pg-restore-writing=2, pg-restore-older=1")
	m := onlyKind(t, shortMode)
	if len(m.Deck) != 2 || m.Deck[fPGRestoreWriting] != 2 || m.Deck[fPGRestoreOlder] != 1 || m.Name != "short-only-pg-restore-writing-pg-restore-older" {
		t.Fatalf("deck %v, name %s", m.Deck, m.Name)
	}
}

// TestWalEpochsTwoRestores: pg-restore-older rewinds twice in one fault;
// each restore starts a history of its own.
func TestWalEpochsTwoRestores(t *testing.T) {
	t0 := time.Now()
	o := &observation{}
	f := faultRecord{Kind: fPGRestoreOlder}
	f.rewindAt(t0.Add(time.Second))
	f.rewindAt(t0.Add(2 * time.Second))
	o.Faults = []faultRecord{f}
	samples := []sample{{T: t0.Add(500 * time.Millisecond)}, {T: t0.Add(1500 * time.Millisecond)}, {T: t0.Add(2500 * time.Millisecond)}}
	eps := o.walEpochs(nil, samples)
	if len(eps) != 3 || len(eps[0].samples) != 1 || len(eps[1].samples) != 1 || len(eps[2].samples) != 1 {
		t.Fatalf("epochs %+v", eps)
	}
}

// TestCompactedCopies: records the cleaner removed count as delivered;
// copies appended again after a pg-restore-compacted restore of events
// committed before it are counted apart in the exactly_once checks, and
// no other duplicate is.
func TestCompactedCopies(t *testing.T) {
	t.Setenv(EnvDelivery, "exactly_once")
	f := newFixture(t)
	f.o.Compacted, f.o.CompactTopic = true, "p."+compactType
	top := f.o.CompactTopic
	// e1 and e2 are on the compacted topic; the cleaner removed e1.
	for i, c := range f.recs[:2] {
		c.Topic = top
		f.recs[i] = c
		f.copies[c.ID][0] = c
	}
	f.o.Kept = map[string][]copyRec{top: {f.recs[0], f.recs[1]}}
	final := append([]copyRec(nil), f.recs[1:]...)
	rep := &Report{}
	recs := f.o.withCompacted(rep, final)
	if rep.Compaction.Removed != 1 || len(recs) != 4 || !recs[0].Compacted || recs[0].ID != "e1" {
		t.Fatalf("removed %d, recs %+v", rep.Compaction.Removed, recs)
	}
	checkLoss(rep, f.events, map[string][]copyRec{"e1": {recs[0]}, "e2": {recs[1]}, "e3": {recs[2]}, "e4": {recs[3]}}, nil, f.fail)
	if rep.EventsLost != 0 {
		t.Fatalf("a compacted record counts as lost: %v", f.fails)
	}

	// The restore after e4; its runbook's read-back sends e2..e4 again.
	rewound := f.events[3].Committed.Add(100 * time.Millisecond)
	f.o.Faults = []faultRecord{{Kind: fPGRestoreCompacted, Start: rewound.Add(-time.Second), Rewound: rewound, End: rewound.Add(time.Second)}}
	for _, e := range f.events[1:] {
		f.addCopy(e, rewound.Add(2*time.Second), 7)
	}
	recs = append(recs, f.recs[4:]...)
	kept, copies := f.o.withoutReadBackCopies(rep, recs, f.copies, f.byID)
	f.o.checkExactlyOnce(rep, kept, copies, f.byID, nil, f.fail)
	if rep.Compaction.ReadBackDuplicates != 3 || rep.ExactlyOnce.Duplicates != 0 || rep.ExactlyOnce.OrderBreaks != 0 || len(f.fails) != 0 {
		t.Fatalf("read-back copies %d, eos %+v, fails %v", rep.Compaction.ReadBackDuplicates, rep.ExactlyOnce, f.fails)
	}
	// A copy sent again after the next fault began is a duplicate.
	f.o.Faults = append(f.o.Faults, faultRecord{Kind: fConnKill, Start: rewound.Add(1500 * time.Millisecond)})
	rep = &Report{Compaction: &compactionReport{}}
	kept, copies = f.o.withoutReadBackCopies(rep, recs, f.copies, f.byID)
	f.o.checkExactlyOnce(rep, kept, copies, f.byID, nil, f.fail)
	if rep.Compaction.ReadBackDuplicates != 0 || rep.ExactlyOnce.Duplicates != 3 {
		t.Fatalf("after the next fault: read-back copies %d, duplicates %d", rep.Compaction.ReadBackDuplicates, rep.ExactlyOnce.Duplicates)
	}
}
