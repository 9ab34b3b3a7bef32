package retention

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// The retention model: generated histories of one database (transactions
// that begin, insert outbox rows and commit or abort, some left open for
// long; 32-bit xids that wrap), of the connector (an acknowledged position
// that follows the commits with a lag, stream sessions, a retainer that
// reconnects), of what operators and the world do (a promotion of a standby
// that was behind or a restore on the same timeline, both reusing xids; a
// slot lost and created again with its repair hold; a second slot on the
// database that lags; verify --repair), and retention rounds that take a
// reading, Decide, and delete what the SQL of replication/retention.go
// would. The oracle knows every row's commit position and who has it, and
// asserts that no row is deleted before its event is delivered to every
// consumer: the connector, and the other slot's.

type mrow struct {
	xid     uint64 // 64-bit; the table shows the low 32 bits
	commit  lsn.LSN
	lost    bool // committed while no slot streamed: only verify --repair delivers it
	deleted bool
}

type mtx struct {
	xid  uint64
	rows int
}

type mworld struct {
	r       *rand.Rand
	next    uint64 // the next xid
	wal     lsn.LSN
	running []mtx
	rows    []*mrow
	epoch   Epoch
	// the connector
	acked    lsn.LSN
	ckpt     lsn.LSN // the last saved position
	readings []Reading
	floors   []Reading // the readings a checkpoint floor is taken from (the guard's)
	hold     Hold
	slotLost bool // between the slot's loss and its creation again
	// the other consumer (a second slot): zero when none
	other    *Slot
	deletedN int
	// begins are where each xid was first written to the WAL: a server
	// whose history ends at a position assigns the xids after those again.
	begins []begun
	first  uint64 // the next xid when the model began
}

type begun struct {
	xid uint64
	at  lsn.LSN
}

// reading is what Retainer.Read returns now.
func (w *mworld) reading() Reading {
	x := w.next
	for _, t := range w.running {
		x = min(x, t.xid)
	}
	rd := Reading{WAL: w.wal, Xmin: x, Next: w.next, Epoch: w.epoch}
	if w.other != nil {
		rd.Slots = []Slot{*w.other}
	}
	return rd
}

func (w *mworld) begin() {
	w.wal++ // the first insert's record carries the xid
	w.running = append(w.running, mtx{xid: w.next, rows: 1 + w.r.IntN(3)})
	w.begins = append(w.begins, begun{w.next, w.wal})
	w.next++
}

// commit ends the i-th running transaction: committed rows are visible.
func (w *mworld) commit(i int, abort bool) {
	t := w.running[i]
	w.running = append(w.running[:i], w.running[i+1:]...)
	w.wal += lsn.LSN(1 + w.r.IntN(50))
	if abort {
		return
	}
	for range t.rows {
		w.rows = append(w.rows, &mrow{xid: t.xid, commit: w.wal, lost: w.slotLost})
	}
}

// delivered is the oracle: the connector acknowledged the row's commit (and
// it was streamed, or repaired), and the other consumer confirmed it.
func (w *mworld) delivered(r *mrow) bool {
	if r.lost || r.commit > w.acked {
		return false
	}
	return w.other == nil || r.commit <= w.other.Confirmed
}

// precedes32 is the SQL's xidPrecedes on the low 32 bits.
func precedes32(a, b uint64) bool {
	d := (uint32(b) - uint32(a))
	return d >= 1 && d <= 1<<31-1
}

// kept32 is the SQL's hold on the low 32 bits (replication/retention.go).
func kept32(x uint64, h Hold) bool {
	if !h.Set() {
		return false
	}
	if h.From == 0 {
		return precedes32(x, h.Below)
	}
	return uint32(x)-uint32(h.From) < uint32(h.Below-h.From)
}

// round is one retention round: a reading, the decision, the DELETE.
func (w *mworld) round(t *testing.T, seed uint64, step int) {
	w.readings = append(w.readings, w.reading())
	d, kept := Decide(w.readings, State{Owner: !w.slotLost, Session: w.epoch.Session, Acked: w.acked, Hold: w.hold, HoldRead: true})
	w.readings = kept
	if !d.Delete {
		return
	}
	for _, r := range w.rows {
		if r.deleted || !precedes32(r.xid, d.Below) || kept32(r.xid, d.Keep) {
			continue
		}
		if !w.delivered(r) {
			t.Fatalf("seed %d step %d: row of xid %d committed at %v deleted before delivery (acked %v, other %+v, lost %v, below %d, keep %+v)",
				seed, step, r.xid, r.commit, w.acked, w.other, r.lost, d.Below, d.Keep)
		}
		r.deleted = true
		w.deletedN++
	}
}

// ack moves the connector's acknowledged position to a recent commit.
func (w *mworld) ack() {
	if w.slotLost {
		return
	}
	w.acked = max(w.acked, w.wal-lsn.LSN(w.r.IntN(int(w.wal-w.acked)+1)))
	w.floors = append(w.floors, w.reading()) // the guard reads all along
	if len(w.floors) > 256 {
		w.floors = w.floors[len(w.floors)-256:]
	}
	if w.r.IntN(3) == 0 {
		w.ckpt = w.acked
	}
}

// floor is the checkpoint's xid floor: the newest guard reading at or
// below it (every transaction committing after it has an xid at or above).
func (w *mworld) floor(pos lsn.LSN) uint64 {
	var f uint64
	for _, r := range w.floors {
		if r.WAL <= pos {
			f = r.Xmin
		}
	}
	return f
}

// fork replaces the history by a prefix of it (a standby promoted behind,
// or a copy restored on the same timeline): later commits are gone, and
// their xids are assigned again. The connector's session proves the prefix
// holds its acknowledged position (the history marks), or it stops: the
// model then forks only at or past it.
func (w *mworld) fork(promote bool) {
	at := w.acked + lsn.LSN(w.r.IntN(int(w.wal-w.acked)+1))
	var keep []*mrow
	for _, r := range w.rows {
		if r.commit <= at {
			keep = append(keep, r)
		}
	}
	w.rows, w.running, w.wal = keep, nil, at
	// The new server assigns again every xid the prefix's WAL never showed.
	var shown []begun
	w.next = w.first
	for _, b := range w.begins {
		if b.at <= at {
			shown = append(shown, b)
			w.next = max(w.next, b.xid+1)
		}
	}
	w.begins = shown
	// The guard's readings of the old history go; the saved checkpoint's
	// floor stays, its position lies in the prefix.
	w.floors = []Reading{{WAL: w.ckpt, Xmin: w.floor(w.ckpt)}}
	if promote {
		w.epoch.Timeline++
	}
	w.epoch.Conn++
	w.epoch.Session++
	if w.other != nil && w.other.Confirmed > at {
		w.other.Confirmed = at
	}
}

// loseSlot: the slot is lost; the rows committed until it is created again
// are never streamed.
func (w *mworld) loseSlot() {
	w.slotLost = true
	w.epoch.Session++
}

// createSlot: the connector creates the slot again: its hold runs from the
// checkpoint's floor to the next xid of a reading taken after the creation:
// a transaction with an xid above that xmin may have committed before (the
// model found it), one with an xid at or past Next began after.
func (w *mworld) createSlot() {
	w.slotLost = false
	for w.r.IntN(2) == 0 && len(w.running) > 0 { // the creation waits for some of them
		w.commit(0, false)
	}
	w.hold = w.hold.Merge(Hold{From: w.floor(w.ckpt), Below: w.reading().Next})
	w.acked = max(w.acked, w.wal)
	w.epoch.Session++
}

// repair is verify --repair: every held row is republished and delivered.
func (w *mworld) repair() {
	for _, r := range w.rows {
		if !r.deleted && r.lost && kept32(r.xid, w.hold) {
			r.lost = false
		}
	}
	for _, r := range w.rows {
		if !r.deleted && r.lost { // a lost row outside the hold: the model is wrong
			return
		}
	}
	w.hold = Hold{}
}

func runModel(t *testing.T, seed uint64, steps int) int {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	w := &mworld{r: r, next: 1<<32 - 300 + uint64(r.IntN(600)), wal: 0x1000, epoch: Epoch{SystemID: "1", Timeline: 1, Conn: 1, Session: 1}}
	w.acked, w.ckpt, w.first = w.wal, w.wal, w.next
	for step := range steps {
		switch k := r.IntN(100); {
		case k < 30:
			w.begin()
		case k < 55 && len(w.running) > 0:
			// Mostly the newest commit first; the oldest stays open long.
			i := len(w.running) - 1 - r.IntN(min(len(w.running), 3))
			w.commit(i, r.IntN(8) == 0)
		case k < 70:
			w.ack()
		case k < 85:
			w.round(t, seed, step)
		case k < 87:
			w.epoch.Conn++ // the retainer reconnects to the same server
		case k < 88:
			w.fork(r.IntN(2) == 0)
		case k < 89 && !w.slotLost:
			w.loseSlot()
		case k < 93 && w.slotLost:
			w.createSlot()
		case k < 94 && w.hold.Set():
			w.repair()
		case k < 96 && w.other == nil:
			w.other = &Slot{Name: "other", Confirmed: w.wal}
		case k < 99 && w.other != nil:
			if w.other.Confirmed < w.acked { // it follows the same commits, later
				w.other.Confirmed += lsn.LSN(r.IntN(int(w.acked-w.other.Confirmed) + 1))
			}
		case w.other != nil:
			w.other = nil // dropped
		}
	}
	return w.deletedN
}

// TestRetentionModel runs thousands of generated histories (make check runs
// the short count); each asserts that no row is deleted before delivery.
func TestRetentionModel(t *testing.T) {
	n, steps := 20000, 400
	if testing.Short() {
		n = 4000
	}
	deleted := 0
	for seed := range uint64(n) {
		deleted += runModel(t, seed, steps)
	}
	if deleted < n { // the model must exercise deletion, not only refusals
		t.Fatalf("only %d rows deleted in %d histories: the model deletes too little to prove anything", deleted, n)
	}
	t.Log(fmt.Sprintf("%d histories, %d rows deleted, none before delivery", n, deleted))
}
