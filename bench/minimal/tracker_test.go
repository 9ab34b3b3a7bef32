package minimal

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// deadline ends the test binary if a test hangs (a lock held, a channel
// never closed): the logic here has no reason to take a second.
func deadline(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.AfterFunc(d, func() { panic(fmt.Sprintf("%s: still running after %v", t.Name(), d)) })
	t.Cleanup(func() { timer.Stop() })
}

// step is one call on the tracker: begin (txn i), produce a record of txn i,
// ack (or fail) record r of txn i, commit txn i at end.
type step struct {
	op      string // "begin", "produce", "ack", "fail", "commit"
	txn     int
	end     pglogrepl.LSN
	want    pglogrepl.LSN // Confirmable after the step
	events  int64         // Events after the step
	wantErr bool
}

func TestTrackerScenarios(t *testing.T) {
	deadline(t, 5*time.Second)
	cases := []struct {
		name  string
		steps []step
	}{{
		name: "one transaction: confirmable after commit and every ack",
		steps: []step{
			{op: "begin", txn: 0}, {op: "produce", txn: 0}, {op: "produce", txn: 0},
			{op: "ack", txn: 0}, {op: "commit", txn: 0, end: 100},
			{op: "ack", txn: 0, want: 100, events: 2},
		},
	}, {
		name: "acks before the commit: confirmable at the commit",
		steps: []step{
			{op: "begin", txn: 0}, {op: "produce", txn: 0}, {op: "ack", txn: 0},
			{op: "commit", txn: 0, end: 100, want: 100, events: 1},
		},
	}, {
		name: "a later transaction acked first waits for the earlier one",
		steps: []step{
			{op: "begin", txn: 0}, {op: "produce", txn: 0}, {op: "commit", txn: 0, end: 100},
			{op: "begin", txn: 1}, {op: "produce", txn: 1}, {op: "commit", txn: 1, end: 200},
			{op: "ack", txn: 1},
			{op: "ack", txn: 0, want: 200, events: 2},
		},
	}, {
		name: "empty transactions pass at once, but not over an open one",
		steps: []step{
			{op: "begin", txn: 0}, {op: "commit", txn: 0, end: 50, want: 50},
			{op: "begin", txn: 1, want: 50}, {op: "produce", txn: 1, want: 50},
			{op: "begin", txn: 2, want: 50}, {op: "commit", txn: 2, end: 300, want: 50},
			{op: "commit", txn: 1, end: 200, want: 50},
			{op: "ack", txn: 1, want: 300, events: 1},
		},
	}, {
		name: "an open transaction holds the position even when acked",
		steps: []step{
			{op: "begin", txn: 0}, {op: "produce", txn: 0}, {op: "ack", txn: 0},
			{op: "begin", txn: 1}, {op: "produce", txn: 1}, {op: "ack", txn: 1},
			{op: "commit", txn: 1, end: 200}, // out of order only in this test; the position still waits for 0
			{op: "commit", txn: 0, end: 100, want: 200, events: 2},
		},
	}, {
		name: "a failed record stops the position before its transaction for good",
		steps: []step{
			{op: "begin", txn: 0}, {op: "produce", txn: 0}, {op: "ack", txn: 0}, {op: "commit", txn: 0, end: 100, want: 100, events: 1},
			{op: "begin", txn: 1, want: 100, events: 1}, {op: "produce", txn: 1, want: 100, events: 1},
			{op: "produce", txn: 1, want: 100, events: 1}, {op: "commit", txn: 1, end: 200, want: 100, events: 1},
			{op: "fail", txn: 1, want: 100, events: 1, wantErr: true},
			{op: "ack", txn: 1, want: 100, events: 1, wantErr: true},
			{op: "begin", txn: 2, want: 100, events: 1, wantErr: true},
			{op: "commit", txn: 2, end: 300, want: 100, events: 1, wantErr: true},
		},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := NewTracker(0)
			txns := map[int]*Txn{}
			for i, s := range c.steps {
				switch s.op {
				case "begin":
					txns[s.txn] = tr.Begin()
				case "produce":
					tr.Produced(txns[s.txn])
				case "ack":
					tr.Acked(txns[s.txn], nil)
				case "fail":
					tr.Acked(txns[s.txn], errors.New("broker said no"))
				case "commit":
					tr.Commit(txns[s.txn], s.end)
				}
				got, err := tr.Confirmable()
				if got != s.want || (err != nil) != s.wantErr || tr.Events() != s.events {
					t.Fatalf("step %d (%s txn %d): confirmable %s, err %v, events %d; want %s, err %v, events %d",
						i, s.op, s.txn, got, err, tr.Events(), s.want, s.wantErr, s.events)
				}
			}
		})
	}
}

func TestTrackerGoal(t *testing.T) {
	deadline(t, 5*time.Second)
	tr := NewTracker(3)
	reached := func() bool {
		select {
		case <-tr.Reached():
			return true
		default:
			return false
		}
	}
	for i := range 3 {
		x := tr.Begin()
		tr.Produced(x)
		tr.Commit(x, pglogrepl.LSN(100*(i+1)))
		if reached() {
			t.Fatalf("goal reached after %d unacknowledged events", i+1)
		}
		tr.Acked(x, nil)
		if got := reached(); got != (i == 2) {
			t.Fatalf("after %d events: reached %v", i+1, got)
		}
	}
	x := tr.Begin() // past the goal: closing again must not panic
	tr.Commit(x, 400)
	if lsn, _ := tr.Confirmable(); lsn != 400 {
		t.Fatalf("confirmable %s, want 0/190", lsn)
	}
}

// TestTrackerModel drives the tracker with random histories (transactions
// of 0 to 4 records, acknowledgements in any order across transactions) and
// checks it against an oracle after every step: the position is the end of
// the longest committed, fully acknowledged prefix, and never goes back.
func TestTrackerModel(t *testing.T) {
	deadline(t, 10*time.Second)
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 39))
		tr := NewTracker(0)
		type model struct {
			x         *Txn
			records   int // produced
			acked     int
			committed bool
			end       pglogrepl.LSN
		}
		var txns []*model
		var unacked []int // one entry per produced, unacknowledged record: its txn
		var open *model
		var last pglogrepl.LSN
		for range 200 {
			switch r := rng.IntN(10); {
			case open == nil && r < 3:
				open = &model{x: tr.Begin()}
				txns = append(txns, open)
			case open != nil && r < 4 && open.records < 4:
				tr.Produced(open.x)
				open.records++
				unacked = append(unacked, len(txns)-1)
			case open != nil && r < 5:
				open.end = pglogrepl.LSN(100 * len(txns))
				tr.Commit(open.x, open.end)
				open.committed, open = true, nil
			case len(unacked) > 0:
				i := rng.IntN(len(unacked))
				m := txns[unacked[i]]
				unacked = append(unacked[:i], unacked[i+1:]...)
				tr.Acked(m.x, nil)
				m.acked++
			}
			var want pglogrepl.LSN
			for _, m := range txns {
				if !m.committed || m.acked < m.records {
					break
				}
				want = m.end
			}
			got, err := tr.Confirmable()
			if err != nil || got != want || got < last {
				t.Fatalf("seed %d: confirmable %s (err %v), oracle %s, previous %s", seed, got, err, want, last)
			}
			last = got
		}
	}
}
