package pipeline

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// proof is a position the run can prove is in the server's history: at or
// below at, by the history mark mark (replication/marks.go), decoded at at.
// mark 0 is a position proven only by the readings of the run's start (the
// slot's own position, or a legacy checkpoint): a reconnect then checks the
// WAL end only.
type proof struct {
	mark uint64
	at   lsn.LSN
	// commit is the commit time of the mark's transaction (zero when not
	// decoded): what lies past at committed after it (a read-back's floor).
	commit time.Time
}

// txnID tells a transaction apart from any other: its commit LSN, xid and
// commit time (PG docs 55.9, Begin). After a restore, the server writes new
// transactions at the same LSNs with the same xids, but never with the same
// commit time to the microsecond.
type txnID struct {
	final  lsn.LSN
	xid    uint32
	commit time.Time
}

// tailMax bounds the transactions remembered past the proof: marks are
// written every markInterval while positions wait for one, so the tail
// holds about that long of transactions; beyond the bound the oldest are
// forgotten, and a reconnect that decodes one again stops the run (behind).
const tailMax = 1 << 20

// history is the one owner of the run's proofs. The processor decodes marks
// (it alone writes proof and the tail); the stream's gate, the checkpoint
// and the transactional sink read proof; the mark loop writes marks while
// positions wait for a proof. Every saved position is at or below the
// proof, and so is the slot's confirmed one while a reconnect decodes again
// (confirmable): a restart, or a reconnect that resumes at the proof, never
// trusts a position the server may not have.
type history struct {
	marks *replication.Marks // nil: the server decodes no marks (PostgreSQL 13)
	proof atomic.Pointer[proof]
	moved chan struct{} // signalled (coalesced) when proof moves

	// fresh is the mark this run wrote before it streamed, with a position
	// below its commit: it proves every position up to there that the run
	// decodes (the stream's first session checked it), so the proof follows
	// the decoder through a backlog, which the marks written since, far
	// ahead at the WAL's end, do not reach until it is caught up.
	fresh proof

	// The processor's.
	pending uint64  // a mark decoded in the open transaction
	tail    []txnID // outbox transactions dispatched past proof.at, in commit order
	forgot  lsn.LSN // the tail's bound dropped transactions committing at or below it
	tailCap int     // tailMax; smaller in tests
	redo    lsn.LSN // after a reconnect: transactions committing below it were decoded before

	// redoing is set from a reconnect that resumed below what was decoded
	// until the processor passes it again: the positions acknowledged in
	// between are of the history streamed before, which the server reached
	// now may not have, so the slot is confirmed up to the proof only.
	redoing atomic.Bool

	mu sync.Mutex // serialises the marks' connection: the mark loop and flush
	// protect are the marks of the saved positions the run started from,
	// never pruned; pruned is when marks were last pruned (both under mu).
	protect []uint64
	pruned  time.Time
}

// markWriteTimeout bounds one mark's write: a partitioned server must not
// hold the mark loop, nor a clean stop's flush behind it.
const markWriteTimeout = 5 * time.Second

// write writes a mark (the mark loop's), and prunes old ones now and then.
func (h *history) write(ctx context.Context) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, markWriteTimeout)
	defer cancel()
	id, _, err := h.marks.Write(ctx)
	if err == nil && time.Since(h.pruned) >= markPrune {
		h.pruned = time.Now()
		err = h.marks.Prune(ctx, h.protect)
	}
	return id, err
}

// markPrune spaces the deletions of old marks.
const markPrune = time.Minute

// newHistory returns the run's history; marks is nil when the server
// decodes none or the run writes none (a standby without postgres.primary_dsn).
// Until start, nothing is proven.
func newHistory(marks *replication.Marks) *history {
	h := &history{marks: marks, moved: make(chan struct{}, 1), tailCap: tailMax}
	h.proof.Store(&proof{})
	return h
}

// start sets the proof of the run's start, which its start checks proved
// (decideStart).
func (h *history) start(p, fresh proof, protect ...uint64) {
	h.protect = protect
	if h.marks == nil {
		p = proof{at: lsn.LSN(^uint64(0))} // nothing to cap: the WAL-end checks alone
	}
	h.fresh = fresh
	h.proof.Store(&p)
}

// proven returns the current proof; without marks, nothing is capped.
func (h *history) proven() proof {
	if h == nil {
		return proof{at: lsn.LSN(^uint64(0))}
	}
	return *h.proof.Load()
}

// mark notes a history mark decoded in the open transaction.
func (h *history) mark(id uint64) {
	if h != nil {
		h.pending = id
	}
}

// committed closes a transaction ending at end: its mark becomes the proof
// (so does the fresh mark, up to its position), or, with outbox events
// published, it joins the tail a reconnect compares.
func (h *history) committed(id txnID, end lsn.LSN, published bool) {
	if h == nil || h.marks == nil {
		return
	}
	switch cur := h.proven(); {
	case h.pending != 0 && end > cur.at:
		h.prove(proof{mark: h.pending, at: end, commit: id.commit})
	case h.fresh.mark != 0 && min(end, h.fresh.at) > cur.at:
		h.prove(proof{mark: h.fresh.mark, at: min(end, h.fresh.at)})
	}
	h.pending = 0
	h.reached(end)
	if !published || end <= h.proven().at || id.final <= h.forgot {
		return
	}
	if len(h.tail) >= h.tailCap {
		h.forgot = max(h.forgot, h.tail[len(h.tail)/2-1].final)
		h.tail = slices.Delete(h.tail, 0, len(h.tail)/2)
	}
	// In commit order, also for one published again after a reconnect
	// (forgotten): the searches need it sorted.
	i, found := slices.BinarySearchFunc(h.tail, id.final, byFinal)
	if !found {
		h.tail = slices.Insert(h.tail, i, id)
	}
}

// reached notes that the processor decoded up to pos: past where a
// reconnect resumed below, everything is this server's again.
func (h *history) reached(pos lsn.LSN) {
	if h != nil && pos >= h.redo && h.redoing.Load() {
		h.redoing.Store(false)
	}
}

// confirmable caps what the stream confirms (acked): at the proof while
// the processor decodes again what it had decoded before a reconnect.
func (h *history) confirmable(acked lsn.LSN) lsn.LSN {
	if h != nil && h.redoing.Load() {
		return min(acked, h.proven().at)
	}
	return acked
}

// prove makes p the proof; the tail keeps what lies past it only.
func (h *history) prove(p proof) {
	h.proof.Store(&p)
	i, _ := slices.BinarySearchFunc(h.tail, p.at, byFinal)
	h.tail = slices.Delete(h.tail, 0, i)
	select {
	case h.moved <- struct{}{}:
	default:
	}
}

func byFinal(t txnID, at lsn.LSN) int { return cmp.Compare(t.final, at) }

// resume is where a reconnect resumes: the proof. Transactions between it
// and decoded are decoded again (redecoded).
func (h *history) resume(decoded lsn.LSN) replication.ResumeAt {
	if h == nil || h.marks == nil {
		return replication.ResumeAt{Pos: decoded}
	}
	h.pending = 0
	p := h.proven()
	if p.at >= decoded {
		return replication.ResumeAt{Pos: decoded, Mark: p.mark}
	}
	h.redo = max(h.redo, decoded)
	h.redoing.Store(true)
	return replication.ResumeAt{Pos: p.at, Mark: p.mark}
}

// again says what a transaction decoded after a reconnect is.
type again uint8

const (
	fresh     again = iota // past where the stream was: decoded for the first time
	published              // published before the reconnect: not again
	forgotten              // dropped from the tail by its bound: not known (the run stops)
	unknown                // below where the stream was, not published then: rows in it are a new history
)

// redecoded says what a transaction is after the last reconnect. One below
// redo that was not published then, and has rows now, is one of a new
// history: the server was restored under the connector to a point past
// the proof.
func (h *history) redecoded(id txnID) again {
	if h == nil || id.final >= h.redo {
		return fresh
	}
	if id.final <= h.forgot {
		return forgotten
	}
	i, ok := slices.BinarySearchFunc(h.tail, id.final, byFinal)
	if ok && h.tail[i].xid == id.xid && h.tail[i].commit.Equal(id.commit) {
		return published
	}
	return unknown
}

// behind is the error for a transaction decoded again after a reconnect
// that the tail's bound forgot: publishing it again would put it after
// newer events of its keys, skipping it could skip a new history's. The
// restart publishes everything past the checkpoint again, in order.
func behind(id txnID, forgot lsn.LSN) error {
	return &fault.FatalError{Reason: "reconnect_behind", Err: fmt.Errorf("after a reconnect the server sent again "+
		"a transaction (xid %d, commit %v) older than the %d the connector remembers past its proof (up to %v): "+
		"restarting from the checkpoint publishes what follows it again, in order", id.xid, id.final, tailMax, forgot)}
}

// diverged is the error for a row decoded again after a reconnect in a
// transaction the connector did not decode before: the server's history
// left the one streamed between the proof and the reconnect. A restart
// resumes from the restored slot and the proven checkpoint.
func diverged(id txnID, redo lsn.LSN) error {
	return &fault.FatalError{Reason: "server_rewound", Err: &fault.PrerequisiteError{
		Problem: fmt.Sprintf("after a reconnect the server sent a transaction (xid %d, commit %v) the connector did not decode "+
			"there before it reached %v: the server was restored from an older copy (or replaced by a server that was behind) "+
			"and wrote new transactions since", id.xid, id.final, redo),
		Fix: "restart the connector: it streams from the restored slot's position and a checkpoint the server's history has; " +
			"what was published from the lost WAL stays in Kafka (docs/operations.md, Restores)",
	}}
}

// markInterval spaces marks while acknowledged events wait for one: an
// event's position is confirmed about this long after its ack, and a crash
// repeats at most this much more than before. Positions that only
// keepalives moved wait idleMarkInterval: on an idle database each mark
// (and the checkpoint save after it) writes WAL a keepalive reports again.
const (
	markInterval     = 100 * time.Millisecond
	idleMarkInterval = 10 * time.Second
)

// markLoop writes a mark whenever acknowledged positions (acked) wait past
// the proof, at most every markInterval while events (a count of events
// acknowledged) move, else every idleMarkInterval, until ctx ends. A failed
// write is reported once per failure streak: positions then wait, and the
// slot retains WAL (outbox_cdc_replication_lag_bytes).
func (h *history) markLoop(ctx context.Context, acked func() lsn.LSN, events func() int64, fail func(error)) {
	if h == nil || h.marks == nil {
		return
	}
	t := time.NewTicker(markInterval)
	defer t.Stop()
	failing := false
	seen, last := events(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n := events()
			if acked() <= h.proven().at || (n == seen && now.Sub(last) < idleMarkInterval) {
				continue
			}
			_, err := h.write(ctx)
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				failing = true
				fail(err)
			case err == nil:
				failing, seen, last = false, n, now
			}
		}
	}
}

// finalMark writes the run's last mark once the side loops stopped (the
// mark loop among them: no prune follows it) and waits (at most d) until
// the processor decoded it, so that the stream's last confirmation lies past
// every write the connector made before it. It reports whether it did.
func (h *history) finalMark(ctx context.Context, d time.Duration) bool {
	if h == nil || h.marks == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	h.mu.Lock()
	id, _, err := h.marks.Write(ctx)
	h.mu.Unlock()
	if err != nil {
		return false
	}
	for h.proven().mark != id {
		select {
		case <-ctx.Done():
			return false
		case <-h.moved:
		}
	}
	return true
}
