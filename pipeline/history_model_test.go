package pipeline

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/offsets"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// The history model: generated histories of one PostgreSQL server (writes,
// marks, checkpoints in its table, backups, restores of a copy on the same
// timeline, promotions of a standby that was behind) and of one connector
// (runs that stream part of the WAL, confirm, save, commit to Kafka,
// reconnect, crash), with an oracle that knows the server's true history.
// The connector is decideStart, history (resume, redecoded, committed) and
// PostgreSQL's streaming rule (START_REPLICATION sends the transactions
// that commit past the greater of the slot's position and the start). The
// oracle asserts that every transaction with outbox rows in the server's
// final history was delivered.

// mtxn is one transaction of the model's WAL.
type mtxn struct {
	end    lsn.LSN
	id     int    // unique across every history
	rows   bool   // has outbox rows
	mark   uint64 // a history mark, or 0
	ckpt   *offsets.Checkpoint
	commit time.Time
	xid    uint32
}

// mserver is the server: its WAL (the true history), the slot's confirmed
// position and its next xid.
type mserver struct {
	wal  []mtxn
	slot lsn.LSN
	xid  uint32
}

func (s *mserver) end() lsn.LSN {
	if len(s.wal) == 0 {
		return 0x100
	}
	return s.wal[len(s.wal)-1].end
}

func (s *mserver) copy() *mserver {
	c := *s
	c.wal = slices.Clone(s.wal)
	return &c
}

func (s *mserver) hasMark(id uint64) bool {
	return slices.ContainsFunc(s.wal, func(t mtxn) bool { return t.mark == id })
}

// tableCheckpoint is the checkpoint row the server's table holds.
func (s *mserver) tableCheckpoint() (offsets.Checkpoint, bool) {
	for i := len(s.wal) - 1; i >= 0; i-- {
		if c := s.wal[i].ckpt; c != nil {
			return *c, true
		}
	}
	return offsets.Checkpoint{}, false
}

// model is one generated history.
type model struct {
	rng       *rand.Rand
	srv       *mserver
	backups   []*mserver
	fileStore bool // the checkpoint lives outside the server
	eos       bool // exactly_once: the position committed to Kafka
	file      *offsets.Checkpoint
	committed *offsets.Checkpoint // the Kafka position (LSN, Mark, MarkAt)
	delivered map[int]bool
	nextID    int
	incarn    int // the server's incarnation: a restore ends every connection
	clock     time.Time
	log       []string
}

func (m *model) write(n int) {
	for range n {
		m.nextID++
		m.srv.xid++
		m.clock = m.clock.Add(time.Microsecond * time.Duration(1+m.rng.IntN(50)))
		m.srv.wal = append(m.srv.wal, mtxn{end: m.srv.end() + lsn.LSN(8*(1+m.rng.IntN(4))), id: m.nextID,
			rows: m.rng.IntN(10) < 7, commit: m.clock, xid: m.srv.xid})
	}
}

func (m *model) addMark() uint64 {
	id := m.rng.Uint64N(1<<62) + 1
	m.write(1)
	t := &m.srv.wal[len(m.srv.wal)-1]
	t.rows, t.mark = false, id
	m.log = append(m.log, fmt.Sprintf("mark %d at %v", id, t.end))
	return id
}

// mrun is one connector process.
type mrun struct {
	h       *history
	pos     lsn.LSN // the stream's position: what it asks PostgreSQL for
	skip    lsn.LSN
	decoded lsn.LSN
	rb      bool // exactly_once's read-back is on
	incarn  int  // the server incarnation its connection reached
}

// start runs decideStart on the readings; it returns nil when refused.
func (m *model) start() (*mrun, error) {
	r := startReadings{slot: m.srv.slot}
	var ck offsets.Checkpoint
	var have bool
	if m.fileStore && m.file != nil {
		ck, have = *m.file, true
	} else if !m.fileStore {
		ck, have = m.srv.tableCheckpoint()
	}
	if have {
		if ck.LSN > m.srv.end() && ck.Mark == 0 {
			return nil, errors.New("beyond the WAL end") // CheckPosition, for unmarked ones
		}
		r.ckpt, r.ckptMark = ck.LSN, markReading{id: ck.Mark, at: ck.MarkAt, found: m.srv.hasMark(ck.Mark)}
	}
	if m.eos && m.committed != nil {
		r.committed = m.committed.LSN
		r.committedMark = markReading{id: m.committed.Mark, at: m.committed.MarkAt, found: m.srv.hasMark(m.committed.Mark)}
	}
	below := m.srv.end()
	r.fresh = markReading{id: m.addMark(), at: below, found: true} // marks.Prepare
	st, err := decideStart(r)
	if err != nil {
		return nil, err
	}
	m.log = append(m.log, fmt.Sprintf("start %+v -> %+v (WAL end %v)", r, st, m.srv.end()))
	h := newHistory(&replication.Marks{})
	h.start(st.proof, proof{mark: r.fresh.id, at: r.fresh.at})
	return &mrun{h: h, pos: st.stream, skip: st.skip, decoded: st.stream, rb: st.readBack, incarn: m.incarn}, nil
}

// stream sends the run the transactions PostgreSQL would, up to n of them;
// it returns an error when the run stops (a divergence).
func (m *model) stream(r *mrun, n int) error {
	from := max(r.pos, m.srv.slot)
	for _, t := range m.srv.wal {
		if t.end <= from || n == 0 {
			continue
		}
		n--
		id := txnID{final: t.end - 1, xid: t.xid, commit: t.commit}
		a := r.h.redecoded(id)
		skip := t.end-1 < r.skip || a == published
		if a == unknown && t.rows {
			m.log = append(m.log, fmt.Sprintf("diverged at %d@%v", t.id, t.end))
			return diverged(id, r.h.redo)
		}
		if r.rb && t.rows && m.delivered[t.id] && !skip {
			skip = true // found in Kafka: the read-back holds it
		} else if r.rb && t.rows {
			r.rb = false // the first not found ends the read-back
		}
		if t.mark != 0 {
			r.h.mark(t.mark)
		}
		if t.rows && !skip {
			m.delivered[t.id] = true
			m.log = append(m.log, fmt.Sprintf("deliver %d@%v", t.id, t.end))
		} else if t.rows {
			m.log = append(m.log, fmt.Sprintf("skip %d@%v", t.id, t.end))
		}
		r.h.committed(id, t.end, t.rows && !skip)
		r.decoded = max(r.decoded, t.end)
		if m.eos && t.rows && !skip {
			pr := r.h.proven()
			m.committed = &offsets.Checkpoint{LSN: t.end, Mark: pr.mark, MarkAt: pr.at}
		}
	}
	return nil
}

// save confirms the slot at what was delivered (the slot is the server's
// own: a restore brings back its older state) and saves the checkpoint at
// the proven position.
func (m *model) save(r *mrun) {
	pr := r.h.proven()
	m.srv.slot = max(m.srv.slot, r.h.confirmable(r.decoded))
	a := min(r.decoded, pr.at)
	c := offsets.Checkpoint{LSN: a}
	if pr.mark != 0 && pr.at >= a {
		c.Mark, c.MarkAt = pr.mark, pr.at
	}
	if m.fileStore {
		if m.file == nil || m.file.LSN <= a {
			m.file = &c
		}
		return
	}
	m.write(1)
	m.srv.wal[len(m.srv.wal)-1].rows = false
	m.srv.wal[len(m.srv.wal)-1].ckpt = &c
}

// reconnect is the stream's reconnect: resume at the history's proof,
// refused (false) when the server lacks the mark or its WAL ends before.
func (m *model) reconnect(r *mrun) bool {
	at := r.h.resume(r.decoded)
	if at.Mark != 0 && !m.srv.hasMark(at.Mark) || m.srv.end() < at.Pos {
		return false
	}
	r.pos, r.incarn = at.Pos, m.incarn
	m.log = append(m.log, fmt.Sprintf("reconnect at %+v, decoded %v", at, r.decoded))
	return true
}

// restore replaces the server: a copy from a backup, or a standby that
// replayed only a prefix (its slot no further than that).
func (m *model) restore() {
	m.incarn++
	if len(m.backups) > 0 && m.rng.IntN(2) == 0 {
		m.srv = m.backups[m.rng.IntN(len(m.backups))].copy()
		m.log = append(m.log, fmt.Sprintf("restore a copy, WAL end %v", m.srv.end()))
		return
	}
	if len(m.srv.wal) == 0 {
		return
	}
	cut := m.rng.IntN(len(m.srv.wal))
	m.srv.wal = m.srv.wal[:cut]
	m.srv.slot = min(m.srv.slot, m.srv.end())
	m.srv.xid = 0 // xids are handed out again
	if cut > 0 {
		m.srv.xid = m.srv.wal[cut-1].xid
	}
	m.log = append(m.log, fmt.Sprintf("promote a standby behind, WAL end %v", m.srv.end()))
}

// step runs one random operation; r is the running connector or nil.
func (m *model) step(r *mrun) *mrun {
	if r != nil && r.incarn != m.incarn && !m.reconnect(r) {
		return nil // the connection to the old incarnation is gone
	}
	switch k := m.rng.IntN(10); {
	case k < 3:
		m.write(m.rng.IntN(6))
	case k == 3 && r != nil:
		m.addMark()
	case k == 4:
		m.backups = append(m.backups, m.srv.copy())
	case k == 5 && m.rng.IntN(3) == 0:
		m.restore()
		m.write([]int{0, 1, 4, 30}[m.rng.IntN(4)]) // the application, at once
	case k == 6 && r != nil:
		m.save(r)
	case k == 7 && r != nil:
		if !m.reconnect(r) || m.stream(r, m.rng.IntN(8)) != nil {
			return nil // the run stops; a restart decides again
		}
	case k == 8:
		return nil // a crash (or a clean stop)
	default:
		if r == nil {
			return nil
		}
		if m.stream(r, m.rng.IntN(8)) != nil {
			return nil
		}
	}
	return r
}

// runHistory plays one history and returns the transactions lost.
func runHistory(seed uint64) (lost []int, m *model) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	m = &model{rng: rng, srv: &mserver{}, fileStore: rng.IntN(2) == 0, eos: rng.IntN(2) == 0,
		delivered: map[int]bool{}, clock: time.Unix(1_700_000_000, 0)}
	var r *mrun
	for range 60 {
		if r == nil {
			r = m.startOrFix()
		}
		r = m.step(r)
	}
	// The end: marks written and decoded, streamed to the WAL end.
	for range 4 {
		if r = m.startOrFix(); r == nil {
			continue
		}
		m.addMark()
		if m.stream(r, 1<<30) == nil {
			break
		}
	}
	for _, t := range m.srv.wal {
		if t.rows && !m.delivered[t.id] {
			lost = append(lost, t.id)
		}
	}
	return lost, m
}

// startOrFix starts a run; a refusal is applied as its fix says (the saved
// position forgotten), and it must stay refused until then.
func (m *model) startOrFix() *mrun {
	r, err := m.start()
	if err == nil {
		return r
	}
	m.log = append(m.log, "refused: "+err.Error())
	m.write(m.rng.IntN(40)) // the WAL moves on: the refusal stays
	if _, again := m.start(); again == nil {
		panic("a refusal passed once the WAL moved: " + err.Error())
	}
	m.file, m.committed = nil, nil
	if !m.fileStore {
		m.write(1)
		m.srv.wal[len(m.srv.wal)-1].rows = false
		m.srv.wal[len(m.srv.wal)-1].ckpt = &offsets.Checkpoint{} // the row deleted
	}
	r, err = m.start()
	if err != nil {
		panic("refused after the fix: " + err.Error())
	}
	return r
}

// TestHistoryModel: in thousands of generated histories no transaction with
// outbox rows in the server's final history is left undelivered, and a
// refusal stays until it is acted on.
func TestHistoryModel(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 3000
	}
	for seed := range uint64(n) {
		lost, m := runHistory(seed)
		if len(lost) > 0 {
			var wal []string
			for _, t := range m.srv.wal {
				wal = append(wal, fmt.Sprintf("%d@%v rows=%v mark=%v", t.id, t.end, t.rows, t.mark != 0))
			}
			t.Fatalf("seed %d (file store %v, exactly_once %v): %d transactions never delivered (%v)\n%s\nWAL: %v",
				seed, m.fileStore, m.eos, len(lost), lost, strings.Join(m.log, "\n"), wal)
		}
	}
}
