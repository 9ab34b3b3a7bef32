package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
)

// A PostgreSQL transaction of more events than MaxRecords is not kept whole:
// its events are cut into parts of MaxRecords, each committed in a Kafka
// transaction of its own with the position, so memory and every Kafka
// transaction stay bounded whatever the PostgreSQL transaction's size. The
// position's LSN stays at the end of the last whole transaction (what a
// restart streams from, and what the gap's rules compare); its Part says how
// many of the next transaction's events are committed. The stream sends that
// transaction again, whole, after a restart or a reconnect, in the same
// order (the WAL's), and the producer passes over the committed ones: the
// last of them is checked against a fingerprint, so a transaction that
// decodes to other events stops the run instead of losing or repeating any.
// The last part is never empty (a part is cut once an event more waits), so
// its events say "last" to consumers (wire.HeaderTxnPart).

// TxnID names a PostgreSQL transaction: its xid and the LSN of its commit
// record (BEGIN's final LSN), unique within the server's history.
type TxnID struct {
	Final lsn.LSN
	Xid   uint32
}

func (id TxnID) String() string {
	return strconv.FormatUint(uint64(id.Xid), 10) + "@" + id.Final.String()
}

// Part is a position record's note that the first Events events of the
// PostgreSQL transaction Final/Xid are committed, in Parts Kafka
// transactions; Last is the fingerprint of the last of them.
type Part struct {
	Final  lsn.LSN `json:"final"`
	Xid    uint32  `json:"xid"`
	Events int     `json:"events"`
	Parts  int     `json:"parts"`
	Last   uint64  `json:"last"`
}

func (p *Part) id() TxnID { return TxnID{Final: p.Final, Xid: p.Xid} }

// splitMark is shared by the events of one part: which transaction, which
// part, whether it is the last, and for a part before the last how many
// events of the transaction it completes and the fingerprint of its last.
type splitMark struct {
	id     TxnID
	part   int
	last   bool
	events int
	fp     uint64
}

// partOf is the Part a Kafka transaction whose events end with b's last
// records: nil when it ends a PostgreSQL transaction.
func partOf(b []*entry) *Part {
	if len(b) == 0 {
		return nil
	}
	m := b[len(b)-1].sp
	if m == nil || m.last {
		return nil
	}
	return &Part{Final: m.id.Final, Xid: m.id.Xid, Events: m.events, Parts: m.part, Last: m.fp}
}

// split is the hand-over's state of the open PostgreSQL transaction. Only
// the caller of BeginTxn, Produce, EndTxn and AbortTxn (the processor)
// touches it.
type split struct {
	id      TxnID
	allowed bool
	whole   bool // KeepWhole: no more parts, whatever Allow says
	index   int  // events of the transaction decoded so far: handed over, passed over, held back
	parts   int  // parts cut
	bytes   int  // of the events waiting in open
	// skip events are committed already (resume); skipFP is the last's.
	skip   int
	skipFP uint64
	// committed is how many of its events are committed, and fp the
	// fingerprint of the last of them: what a reconnect passes over.
	committed int
	fp        uint64
	// resume is what Start read, or a reconnect left: the transaction it
	// names passes over its committed events when it begins again. Read
	// at start, the stream must send that transaction again (it starts
	// below it); a reconnect's can be ended by a freeze instead.
	resume  *Part
	started bool
}

// BeginTxn tells the producer which PostgreSQL transaction the events
// handed over until EndTxn or AbortTxn belong to. allowed says whether it
// may be split (the pipeline keeps a transaction whole while a gap repair,
// or a read-back of what Kafka holds, depends on it). One split before is
// passed over up to what is committed; events a read-back holds back
// count too (HeldBack), so the two never skip more than that together.
func (t *Txn) BeginTxn(id TxnID, allowed bool) {
	s := &t.split
	r, started := s.resume, s.started
	*s = split{id: id, allowed: allowed, resume: r, started: started}
	switch {
	case r == nil:
	case r.id() == id:
		s.skip, s.skipFP, s.parts = r.Events, r.Last, r.Parts
		s.committed, s.fp = r.Events, r.Last
		s.started = false // decoded again, as it must be
	case id.Final > r.Final && !started:
		s.resume = nil
	case id.Final > r.Final:
		t.failSplit(fmt.Sprintf("the PostgreSQL transaction %v, of which %d events are committed to Kafka in %d parts, "+
			"was not decoded again: the stream is past it at %v", r.id(), r.Events, r.Parts, id))
	}
}

// PartFloor is the position a part committed now would carry.
func (t *Txn) PartFloor() lsn.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.partFloorLocked()
}

// partFloorLocked is PartFloor, with mu held: the end of the last whole
// transaction handed over, else the position committed, else the run's
// start.
func (t *Txn) partFloorLocked() lsn.LSN {
	return max(t.end, lsn.LSN(t.committed.Load()), lsn.LSN(t.floor.Load()))
}

// KeepWhole keeps the rest of the open transaction in one Kafka
// transaction (a gap repair's rows join it).
func (t *Txn) KeepWhole() { t.split.allowed, t.split.whole = false, true }

// Allow lets the open transaction be split from here on (a read-back of
// what Kafka holds ended inside it), unless KeepWhole said otherwise.
func (t *Txn) Allow() { t.split.allowed = !t.split.whole }

// HeldBack counts an event of the open transaction that is not handed over
// because Kafka holds it already (the read-back): the positions of parts
// count the transaction's decoded events, so that a restart without a
// read-back passes over the same ones.
func (t *Txn) HeldBack() { t.split.index++ }

// Resumes reports whether id is a transaction of which some events were
// committed before (a part) and the rest not yet.
func (t *Txn) Resumes(id TxnID) bool {
	r := t.split.resume
	return r != nil && r.id() == id
}

// Resuming reports whether a transaction committed in part (before the
// start, or before a reconnect) is yet to be decoded again: nothing may be
// published before it (a gap repair would read its rows).
func (t *Txn) Resuming() bool { return t.split.resume != nil }

// passOver reports whether rec, the next event of the open transaction, was
// committed before; the last such is checked against its fingerprint.
func (t *Txn) passOver(rec *router.Record) (bool, error) {
	s := &t.split
	i := s.index
	s.index++
	if i >= s.skip {
		return false, nil
	}
	if i == s.skip-1 && fingerprint(rec.Topic, rec.Key, rec.Value) != s.skipFP {
		return true, t.failSplit(fmt.Sprintf("the PostgreSQL transaction %v decodes to other events than the %d committed "+
			"to Kafka before: event %d differs (topic %s)", s.id, s.skip, s.skip, rec.Topic))
	}
	return true, nil
}

// errSplit: a split transaction does not come back as it was committed.
var errSplit = errors.New("split transaction")

// failSplit stops the run: passing over the wrong events would lose some,
// publishing them all would repeat some.
func (t *Txn) failSplit(problem string) error {
	err := &fault.PrerequisiteError{Problem: problem,
		Fix: "the outbox's rows, the routing configuration or the slot changed since; compare the topic with the table " +
			"(outbox-cdc verify), then forget the position with a tombstone for its key in " + t.cfg.Positions +
			" and start again (docs/operations.md, Exactly-once delivery)"}
	// Fatal for the producer too: no try commits anything it holds (a
	// position past the transaction) from now on.
	e := fmt.Errorf("%w: %w", errSplit, err)
	if t.splitErr.CompareAndSwap(nil, &e) && t.cfg.Fail != nil {
		t.cfg.Fail(e)
	}
	return err
}

// broken is failSplit's error, or nil.
func (t *Txn) broken() error {
	if e := t.splitErr.Load(); e != nil {
		return *e
	}
	return nil
}

// SetFloor tells the producer where the run starts: every transaction
// committing below pos is delivered (the slot's, or the position's), and
// not decoded again. A part committed before any whole transaction of the
// run carries at least it; a transaction committed in part below it was
// delivered since (an at_least_once run, a slot made again): nothing to
// pass over. Called before the stream starts.
func (t *Txn) SetFloor(pos lsn.LSN) {
	t.floor.Store(uint64(pos))
	if r := t.split.resume; r != nil && r.Final < pos {
		t.log.Info("kafka: the transaction committed in part lies below where the run starts; nothing of it is passed over",
			"txn", r.id(), "events_committed", r.Events, "start", pos)
		t.split.resume, t.split.started = nil, false
	}
}

// NoSnapshot tells the producer that the run takes no snapshot: a
// snapshot committed in part (a pseudo-transaction, Xid 0; PostgreSQL's
// transaction ids start at 3) by a run that died is never published again
// (snapshot.mode none after it), so nothing of it is passed over. Called
// before the stream starts.
func (t *Txn) NoSnapshot() {
	if r := t.split.resume; r != nil && r.Xid == 0 {
		t.log.Warn("kafka: an interrupted snapshot was committed in part; this run takes none, so the rest of it is not published",
			"events_committed", r.Events, "consistent_point", r.Final)
		t.split.resume, t.split.started = nil, false
	}
}

// due reports whether the open transaction has a part to cut: an event
// more than MaxRecords waits (or more than the buffered bytes), it may be
// split, no gap repair holds the Kafka transaction, and a position exists to
// commit with the part (position 0 means none, and would start a
// read-back).
func (t *Txn) due() bool {
	s := &t.split
	if !s.allowed || t.hold != 0 || len(t.open) < 2 {
		return false
	}
	if len(t.open) <= t.partLimit() && int64(s.bytes) <= t.partBytes() {
		return false
	}
	return t.end != 0 || t.committed.Load() != 0 || t.floor.Load() != 0
}

// partBytes bounds a part's bytes: kafka.max_buffered_bytes, or 32 MiB.
func (t *Txn) partBytes() int64 {
	if n := t.cfg.Sink.MaxBufferedBytes; n > 0 {
		return n
	}
	return 32 << 20
}

// cut makes every event waiting in open but the newest a part, joins it to
// what waits and commits it, until ctx or the producer ends. Called with mu
// held; it releases it.
func (t *Txn) cut(ctx context.Context) {
	s := &t.split
	n := len(t.open) - 1
	part, rest := t.open[:n:n], []*entry{t.open[n]}
	s.parts++
	m := &splitMark{id: s.id, part: s.parts, events: part[n-1].idx + 1, fp: part[n-1].fingerprint()}
	for _, e := range part {
		e.sp = m
	}
	t.open, s.bytes = rest, rest[0].rec.Size()
	waiting := len(t.batch) > 0
	t.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.ctx, cancel)()
	if waiting {
		// Whole transactions commit apart from a part: a position with a
		// part then moves nothing else (the hang check relies on it).
		_ = t.commit(ctx)
	}
	t.mu.Lock()
	if len(t.batch) == 0 {
		t.since = time.Now()
	}
	t.batch = append(t.batch, part...)
	t.mu.Unlock()
	_ = t.commitShrinking(ctx, t.uncut) // outcomes went to the events' Done; given back, what waits carries its marks
	// What committed of it, whole part or half (uncut after a timeout).
	if p := t.lastCommitted(); p != nil && p.id() == s.id && p.Events > s.committed {
		s.committed, s.fp = p.Events, p.Last
	}
}

// uncut gives the newer half of the part that ends b back to the open
// transaction, after a transaction timeout: the rest of the part is
// committed alone, and the half given back goes in the next part. Called
// from cut's commit, on the caller's goroutine (t.split is its).
func (t *Txn) uncut(b []*entry, end lsn.LSN) ([]*entry, lsn.LSN) {
	n := len(b)
	if n == 0 {
		return b, end
	}
	m := b[n-1].sp
	if m == nil || m.last || m.id != t.split.id {
		return t.shrinkBatch(b, end)
	}
	i := n
	for i > 0 && b[i-1].sp == m {
		i--
	}
	k := (n - i) / 2
	if k == 0 {
		return b, end
	}
	keep, back := b[:n-k], slices.Clone(b[n-k:])
	last := keep[len(keep)-1]
	kept := &splitMark{id: m.id, part: m.part, events: last.idx + 1, fp: last.fingerprint()}
	for _, e := range b[i : n-k] {
		e.sp = kept
	}
	t.mu.Lock()
	for _, e := range back {
		e.sp, e.err, e.alone, e.suspect = nil, nil, false, false
		t.split.bytes += e.rec.Size()
	}
	t.open = append(back, t.open...)
	t.mu.Unlock()
	return keep, end
}

// lastCommitted is the Part of the last position committed.
func (t *Txn) lastCommitted() *Part {
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	return t.lastPart
}

// endSplit marks the rest of a split transaction its last part, and
// forgets the transaction: events handed over without a BeginTxn (the
// snapshot's, a repair's alone) are never split. What to pass over is kept
// until its transaction ends.
func (t *Txn) endSplit() {
	s := &t.split
	if s.parts > 0 && len(t.open) > 0 {
		m := &splitMark{id: s.id, part: s.parts + 1, last: true}
		for _, e := range t.open {
			e.sp = m
		}
	}
	r, started := s.resume, s.started
	if r != nil && r.id() == s.id {
		r, started = nil, false // passed over, and ended
	}
	*s = split{resume: r, started: started}
}

// abortSplit keeps what a reconnect must pass over, the events of the open
// transaction committed so far, and forgets the rest.
func (t *Txn) abortSplit() {
	s := &t.split
	r, started := s.resume, s.started
	if s.committed > 0 {
		r = &Part{Final: s.id.Final, Xid: s.id.Xid, Events: s.committed, Parts: s.parts, Last: s.fp}
	}
	*s = split{resume: r, started: started}
}

// fingerprint identifies an event across runs: its topic, key and value as
// the router made them (a dead letter is made later, from the same).
func fingerprint(topic string, key, value []byte) uint64 {
	h := fnv.New64a()
	for _, b := range [][]byte{[]byte(topic), key, value} {
		h.Write(strconv.AppendInt(nil, int64(len(b)), 10))
		h.Write(b)
	}
	return h.Sum64()
}

// fingerprint is e's, as the router made it.
func (e *entry) fingerprint() uint64 { return fingerprint(e.topic, e.key, e.value) }

// withPart adds the split transaction's headers to rec, a copy of e's record
// for one attempt.
func withPart(rec *kgo.Record, e *entry) {
	m := e.sp
	if m == nil {
		return
	}
	part := strconv.Itoa(m.part)
	if m.last {
		part += "/" + part
	}
	rec.Headers = append(slices.Clip(rec.Headers),
		kgo.RecordHeader{Key: wire.HeaderTxn, Value: []byte(m.id.String())},
		kgo.RecordHeader{Key: wire.HeaderTxnPart, Value: []byte(part)})
}
