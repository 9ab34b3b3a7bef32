package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// The outcome of an attempt: committed, refused, or not known (settled
// before anything is produced again), and the abort that ends a refused one.

// unconfirmed is an attempt whose commit was not confirmed: its number,
// its position and the events it carried, which are in no batch until it
// is settled.
type unconfirmed struct {
	txn     uint64
	end     lsn.LSN
	entries []*entry
	q       *quarantines // what it did to the quarantined set
}

// try learns the outcome of an unconfirmed commit (wasCommitted) and ends
// an abort left pending first,
// then makes one attempt at *b. It reports whether all of *b is committed;
// the outcomes of committed events are delivered, and they leave *b. The
// events of an unconfirmed commit that did not commit go first in *b.
func (t *Txn) try(ctx context.Context, b *[]*entry, end lsn.LSN) (bool, error) {
	t.attempted = false
	if err := t.broken(); err != nil {
		t.fatal = err // reported by failSplit already
		return false, err
	}
	if t.claimDue {
		if _, err := t.claim(ctx); err != nil {
			return false, err
		}
	}
	if u := t.unsure; u != nil {
		committed, err := t.wasCommitted(ctx, u.txn)
		if err != nil {
			return false, err
		}
		t.unsure = nil
		if committed {
			t.settled(u.end, u.entries, u.q)
			if len(*b) == 0 {
				return true, nil
			}
		} else {
			*b = append(u.entries, *b...)
		}
	}
	if t.aborting {
		if err := t.endAbort(ctx); err != nil {
			return false, err
		}
	}
	t.lastTry, t.attempted = time.Now(), true
	err := t.attempt(ctx, *b, end)
	switch {
	case err == nil:
		t.settled(end, *b, t.lastQ)
		return true, nil
	case errors.Is(err, errUnconfirmed):
		t.unsure = &unconfirmed{txn: t.txnSeq, end: end, entries: *b, q: t.lastQ}
		*b = nil
	}
	return false, err
}

// settled takes in a committed Kafka transaction: its position end, its
// events b, what it did to the quarantined set (qs). Called with commitMu
// held, before anything is routed again.
func (t *Txn) settled(end lsn.LSN, b []*entry, qs *quarantines) {
	t.committed.Store(uint64(end))
	t.noteCommitted(b)
	t.settle(qs)
	t.delivered(b)
}

// noteCommitted keeps the Part of the position b's Kafka transaction
// committed; one without events (the probe) committed the last one again.
// Called with commitMu held.
func (t *Txn) noteCommitted(b []*entry) {
	if len(b) > 0 {
		t.lastPart = partOf(b)
	}
}

func (t *Txn) delivered(b []*entry) {
	for _, e := range b {
		e.done.Delivered(sink.Outcome{DeadLettered: e.rec.DeadLettered(), Reason: e.rec.Reason(), Parked: e.parked != nil})
	}
}

// wasCommitted learns whether the commit of transaction number txn, which
// the client could not confirm, happened. franz-go's documented answer to it is
// EndTransaction(TryAbort), which reloads the producer id: once the client
// holds an id again, the epoch was bumped, which aborted that transaction
// had it still been open. It is then committed or aborted for good, and the
// committed position record says which: only this transactional id commits
// this source's positions, each with a number above every earlier one.
func (t *Txn) wasCommitted(ctx context.Context, txn uint64) (bool, error) {
	cl := t.cl
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		return false, fmt.Errorf("settle an unconfirmed commit: %w", err)
	}
	t.noteCoordinator(ctx) // the reload below erases its outcome there
	err := cl.EndTransaction(ctx, kgo.TryAbort)
	if err == nil {
		_, _, err = cl.ProducerID(ctx)
	}
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return t.settleFenced(ctx, txn, err)
	}
	if errors.Is(err, kerr.InvalidTxnState) {
		// The coordinator has no transaction open for the client (it
		// ended it: a timeout), and franz-go cannot leave the one it
		// thinks it is in; a new client's InitProducerId settles it.
		pos, err := t.claim(ctx)
		if err != nil {
			return false, fmt.Errorf("settle an unconfirmed commit: %w", err)
		}
		return t.learned(txn, pos), nil
	}
	if err != nil {
		return false, fmt.Errorf("settle an unconfirmed commit: %w", err)
	}
	pos, err := t.readPosition(ctx)
	if err != nil {
		return false, fmt.Errorf("settle an unconfirmed commit: %w", err)
	}
	if t.another(pos) {
		// The reload succeeded, so the id was this client's again, but
		// another instance committed before: it took the id over.
		return false, fmt.Errorf("settle an unconfirmed commit: the last position (txn %d) was committed by another instance %q: %w",
			pos.Txn, pos.Instance, kerr.ProducerFenced)
	}
	return t.learned(txn, pos), nil
}

// learned reports, and logs, whether the position says transaction txn
// committed.
func (t *Txn) learned(txn uint64, pos Position) bool {
	committed := pos.Txn >= txn
	t.log.Warn("kafka: learned the outcome of a commit that was not confirmed", "txn", txn, "committed", committed)
	return committed
}

// settleFenced answers a fence met while settling the commit of
// transaction txn. franz-go settles by reloading the producer id at the
// client's epoch (KIP-360), but when the commit completed on the broker,
// completing it bumped the epoch (KIP-890: every transaction ends with an
// epoch bump), so the broker refuses the reload as from a fenced producer
// although no other instance exists; a coordinator's abort (a broker
// restart ends a transaction in doubt) bumps it too. An instance that took
// the id over commits its position within FenceCheck, so after two of
// them a position of another instance, or past txn, is a real fence.
// Otherwise claim decides: committed when the position has txn's number,
// aborted when it is older; a new transactional client carries on.
func (t *Txn) settleFenced(ctx context.Context, txn uint64, fenced error) (bool, error) {
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-time.After(2*t.cfg.FenceCheck + time.Second):
	}
	pos, err := t.readPosition(ctx)
	if errors.Is(err, errHanging) {
		return false, fmt.Errorf("settle an unconfirmed commit: %w", err) // not a fence: its own message
	}
	if err != nil {
		return false, fmt.Errorf("settle an unconfirmed commit: %w", errors.Join(fenced, err))
	}
	if pos.Instance != t.instance || pos.Txn > txn {
		return false, fmt.Errorf("settle an unconfirmed commit: %w", fenced)
	}
	if pos, err = t.claim(ctx); err != nil {
		return false, fmt.Errorf("settle an unconfirmed commit: %w", err)
	}
	if pos.Txn < txn {
		t.log.Warn("kafka: the broker refused the settle of a commit its coordinator aborted (its epoch moved past the client's); "+
			"the transaction is produced again by a new transactional client", "txn", txn, "transactional_id", t.txnID, "err", fenced)
		return false, nil
	}
	t.log.Warn("kafka: the broker refused the settle of a commit it had completed (its epoch moved past the client's); "+
		"the commit is acknowledged and a new transactional client carries on", "txn", txn, "transactional_id", t.txnID, "err", fenced)
	return true, nil
}

// claim takes the transactional id with a new client and proves that no
// other instance committed before it did: the new client's InitProducerId
// bumps the epoch, so whoever else holds the id cannot commit after it,
// and the position read after it must not be another instance's. It does
// not ask whether this instance streams from the slot: a fault that cut
// Kafka often cuts PostgreSQL too, and the stream's reconnect waits for
// the processor, which waits for this settle. A takeover that committed
// nothing yet is fenced by the claim and stops; nothing of it was visible.
// The new client replaces the old one only once the check passed; until
// then (an error: claimDue) every try claims again first, since a client
// that initialized its producer id lazily would fence unchecked (Start
// initializes the first one eagerly too). Called with commitMu held.
func (t *Txn) claim(ctx context.Context) (Position, error) {
	t.claimDue = true
	cl, err := t.newClient()
	if err != nil {
		return Position{}, err
	}
	pos, err := t.claimWith(ctx, cl)
	if err != nil {
		cl.Close()
		return Position{}, err
	}
	if t.cl != t.base {
		t.cl.Close()
	}
	t.cl, t.aborting, t.claimDue = cl, false, false
	return pos, nil
}

// claimWith is claim's check with the new client cl.
func (t *Txn) claimWith(ctx context.Context, cl *kgo.Client) (Position, error) {
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return Position{}, fmt.Errorf("claim the transactional id: %w", err)
	}
	pos, err := t.readPosition(ctx)
	if err != nil {
		return Position{}, fmt.Errorf("claim the transactional id: %w", err)
	}
	if t.another(pos) {
		return Position{}, fmt.Errorf("the last position (txn %d) was committed by another instance %q: %w",
			pos.Txn, pos.Instance, kerr.ProducerFenced)
	}
	return pos, nil
}

// endAbort retries an abort that failed without an answer.
func (t *Txn) endAbort(ctx context.Context) error {
	if err := t.cl.AbortBufferedRecords(ctx); err != nil {
		return fmt.Errorf("abort transaction: %w", err)
	}
	if err := t.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return fmt.Errorf("abort transaction: %w", err)
	}
	t.aborting = false
	return nil
}

// errUnconfirmed: EndTransaction(TryCommit) failed, and the transaction may
// have committed.
var errUnconfirmed = errors.New("commit not confirmed")

// unconfirmedEnd: every commit error but a refusal before anything was sent
// (franz-go's OperationNotAttempted, a topic recreated in the transaction)
// leaves the outcome unknown. A transport error or UNKNOWN_SERVER_ERROR
// says nothing, and franz-go retries EndTxn itself, so a retriable error
// (COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, …) may answer a retry of
// a first try that committed. Settling costs a read of the positions topic;
// guessing wrong costs a duplicate.
func unconfirmedEnd(err error) bool {
	return !errors.Is(err, kerr.OperationNotAttempted) && !errors.Is(err, kerr.UnknownTopicID)
}

// abort ends the transaction without committing it and returns cause (or
// the abort's own error when that one is fatal).
func (t *Txn) abort(ctx context.Context, cause error) error {
	cl := t.cl
	// Records not sent yet must not join the next transaction.
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		return errors.Join(cause, err)
	}
	switch err := cl.EndTransaction(ctx, kgo.TryAbort); {
	case err == nil:
	case kafka.IsFatalTxn(err):
		return err
	default:
		// Still in the transaction for franz-go: the next try aborts again
		// before it begins.
		t.aborting = true
		return errors.Join(cause, fmt.Errorf("abort transaction: %w", err))
	}
	return cause
}
