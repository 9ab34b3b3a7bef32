package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// A hanging transaction: this source's position record in a transaction
// that its coordinator has ended but that has no marker on the positions
// topic. Kafka 4.x drops the markers of a partition that has no leader
// when it sends them (after a broker restart its partitions can lose their
// leader for a moment when the controller fences the crashed incarnation),
// and still completes the transaction. The records then stay unmarked
// until this producer's next marker on each partition decides them: the
// next commit makes them visible to read_committed readers, an abort hides
// them. Neither outcome can be taken for the one the connector did not
// see: taken as aborted, the events are published again and the next
// commit shows both copies (the long exactly_once chaos run's duplicate);
// taken as committed, the next abort on any of its partitions loses them.
// So the connector stops and says how to end it (KIP-664's tool).

// errHanging classes the error a hanging transaction stops the producer
// with (fatal: only an operator's abort ends it).
var errHanging = errors.New("hanging transaction")

// ended asks the coordinator whether the transaction holding r has ended
// (topicread.Await.Ended). Not knowing is "not ended": the read waits.
func (t *Txn) ended(ctx context.Context, r *kgo.Record) (bool, error) {
	d, err := t.adm.DescribeTransactions(ctx, t.txnID)
	if err != nil {
		return false, nil
	}
	s, ok := d[t.txnID]
	if !ok || s.Err != nil {
		return false, nil
	}
	return txnEnded(s.State, s.ProducerID, s.ProducerEpoch, r.ProducerID, r.ProducerEpoch), nil
}

// txnEnded: the coordinator (state, pid, epoch) has ended the transaction
// whose records carry recPID and recEpoch. Kafka 4's transactions
// (KIP-890, transaction version 2) bump the epoch when a transaction ends,
// at its PREPARE; earlier ones keep it.
func txnEnded(state string, pid int64, epoch int16, recPID int64, recEpoch int16) bool {
	prepared := state == "PrepareCommit" || state == "PrepareAbort" || state == "PrepareEpochFence"
	switch {
	case pid != recPID: // the id moved on (epoch exhausted): long ended
		return true
	case epoch > recEpoch+1: // a later transaction, or a fence, since
		return true
	case epoch == recEpoch+1: // ended (v2), unless its markers are being written
		return !prepared
	case epoch == recEpoch: // v1: ended once complete; v2: still open
		return state == "CompleteCommit" || state == "CompleteAbort" || state == "Empty"
	}
	return false
}

// hangingError is the error the connector stops with: what hangs, and the
// commands that end it.
func (t *Txn) hangingError(h *topicread.HangingError) error {
	brokers := strings.Join(t.cfg.Sink.Brokers, ",")
	problem := fmt.Sprintf("the Kafka transaction that committed this source's last position (%v) was ended by its coordinator without "+
		"its markers (a hanging transaction, KIP-664), so whether its events are committed is not decided yet; publishing them again "+
		"could show them twice", h)
	fix := fmt.Sprintf("abort it on every partition where it hangs, then restart (its events are then published once, again): "+
		"kafka-transactions.sh --bootstrap-server %s find-hanging --broker-id <each broker id>, then for each partition it lists "+
		"kafka-transactions.sh --bootstrap-server %s abort --topic <topic> --partition <partition> --start-offset <start offset> "+
		"(here %s %d %d among them)", brokers, brokers, h.Topic, h.Partition, h.Offset)
	return fmt.Errorf("%w: %w", errHanging, t.prerequisite(problem, fix))
}
