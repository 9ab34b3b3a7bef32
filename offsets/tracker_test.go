package offsets

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// op is one step of a scripted scenario.
type op struct {
	kind string // begin, add, commit, ack, abort, idle
	txn  int    // index of the transaction in begin order
	pos  lsn.LSN
	want lsn.LSN // watermark expected after the step
}

func TestTrackerScenarios(t *testing.T) {
	tests := []struct {
		name string
		ops  []op
	}{
		{"empty transaction confirms at commit", []op{
			{kind: "begin", txn: 0, want: 10}, {kind: "commit", txn: 0, pos: 20, want: 20},
		}},
		{"commit before ack holds the watermark", []op{
			{kind: "begin", txn: 0, want: 10}, {kind: "add", txn: 0, want: 10},
			{kind: "commit", txn: 0, pos: 20, want: 10}, {kind: "ack", txn: 0, want: 20},
		}},
		{"ack before commit still waits for commit", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "ack", txn: 0, want: 10},
			{kind: "commit", txn: 0, pos: 20, want: 20},
		}},
		{"later transaction acked first does not pass the earlier one", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20, want: 10},
			{kind: "begin", txn: 1}, {kind: "add", txn: 1}, {kind: "add", txn: 1}, {kind: "commit", txn: 1, pos: 30, want: 10},
			{kind: "ack", txn: 1, want: 10}, {kind: "ack", txn: 1, want: 10},
			{kind: "ack", txn: 0, want: 30},
		}},
		{"partially acked transaction holds", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "ack", txn: 0, want: 10}, {kind: "ack", txn: 0, want: 20},
		}},
		{"keepalive ignored while in flight", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "idle", pos: 50, want: 10}, {kind: "ack", txn: 0, want: 20}, {kind: "idle", pos: 50, want: 50},
		}},
		{"keepalive ignored while a transaction is open", []op{
			{kind: "begin", txn: 0}, {kind: "idle", pos: 50, want: 10}, {kind: "commit", txn: 0, pos: 60, want: 60},
		}},
		{"keepalive never moves backwards", []op{
			{kind: "idle", pos: 5, want: 10}, {kind: "idle", pos: 15, want: 15},
		}},
		{"aborted open transaction is forgotten", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "abort", txn: 0, want: 10},
			{kind: "begin", txn: 1}, {kind: "add", txn: 1}, {kind: "commit", txn: 1, pos: 30},
			{kind: "ack", txn: 0, want: 10}, // the lost copy's ack means nothing
			{kind: "ack", txn: 1, want: 30},
		}},
		{"open transaction does not hold earlier commits", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "begin", txn: 1}, {kind: "add", txn: 1},
			{kind: "ack", txn: 0, want: 20},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(10)
			var txns []*Txn
			for i, o := range tt.ops {
				switch o.kind {
				case "begin":
					txns = append(txns, tr.Begin())
				case "add":
					tr.Add(txns[o.txn])
				case "commit":
					tr.Commit(txns[o.txn], o.pos)
				case "ack":
					tr.Ack(txns[o.txn])
				case "abort":
					tr.Abort(txns[o.txn])
				case "idle":
					tr.Idle(o.pos)
				}
				if o.want != 0 && tr.Acked() != o.want {
					t.Fatalf("step %d (%s txn %d): watermark %v, want %v", i, o.kind, o.txn, tr.Acked(), o.want)
				}
			}
		})
	}
}

// TestTrackerRandomOrder checks the invariant against a model: with acks
// arriving in random order from many goroutines, the watermark never passes
// a transaction with an unacknowledged event, and ends at the last commit.
func TestTrackerRandomOrder(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed))
		tr := NewTracker(1)
		type ev struct{ txn int }
		var (
			txns   []*Txn
			ends   []lsn.LSN
			events []ev
			acked  []int
			total  []int
		)
		pos := lsn.LSN(1)
		for i := 0; i < 200; i++ {
			x := tr.Begin()
			n := rng.IntN(4)
			for j := 0; j < n; j++ {
				tr.Add(x)
				events = append(events, ev{len(txns)})
			}
			pos += lsn.LSN(1 + rng.IntN(100))
			tr.Commit(x, pos)
			txns = append(txns, x)
			ends = append(ends, pos)
			acked = append(acked, 0)
			total = append(total, n)
		}
		rng.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })

		// Acks from several goroutines; after each batch check the invariant.
		var mu sync.Mutex
		for start := 0; start < len(events); start += 37 {
			batch := events[start:min(start+37, len(events))]
			var wg sync.WaitGroup
			for _, e := range batch {
				wg.Go(func() {
					tr.Ack(txns[e.txn])
					mu.Lock()
					acked[e.txn]++
					mu.Unlock()
				})
			}
			wg.Wait()
			w := tr.Acked()
			// The watermark must equal the end of the longest fully acked prefix.
			want := lsn.LSN(1)
			for i := range txns {
				if acked[i] != total[i] {
					break
				}
				want = ends[i]
			}
			if w != want {
				t.Fatalf("seed %d after %d acks: watermark %v, want %v", seed, start+len(batch), w, want)
			}
		}
		if tr.Acked() != pos || tr.InFlight() != 0 {
			t.Fatalf("seed %d: final watermark %v inflight %d, want %v and 0", seed, tr.Acked(), tr.InFlight(), pos)
		}
	}
}

func TestTrackerSignalsAdvance(t *testing.T) {
	tr := NewTracker(1)
	x := tr.Begin()
	tr.Add(x)
	tr.Commit(x, 5)
	select {
	case <-tr.Advanced():
		t.Fatal("signalled before the ack")
	default:
	}
	tr.Ack(x)
	select {
	case <-tr.Advanced():
	default:
		t.Fatal("no signal after the watermark moved")
	}
}

func BenchmarkTrackerEvent(b *testing.B) {
	tr := NewTracker(1)
	b.ReportAllocs()
	pos := lsn.LSN(1)
	for i := 0; i < b.N; i += 10 {
		x := tr.Begin()
		for j := 0; j < 10; j++ {
			tr.Add(x)
		}
		pos += 100
		tr.Commit(x, pos)
		for j := 0; j < 10; j++ {
			tr.Ack(x)
		}
	}
}
