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
		{"empty transactions behind an unacknowledged one wait for it", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "begin", txn: 1}, {kind: "commit", txn: 1, pos: 30, want: 10},
			{kind: "begin", txn: 2}, {kind: "commit", txn: 2, pos: 40, want: 10},
			{kind: "ack", txn: 0, want: 40},
		}},
		{"empty transactions between two unacknowledged ones", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "begin", txn: 1}, {kind: "commit", txn: 1, pos: 30},
			{kind: "begin", txn: 2}, {kind: "add", txn: 2}, {kind: "commit", txn: 2, pos: 40},
			{kind: "begin", txn: 3}, {kind: "commit", txn: 3, pos: 50, want: 10},
			{kind: "ack", txn: 2, want: 10}, {kind: "ack", txn: 0, want: 50},
		}},
		{"empty transactions stop at the next unacknowledged one", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "begin", txn: 1}, {kind: "commit", txn: 1, pos: 30},
			{kind: "begin", txn: 2}, {kind: "add", txn: 2}, {kind: "commit", txn: 2, pos: 40},
			{kind: "ack", txn: 0, want: 30}, {kind: "ack", txn: 2, want: 40},
		}},
		{"transaction acked before its commit counts as empty", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "begin", txn: 1}, {kind: "add", txn: 1}, {kind: "ack", txn: 1}, {kind: "commit", txn: 1, pos: 30, want: 10},
			{kind: "ack", txn: 0, want: 30},
		}},
		{"keepalive waits for empty transactions queued behind events", []op{
			{kind: "begin", txn: 0}, {kind: "add", txn: 0}, {kind: "commit", txn: 0, pos: 20},
			{kind: "begin", txn: 1}, {kind: "commit", txn: 1, pos: 30},
			{kind: "idle", pos: 50, want: 10}, {kind: "ack", txn: 0, want: 30}, {kind: "idle", pos: 50, want: 50},
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
		txn := func(n int) {
			x := tr.Begin()
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
		for i := 0; i < 200; i++ {
			// Runs of empty transactions (other tables, other message
			// prefixes) queue behind the unacknowledged ones.
			if rng.IntN(8) == 0 {
				for k := rng.IntN(3000); k > 0; k-- {
					txn(0)
				}
			}
			txn(rng.IntN(4))
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

// TestTrackerInterleavedModel runs a random mix of transactions (mostly
// empty), acks in random order, stalls of single events, keepalives and
// aborts against a model, and checks after every step that the watermark is
// the model's and that the queue stays bounded by the transactions with an
// event in flight, not by the transactions committed.
func TestTrackerInterleavedModel(t *testing.T) {
	type mtxn struct {
		x            *Txn
		end          lsn.LSN
		events       int // still to Add before Commit
		added, acked int
		aborted      bool
	}
	maxLive := 0
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		tr := NewTracker(1)
		var (
			committed  []*mtxn // in commit order
			done       int     // committed[:done] are fully acknowledged
			open       *mtxn
			inflight   []*mtxn // one entry per unacknowledged event
			stuck      []*mtxn // events held back (a broker partition down)
			incomplete int     // committed transactions with an event unacknowledged
			peak       int     // highest incomplete so far
			pos        = lsn.LSN(1)
			want       = lsn.LSN(1)
		)
		ack := func(m *mtxn) {
			tr.Ack(m.x)
			m.acked++
			if !m.aborted && m.end != 0 && m.acked == m.added {
				incomplete--
			}
		}
		for step := 0; step < 100_000; step++ {
			switch r := rng.IntN(100); {
			case r < 60: // the processor
				switch {
				case open == nil:
					open = &mtxn{x: tr.Begin()}
					if rng.IntN(10) < 3 {
						open.events = 1 + rng.IntN(3)
					}
				case open.events > 0:
					tr.Add(open.x)
					open.events--
					open.added++
					if rng.IntN(2000) == 0 {
						stuck = append(stuck, open)
					} else {
						inflight = append(inflight, open)
					}
				case rng.IntN(500) == 0: // stream lost before the commit
					tr.Abort(open.x)
					open.aborted = true
					open = nil
				default:
					pos += lsn.LSN(1 + rng.IntN(100))
					tr.Commit(open.x, pos)
					open.end = pos
					if open.acked < open.added {
						incomplete++
						peak = max(peak, incomplete)
					}
					committed = append(committed, open)
					open = nil
				}
			case r < 99: // an acknowledgement, in any order
				if len(inflight) > 0 {
					i := rng.IntN(len(inflight))
					m := inflight[i]
					inflight[i] = inflight[len(inflight)-1]
					inflight = inflight[:len(inflight)-1]
					ack(m)
				}
				if rng.IntN(3000) == 0 { // the partition is back
					for _, m := range stuck {
						ack(m)
					}
					stuck = stuck[:0]
				}
			default: // a keepalive at the server's sent position
				if open == nil {
					pos += lsn.LSN(rng.IntN(10))
					tr.Idle(pos)
					if done == len(committed) {
						want = max(want, pos)
					}
				}
			}
			for done < len(committed) && committed[done].acked == committed[done].added {
				want = max(want, committed[done].end)
				done++
			}
			if got := tr.Acked(); got != want {
				t.Fatalf("seed %d step %d: watermark %v, want %v", seed, step, got, want)
			}
			live := len(tr.queue) - tr.head
			if bound := max(minFold, 2*peak); live > bound {
				t.Fatalf("seed %d step %d: %d transactions queued, want at most %d (%d with events in flight at most)",
					seed, step, live, bound, peak)
			}
			maxLive = max(maxLive, live)
		}
	}
	if maxLive < minFold/2 {
		t.Fatalf("the queue never held more than %d transactions: the stalls are too short to test folding", maxLive)
	}
}

// TestTrackerQueueBounded pins the queue length while one event stays
// unacknowledged and up to a million transactions commit behind it.
func TestTrackerQueueBounded(t *testing.T) {
	tests := []struct {
		name   string
		n      int  // transactions behind the blocked one
		events int  // in each
		ackNow bool // acknowledged right after the commit (another partition)
		limit  int  // queued transactions allowed
	}{
		{"empty transactions", 1_000_000, 0, false, 1},
		{"acknowledged transactions", 300_000, 1, true, 2 * minFold},
		{"acknowledged before their commit", 300_000, 2, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker(1)
			head := tr.Begin()
			tr.Add(head)
			tr.Commit(head, 10)
			pos := lsn.LSN(10)
			maxLive := 0
			for i := 0; i < tt.n; i++ {
				x := tr.Begin()
				for j := 0; j < tt.events; j++ {
					tr.Add(x)
					if !tt.ackNow {
						tr.Ack(x)
					}
				}
				pos += 7
				tr.Commit(x, pos)
				if tt.ackNow {
					for j := 0; j < tt.events; j++ {
						tr.Ack(x)
					}
				}
				maxLive = max(maxLive, len(tr.queue)-tr.head)
			}
			if maxLive > tt.limit {
				t.Fatalf("%d transactions queued behind the unacknowledged one, want at most %d", maxLive, tt.limit)
			}
			if tr.Acked() != 1 {
				t.Fatalf("watermark %v passed the unacknowledged transaction", tr.Acked())
			}
			tr.Ack(head)
			if tr.Acked() != pos || len(tr.queue) != 0 {
				t.Fatalf("after the last ack: watermark %v, %d queued; want %v and 0", tr.Acked(), len(tr.queue), pos)
			}
		})
	}
}

// TestTrackerEmptyTransactionAllocs: an empty transaction costs no
// allocation, whether it lands on the watermark or behind a blocked one.
func TestTrackerEmptyTransactionAllocs(t *testing.T) {
	for _, blocked := range []bool{false, true} {
		tr := NewTracker(1)
		if blocked {
			x := tr.Begin()
			tr.Add(x)
			tr.Commit(x, 5)
		}
		pos := lsn.LSN(10)
		allocs := testing.AllocsPerRun(10_000, func() {
			pos++
			tr.Commit(tr.Begin(), pos)
		})
		if allocs != 0 {
			t.Errorf("blocked=%v: %v allocations per empty transaction, want 0", blocked, allocs)
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

// BenchmarkTrackerEmptyTxn is an empty transaction behind an unacknowledged
// one: the shape of other-table traffic while the broker is down.
func BenchmarkTrackerEmptyTxn(b *testing.B) {
	tr := NewTracker(1)
	head := tr.Begin()
	tr.Add(head)
	tr.Commit(head, 2)
	b.ReportAllocs()
	pos := lsn.LSN(2)
	for b.Loop() {
		pos += 100
		tr.Commit(tr.Begin(), pos)
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

// TestTrackerAbortForgetsInFlight: an aborted transaction's records leave
// InFlight at the abort. In exactly_once the aborted Kafka transaction
// reports its records as failed, never acknowledged; in at_least_once their
// late acknowledgements change nothing. Found by review: the in-flight count
// stayed up for good after a Reset inside a transaction (exactly_once).
func TestTrackerAbortForgetsInFlight(t *testing.T) {
	tr := NewTracker(0x100)
	x := tr.Begin()
	tr.Add(x)
	tr.Add(x)
	tr.Ack(x)
	tr.Abort(x)
	if n := tr.InFlight(); n != 0 {
		t.Fatalf("in flight %d after the abort, want 0", n)
	}
	tr.Ack(x) // a late outcome of the aborted transaction
	if n := tr.InFlight(); n != 0 {
		t.Fatalf("in flight %d after a late ack, want 0", n)
	}
	y := tr.Begin()
	tr.Add(y)
	tr.Commit(y, 0x200)
	tr.Ack(y)
	if n, a := tr.InFlight(), tr.Acked(); n != 0 || a != 0x200 {
		t.Fatalf("in flight %d, acked %v; want 0 and 0/200", n, a)
	}
}
