package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// Start checks what transactions need (brokers that support them, the
// positions topic, compacted), fences any other instance of this source,
// reads the last committed position and starts the commit loop. The
// position is read after the fencing, so no older instance can commit
// after it was read. A zero Position means none was committed yet; the
// caller decides whether this server can have reached it
// (replication.CheckCommitted) before it trusts it.
func (t *Txn) Start(ctx context.Context) (Position, error) {
	if err := t.checkTransactions(ctx); err != nil {
		return Position{}, err
	}
	if err := t.ensurePositions(ctx); err != nil {
		return Position{}, err
	}
	t.noteCoordinator(ctx) // the fence erases the last transaction's outcome there
	if err := t.fence(ctx); err != nil {
		return Position{}, err
	}
	// The client's own producer id, before the read: initialized lazily at
	// the first transaction it would fence an instance that claimed the id
	// since, unchecked (claim).
	if _, _, err := t.cl.ProducerID(ctx); err != nil {
		return Position{}, fmt.Errorf("init transactional id %s: %w", t.txnID, err)
	}
	pos, err := t.readPosition(ctx)
	if err != nil {
		return Position{}, err
	}
	if pos.LSN != 0 {
		t.log.Info("kafka: last committed position", "topic", t.cfg.Positions, "lsn", pos.LSN, "timeline", pos.Timeline,
			"txn", pos.Txn, "committed_at", pos.Committed, "history_mark", pos.Mark)
	}
	t.committed.Store(uint64(pos.LSN))
	t.prior = pos
	// A transaction committed in part: the stream sends it again, and its
	// committed events are passed over (split.go).
	t.lastPart = pos.Part
	t.split.resume, t.split.started = pos.Part, pos.Part != nil
	t.txnSeq = pos.Txn
	t.wg.Add(1)
	go t.loop()
	return pos, nil
}

// prerequisite is a broker setting that must change before the connector
// can run.
func (t *Txn) prerequisite(problem, fix string) error {
	return &fault.PrerequisiteError{Problem: problem, Fix: fix}
}

// checkTransactions refuses brokers without the transaction APIs.
func (t *Txn) checkTransactions(ctx context.Context) error {
	vs, err := t.adm.ApiVersions(ctx)
	if err != nil {
		return fmt.Errorf("kafka api versions: %w", err)
	}
	var problem error
	vs.Each(func(v kadm.BrokerApiVersions) {
		if v.Err != nil {
			problem = fmt.Errorf("kafka api versions of broker %d: %w", v.NodeID, v.Err)
			return
		}
		for _, k := range []kmsg.Key{kmsg.InitProducerID, kmsg.AddPartitionsToTxn, kmsg.EndTxn} {
			if _, ok := v.KeyMaxVersion(int16(k)); !ok {
				problem = t.prerequisite(
					fmt.Sprintf("kafka broker %d does not support transactions (no %s API), which kafka.delivery exactly_once needs", v.NodeID, k.Name()),
					"use Kafka 0.11 or later with transactions enabled, or set kafka.delivery: at_least_once")
			}
		}
	})
	return problem
}

// ensurePositions creates the positions topic, compacted with one
// partition, or checks that the existing one is compacted: a deleted
// position would send the connector back to the slot's position, and
// republish what was committed since.
func (t *Txn) ensurePositions(ctx context.Context) error {
	name := t.cfg.Positions
	got, err := kafka.EnsureTopic(ctx, t.adm, kafka.TopicSpec{Name: name, Label: name, Partitions: 1,
		Replication: t.meta.Replication(), Configs: map[string]string{"cleanup.policy": "compact"}, KeepLast: true})
	var (
		te *kafka.TopicError
		nk *kafka.NotKeptError
	)
	switch {
	case errors.As(err, &te) && te.Op == "create":
		return t.prerequisite(
			fmt.Sprintf("cannot create the positions topic %s: %v", name, te.Err),
			fmt.Sprintf("create it with cleanup.policy=compact and 1 partition (kafka-topics.sh --create --topic %s --partitions 1 --config cleanup.policy=compact)", name))
	case errors.As(err, &nk):
		return t.prerequisite(
			fmt.Sprintf("the positions topic %s has cleanup.policy=%s; it must be compact, or committed positions are deleted", name, nk.Policy),
			fmt.Sprintf("kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact, "+
				"or set kafka.positions_topic to a compacted topic", name))
	case err != nil:
		return err
	case got.Found != kafka.Exists:
		t.log.Info("kafka: created the positions topic", "topic", name, "cleanup.policy", "compact")
	}
	return nil
}

// fence initializes the transactional id once, before the position is
// read: the coordinator bumps its epoch, which fences every other producer
// with it, and aborts the transaction one of them left open.
func (t *Txn) fence(parent context.Context) error {
	ctx, cancel := context.WithTimeout(parent, time.Minute)
	defer cancel()
	for {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &t.txnID
		req.TransactionTimeoutMillis = int32(t.cfg.TransactionTimeout.Milliseconds())
		req.ProducerID, req.ProducerEpoch = -1, -1
		resp, err := req.RequestWith(ctx, t.cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case err == nil:
			t.log.Info("kafka: transactional id initialized; any other instance with it is fenced",
				"transactional_id", t.txnID, "producer_id", resp.ProducerID, "epoch", resp.ProducerEpoch)
			return nil
		case errors.Is(err, kerr.InvalidTransactionTimeout):
			return t.prerequisite(
				fmt.Sprintf("kafka.transaction_timeout %v is longer than the broker allows (transaction.max.timeout.ms): %v", t.cfg.TransactionTimeout, err),
				"lower kafka.transaction_timeout, or raise transaction.max.timeout.ms on the brokers")
		case errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
			return t.prerequisite(
				fmt.Sprintf("not authorized to use transactional id %s: %v", t.txnID, err),
				fmt.Sprintf("grant WRITE and DESCRIBE on TransactionalId %s (kafka-acls.sh --transactional-id %s)", t.txnID, t.txnID))
		case parent.Err() != nil:
			return parent.Err()
		case ctx.Err() != nil:
			return t.prerequisite(
				fmt.Sprintf("the Kafka transaction coordinator did not answer for a minute (%v); its __transaction_state topic may not be creatable", err),
				"on a cluster of fewer than 3 brokers set transaction.state.log.replication.factor and transaction.state.log.min.isr to at most the broker count")
		case kafka.IsRetriableTxn(err):
		default:
			return fmt.Errorf("init transactional id %s: %w", t.txnID, err)
		}
		select {
		case <-ctx.Done():
			// The next round reports it.
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readPosition reads the positions topic to its end (readTopic:
// committed records only) and returns the last position of this source; a
// tombstone for it (an operator forgetting the position) is none. A
// transaction of this source still open at the end is waited for: it may
// be a commit whose markers are not written yet (topicread.ReadAwaiting),
// which the settle of a lost answer and the start after it must count. The
// broker aborts one left open after TransactionTimeout, so the read waits
// that long and a minute more. Then the last transactions' other
// partitions are looked at (checkHanging): a hanging transaction stops it.
func (t *Txn) readPosition(ctx context.Context) (Position, error) {
	name := t.cfg.Positions
	ctx, cancel := context.WithTimeout(ctx, t.cfg.TransactionTimeout+time.Minute)
	defer cancel()
	s := newPositionsRead(t.cfg.Source, name, t.log)
	err := readTopic(ctx, t.cfg.Sink, name, topicread.Await{Holds: s.ours, Ended: t.ended, Aborted: s.aborted}, s.committed)
	var hanging *topicread.HangingError
	switch {
	case errors.As(err, &hanging):
		s.hang(hanging)
	case err != nil:
		return Position{}, fmt.Errorf("read positions from %s: %w", name, err)
	}
	if err := t.checkHanging(ctx, s); err != nil {
		return Position{}, err
	}
	for _, tp := range s.last.pos.Topics {
		if _, ok := t.hang.written[tp]; !ok {
			t.noteTopic(tp, 0) // still looked at after the next commit
		}
	}
	return s.pos, nil
}

// readTopic reads every partition of topic from its start to its end as
// listed when the read starts, handing fn the committed records in offset
// order (topicread), on the calling goroutine; an open transaction holding
// a record await holds is waited for (topicread.ReadAwaiting).
func readTopic(ctx context.Context, cfg sink.Config, topic string, await topicread.Await, fn func(*kgo.Record) error) error {
	conn, err := cfg.ConnOpts()
	if err != nil {
		return err
	}
	rd, err := topicread.New(append(conn, cfg.TestOpts...)...)
	if err != nil {
		return err
	}
	defer rd.Close()
	ranges, missing, err := rd.Whole(ctx, topic)
	if err == nil && len(missing) > 0 {
		err = fmt.Errorf("end offsets of %s: %w", topic, kerr.UnknownTopicOrPartition)
	}
	if err != nil {
		return err
	}
	return rd.ReadAwaiting(ctx, ranges, await, fn)
}
