package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/replication"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
)

// ExactlyOnce configures kafka.delivery exactly_once: the transactional
// producer (exactlyonce.Txn), which commits whole PostgreSQL transactions and their
// end position in one Kafka transaction.
type ExactlyOnce struct {
	Interval       time.Duration // kafka.transaction_interval
	Timeout        time.Duration // kafka.transaction_timeout
	PositionsTopic string        // kafka.positions_topic
}

// out is the sink as a run owns it.
type out interface {
	producer
	Close()
}

// newSink returns the at-least-once sink, or in exactly_once mode the
// transactional one, started, and chooses the run's boundary (eos.go): any other instance of the source is fenced,
// and the last position committed to Kafka, once trusted, is a reading the
// start is decided from (decideStart). A replay publishes at least once: its
// range is not the source's position.
func (su *starter) newSink(ctx context.Context, pl *plan) (out, error) {
	p := su.p
	eo := p.cfg.ExactlyOnce
	if eo == nil || p.cfg.Replay != nil {
		s, err := su.openSink(ctx)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return s, nil
	}
	srv, err := su.identify(ctx)
	if err != nil {
		return nil, fmt.Errorf("exactly_once: %w", err)
	}
	key := sourceKey(srv, p.cfg.Source.Slot)
	sc := p.quarantining(p.cfg.Sink)
	sc.QuarantineSource = key
	t, err := exactlyonce.New(exactlyonce.Config{Sink: sc, Positions: eo.PositionsTopic, Interval: eo.Interval, TransactionTimeout: eo.Timeout,
		Source: key, Fail: p.fail, Proof: p.markProof,
		Acknowledged: max(pl.readings.slot, pl.readings.ckpt)}, p.log)
	if err != nil {
		return nil, err
	}
	t.SetTimeline(srv.Timeline)
	committed, err := t.Start(ctx)
	if err == nil {
		// The server is read again for the trust check, after the fence: an
		// instance still alive (its stream reconnecting) may have committed
		// positions past the start's reading (identify) until Start fenced
		// it, and none can commit past a reading taken now.
		var now replication.Server
		if now, err = p.cfg.Source.DB.Identify(ctx); err == nil {
			err = trustCommitted(committed, now, eo.PositionsTopic, key, strings.Join(p.cfg.Sink.Brokers, ","))
		}
	}
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("exactly_once: %w", err)
	}
	// After Start's fence: the state records of an earlier instance's open
	// transaction are decided then.
	if err := t.StartQuarantines(ctx); err != nil {
		t.Close()
		return nil, notCompacted(err)
	}
	p.log.Info("exactly-once delivery: Kafka transactions commit the position", "transactional_id", t.TransactionalID(),
		"positions_topic", eo.PositionsTopic, "committed", committed.LSN)
	pl.readings.committed, pl.positionKey = committed.LSN, key
	e := &eos{p: p, txn: t}
	p.b = e
	if pl.readings.committedMark, err = readMark(ctx, pl, committed.Mark, committed.MarkAt, committed.MarkTime); err != nil {
		t.Close()
		return nil, fmt.Errorf("exactly_once: %w", err)
	}
	if committed.LSN == 0 && pl.snapshot == nil && !pl.readings.created {
		// No position for this source, but a slot that existed: what it
		// sends first may be in Kafka already (readback.go). A slot this
		// run created sends only what commits after it: nothing to read
		// back, and its first transaction may be split (split.go).
		p.log.Info("exactly-once: no position committed to Kafka for this source; the first transactions are read back from their topics before they are published",
			"slot_confirmed", pl.readings.slot, "checkpoint", pl.readings.ckpt)
		e.startReadBack(ctx, time.Time{})
	}
	if pl.snapshot == nil {
		t.NoSnapshot()
	}
	if pl.snapshot != nil && pl.snapshotRedo {
		// The snapshot is taken again: what the interrupted one committed
		// is in Kafka. Its records carry that snapshot's start time, or the
		// rows' (outbox.timestamp_column), which no reading at hand bounds:
		// the topics are read from their start (up to the read-back's
		// maximum; past it, duplicates).
		p.log.Info("exactly-once: an interrupted snapshot is taken again; what its topics hold is read back before its rows are published")
		e.startReadBack(ctx, time.Time{})
		e.readBack.redo = true
	}
	return t, nil
}

// trustCommitted applies the checkpoint's trust rule to the position
// committed to Kafka, the one the run would skip to: a position this
// server never reached (restored from an older copy, a PITR, a standby
// promoted before it replayed that far) would skip every transaction the
// server commits below it and confirm the slot past them, so it is refused.
// A position of an older version (no timeline) is checked against the WAL
// end only.
func trustCommitted(pos exactlyonce.Position, srv replication.Server, topic, key, brokers string) error {
	why := replication.NotInHistory(pos.LSN, pos.Timeline, srv)
	if pos.LSN == 0 || why == "" {
		return nil
	}
	return &fault.PrerequisiteError{
		Problem: fmt.Sprintf("the position %v committed to Kafka (topic %s, key %s, timeline %d) %s; streaming would skip, and confirm, "+
			"every transaction this server commits below it", pos.LSN, topic, key, pos.Timeline, why),
		Fix: fmt.Sprintf("if this server was restored or a standby promoted, what Kafka holds past what the server has stays published; "+
			"forget the position with a tombstone for its key and start again, which streams from the slot's confirmed position "+
			"(kafka-console-producer.sh --bootstrap-server %s --topic %s --property parse.key=true --property key.separator='|' --property null.marker=NULL "+
			"<<< '%s|NULL'); if the DSN reaches the wrong cluster, fix postgres.dsn (docs/operations.md, Exactly-once delivery)", brokers, topic, key),
	}
}

// onTimeline is told the timeline of each replication connection: what is
// saved from then on (the checkpoint, exactly_once's committed positions)
// is stamped with it. Nil when nothing is saved.
func onTimeline(pl *plan, s out) func(int32) {
	var stamp []func(int32)
	if pl.checkpoints != nil {
		stamp = append(stamp, pl.checkpoints.Timeline.Store)
	}
	if t, ok := s.(interface{ SetTimeline(int32) }); ok {
		stamp = append(stamp, t.SetTimeline)
	}
	if len(stamp) == 0 {
		return nil
	}
	return func(tli int32) {
		for _, f := range stamp {
			f(tli)
		}
	}
}

// waitSlotFree waits while another connector streams from the slot: taking
// the transactional id over fences that one, so a standby does it only
// once the slot is free (the active one died, or lost its connection).
func (su *starter) waitSlotFree(ctx context.Context) error {
	p := su.p
	slot, logged := p.cfg.Source.Slot, false
	for {
		info, err := p.cfg.Source.DB.Slot(ctx, slot)
		if errors.Is(err, replication.ErrNoSlot) {
			return nil // setup creates it
		}
		if err != nil {
			return err
		}
		if !info.Active {
			return nil
		}
		if !logged {
			p.log.Info("another connector streams from the slot; waiting for it to stop before taking the transactional id over",
				"slot", slot, "active_pid", info.ActivePID)
			logged = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
