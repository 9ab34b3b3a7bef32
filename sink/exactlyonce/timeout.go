package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// A Kafka transaction that stays open past the transaction timeout is
// aborted by its coordinator, which bumps the producer's epoch: the next
// produce or EndTxn of that transaction is refused with
// INVALID_PRODUCER_EPOCH (PRODUCER_FENCED, or TRANSACTION_ABORTABLE with
// transaction version 2), the answers a takeover by another instance gives
// too. An attempt that ran longer than the timeout while this instance
// still streams from the slot (another takes the id over only once the slot
// is free) was the coordinator's abort, not a fence: a new producer id goes
// on, and the parts get smaller (split.go), so that a slow broker or a
// producer quota ends in smaller Kafka transactions, never in a loop of
// aborts or a false "fenced" exit. The limit grows back once commits are
// quick again.

// timedOut reports whether err ended an attempt that the coordinator
// aborted for its age (INVALID_TXN_STATE: the coordinator has no such
// transaction open any more).
func (t *Txn) timedOut(err error) bool {
	if !errors.Is(err, kerr.InvalidProducerEpoch) && !errors.Is(err, kerr.ProducerFenced) &&
		!errors.Is(err, kerr.TransactionAbortable) && !errors.Is(err, kerr.InvalidTxnState) {
		return false
	}
	if time.Since(t.lastTry) < t.cfg.TransactionTimeout {
		return false
	}
	return t.cfg.Owner == nil || t.cfg.Owner()
}

// afterTimeout goes on after an attempt the coordinator aborted: a new
// client (its InitProducerId ends whatever is left of the transaction),
// then the position, which tells whether the commit went through after all
// (its number), else smaller parts and shrink (nil: none) applied to *b.
// Called with commitMu held.
func (t *Txn) afterTimeout(ctx context.Context, b *[]*entry, end lsn.LSN, shrink func([]*entry) []*entry) (bool, error) {
	took := time.Since(t.lastTry)
	if u := t.unsure; u != nil {
		// Its commit was refused, not lost: the position says which.
		*b, t.unsure = append(u.entries, *b...), nil
	}
	if err := t.renewClient(); err != nil {
		return false, fmt.Errorf("after a transaction timeout: %w", err)
	}
	pos, err := t.readPosition(ctx)
	if err != nil {
		return false, fmt.Errorf("after a transaction timeout: %w", err)
	}
	if pos.Instance == t.instance && pos.Txn == t.txnSeq {
		t.committed.Store(uint64(end))
		t.noteCommitted(*b)
		t.delivered(*b)
		return true, nil
	}
	n := t.shrinkParts()
	if shrink != nil {
		*b = shrink(*b)
	}
	t.log.Warn("kafka transaction timed out: its coordinator aborted it after the transaction timeout; "+
		"its events go again, and transactions too large are committed in smaller parts",
		"took", took.Round(time.Millisecond), "transaction_timeout", t.cfg.TransactionTimeout, "events", len(*b), "part_events", n)
	return false, nil
}

// renewClient replaces the transactional client with a new one: its
// InitProducerId ends whatever transaction the id has open. Called with
// commitMu held.
func (t *Txn) renewClient() error {
	cl, err := t.newClient()
	if err != nil {
		return err
	}
	if t.cl != t.base {
		t.cl.Close()
	}
	t.cl, t.aborting = cl, false
	return nil
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
