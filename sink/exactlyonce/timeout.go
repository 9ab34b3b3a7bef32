package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// A Kafka transaction that stays open past the transaction timeout is
// aborted by its coordinator, which bumps the producer's epoch: the next
// produce or EndTxn of that transaction is refused with
// INVALID_PRODUCER_EPOCH (PRODUCER_FENCED, or TRANSACTION_ABORTABLE with
// transaction version 2), the answers a takeover by another instance gives
// too. An attempt that ran longer than the timeout, after which the
// position is still this instance's when a new producer id has claimed
// the id (claim), was the coordinator's abort, not a fence: it goes on,
// and the parts get smaller (split.go), so that a slow broker or a
// producer quota ends in smaller Kafka transactions, never in a loop of
// aborts or a false "fenced" exit. The limit grows back once commits are
// quick again.

// timedOut reports whether err, the last try's, ended an attempt (not the
// settle of an earlier one) that the coordinator aborted for its age
// (INVALID_TXN_STATE: the coordinator has no such transaction open any
// more).
func (t *Txn) timedOut(err error) bool {
	if !t.attempted {
		return false
	}
	if !errors.Is(err, kerr.InvalidProducerEpoch) && !errors.Is(err, kerr.ProducerFenced) &&
		!errors.Is(err, kerr.TransactionAbortable) && !errors.Is(err, kerr.InvalidTxnState) {
		return false
	}
	return time.Since(t.lastTry) >= t.cfg.TransactionTimeout
}

// afterTimeout goes on after an attempt the coordinator may have aborted
// for its age. The position decides, before anything fences anyone: one
// of another instance means it took the id over (fatal: the refusal was a
// fence); this attempt's number means its commit went through after all.
// A takeover commits its position within a fence check (its probe), so the
// position is read again after two when it is still this instance's. Only
// then a new client (its InitProducerId ends what is left of the
// transaction), smaller parts, and shrink (nil: none) applied to *b and
// *end. An unconfirmed commit stays until the position is read. Called
// with commitMu held.
func (t *Txn) afterTimeout(ctx context.Context, b *[]*entry, end *lsn.LSN, shrink shrinkFunc) (bool, error) {
	took, seq := time.Since(t.lastTry), t.txnSeq
	pos, err := t.takenOver(ctx, seq)
	if err != nil {
		return false, err
	}
	mine := pos.Txn == seq && pos.Instance == t.instance
	if u := t.unsure; u != nil {
		// Its commit was refused or lost; the position says which.
		t.unsure = nil
		if mine {
			t.settled(u.end, u.entries, u.q)
			return len(*b) == 0, nil
		}
		*b = append(u.entries, *b...)
	} else if mine {
		t.settled(*end, *b, t.lastQ)
		return true, nil
	}
	if _, err := t.claim(ctx); err != nil {
		return false, fmt.Errorf("after a transaction timeout: %w", err)
	}
	n := t.shrinkParts()
	if shrink != nil {
		*b, *end = shrink(*b, *end)
	}
	t.log.Warn("kafka transaction timed out: its coordinator aborted it after the transaction timeout; "+
		"its events go again, in smaller Kafka transactions",
		"took", took.Round(time.Millisecond), "transaction_timeout", t.cfg.TransactionTimeout, "events", len(*b), "part_events", n)
	return false, nil
}

// takenOver reads the position until it can tell a takeover (an error
// carrying the fence) from this instance's own: at once, and again after
// two fence checks.
func (t *Txn) takenOver(ctx context.Context, seq uint64) (Position, error) {
	var pos Position
	for i := range 2 {
		if i == 1 {
			select {
			case <-ctx.Done():
				return Position{}, ctx.Err()
			case <-time.After(2*t.cfg.FenceCheck + time.Second):
			}
		}
		var err error
		if pos, err = t.readPosition(ctx); err != nil {
			return Position{}, fmt.Errorf("after a transaction timeout: %w", err)
		}
		if t.another(pos) {
			return Position{}, fmt.Errorf("the last position (txn %d) was committed by another instance %q: %w",
				pos.Txn, pos.Instance, kerr.ProducerFenced)
		}
		if pos.Txn == seq {
			break
		}
	}
	return pos, nil
}

// another reports whether pos was committed by another instance since
// this one started: not this one's, and not the one it read at start (its
// predecessor's, before a restart). Records of versions before the instance
// name are none of them.
func (t *Txn) another(pos Position) bool {
	switch {
	case pos.Instance == "" || pos.Instance == t.instance:
		return false
	case pos.Instance == t.prior.Instance && pos.Txn == t.prior.Txn:
		return false
	}
	return true
}

// shrinkFunc makes what a Kafka transaction holds smaller after a timeout:
// the events to commit and their position's end.
type shrinkFunc func(b []*entry, end lsn.LSN) ([]*entry, lsn.LSN)

// shrinkBatch keeps the whole PostgreSQL transactions of b up to half its
// events (at least the first), gives the rest back to what waits, and ends
// the position at the last kept: whole transactions batched together get
// smaller after a timeout too. Called with commitMu held.
func (t *Txn) shrinkBatch(b []*entry, end lsn.LSN) ([]*entry, lsn.LSN) {
	cut := 0
	for i, e := range b[:len(b)-1] {
		if e.txnEnd == 0 {
			continue
		}
		if cut == 0 || i+1 <= len(b)/2 {
			cut = i + 1
		}
		if i+1 >= len(b)/2 {
			break
		}
	}
	if cut == 0 {
		return b, end
	}
	keep, back := b[:cut:cut], b[cut:]
	for _, e := range back {
		e.err, e.alone = nil, false
	}
	t.mu.Lock()
	t.batch = append(slices.Clone(back), t.batch...)
	t.mu.Unlock()
	t.gaveBack = true
	return keep, keep[cut-1].txnEnd
}

// partLimit is how many events of a transaction a part holds now.
func (t *Txn) partLimit() int {
	if n := int(t.partMax.Load()); n > 0 {
		return n
	}
	return t.cfg.MaxRecords
}

// shrinkParts halves the part limit and returns it.
func (t *Txn) shrinkParts() int {
	n := max(1, t.partLimit()/2)
	t.partMax.Store(int64(n))
	return n
}

// growParts doubles the part limit, up to MaxRecords, after a commit of
// events at least as many as a part that took less than an eighth of the
// timeout (a small one says nothing of a part's time).
func (t *Txn) growParts(events int, took time.Duration) {
	n := t.partLimit()
	if n >= t.cfg.MaxRecords || events < n || took >= t.cfg.TransactionTimeout/8 {
		return
	}
	t.partMax.Store(int64(min(t.cfg.MaxRecords, 2*n)))
}
