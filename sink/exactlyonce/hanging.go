package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// A hanging transaction: one of this source's transactions that its
// coordinator has ended but that has no marker on some of its partitions.
// Kafka 4.x drops the markers of a partition that has no leader when it
// sends them (after a broker restart its partitions can lose their leader
// for a moment when the controller fences the crashed incarnation), and
// still completes the transaction. The records then stay unmarked until
// this producer's next marker on each partition decides them, and
// read_committed readers stop at them meanwhile. Every read of the
// positions topic (the start, the settle of a lost answer) therefore looks
// at the partitions of the last transactions' topics too, as Kafka's
// find-hanging does (DescribeProducers against the coordinator's
// DescribeTransactions, KIP-664), and stops with a runbook when one hangs
// (decideHang says which, and what ends it).

// errHanging classes the error a hanging transaction stops the producer
// with (fatal: only an operator ends it).
var errHanging = errors.New("hanging transaction")

// hangState is what the hang check keeps between reads.
type hangState struct {
	// before is the coordinator's state read before this instance's last
	// InitProducerId (the start's fence, the settle's reload) bumped it
	// away: the last transaction's outcome (coordState.outcomeOf).
	before coordState
	// written: the topics this source's transactions wrote to lately, by
	// the number of the last transaction that did (Position.Topics).
	written map[string]uint64
	// noDescribe: DescribeProducers is refused (logged once).
	noDescribe bool
}

// maxTopics bounds Position.Topics: the least recently written go first.
const maxTopics = 100

// noteTopics records the topics of the transaction numbered txn.
func (t *Txn) noteTopics(b []*entry, txn uint64) {
	for _, e := range b {
		t.noteTopic(e.sent().Topic, txn)
	}
}

// noteTopic records topic as written by transaction txn.
func (t *Txn) noteTopic(topic string, txn uint64) {
	if t.hang.written == nil {
		t.hang.written = map[string]uint64{}
	}
	t.hang.written[topic] = max(t.hang.written[topic], txn)
	for len(t.hang.written) > maxTopics {
		oldest := ""
		for tp, n := range t.hang.written {
			if oldest == "" || n < t.hang.written[oldest] || n == t.hang.written[oldest] && tp < oldest {
				oldest = tp
			}
		}
		delete(t.hang.written, oldest)
	}
}

// topicsWritten is Position.Topics, sorted.
func (t *Txn) topicsWritten() []string {
	out := make([]string, 0, len(t.hang.written))
	for tp := range t.hang.written {
		out = append(out, tp)
	}
	slices.Sort(out)
	return out
}

// hangRecheck spaces the readings of a hang check: one that finds a
// partition hanging is taken again after it (a marker written meanwhile
// ends it), and a pending one waits as long.
const hangRecheck = 2 * time.Second

// checkHanging looks at every partition of the last transactions (the
// positions partition from the read s, the others with DescribeProducers)
// and returns the hanging-transaction error when one hangs.
func (t *Txn) checkHanging(ctx context.Context, s *positionsRead) error {
	pid := int64(-1)
	switch {
	case s.last.rec != nil:
		pid = s.last.rec.ProducerID
	case s.last.hanging != nil:
		pid = s.last.hanging.ProducerID
	}
	if pid < 0 {
		return nil // none, or not a transaction's (an operator's record)
	}
	topics := s.topics()
	confirmed := false
	for {
		in := t.hangInputs(ctx, s, pid, topics)
		var ds []hangDecision
		wait := false
		for _, r := range readingsOf(s, in) {
			switch d := decideHang(r); d.Action {
			case hangNone:
			case hangWait:
				wait = true
			default:
				ds = append(ds, d)
			}
		}
		switch {
		case wait:
			confirmed = false
		case len(ds) == 0:
			return nil
		case confirmed:
			return t.hangingError(s, ds)
		default:
			confirmed = true
		}
		if backoff.Sleep(ctx, hangRecheck); ctx.Err() != nil {
			return fmt.Errorf("look for hanging transactions: %w", ctx.Err())
		}
	}
}

// hangInputs reads the coordinator, then (so that a marker written in
// between is seen) the producer id's entries on topics' partitions.
func (t *Txn) hangInputs(ctx context.Context, s *positionsRead, pid int64, topics []string) hangInputs {
	in := hangInputs{pid: pid, before: t.hang.before, acked: t.acked(s)}
	in.coord, _ = t.describeCoordinator(ctx)
	if len(topics) == 0 || t.hang.noDescribe {
		return in
	}
	set := kadm.TopicsSet{}
	set.MergeTopics(topics)
	var err error
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		var parts []producerState
		if parts, err = t.describeProducers(ctx, set, pid); err == nil {
			in.parts = parts
			return in
		}
		if errors.As(err, new(*kadm.AuthError)) {
			break
		}
		backoff.Sleep(ctx, time.Second)
	}
	// Without it the positions partition is looked at alone, as before.
	t.log.Warn("kafka: cannot look for hanging transactions on the event topics' partitions (DescribeProducers needs READ on them)",
		"topics", topics, "err", err)
	t.hang.noDescribe = errors.As(err, new(*kadm.AuthError))
	return in
}

// describeProducers is pid's entry on each partition of set (a topic that
// no longer exists has none).
func (t *Txn) describeProducers(ctx context.Context, set kadm.TopicsSet, pid int64) ([]producerState, error) {
	described, err := t.adm.DescribeProducers(ctx, set)
	if err != nil {
		return nil, fmt.Errorf("describe producers: %w", err)
	}
	var out []producerState
	for _, dp := range described.SortedPartitions() {
		switch {
		case errors.Is(dp.Err, kerr.UnknownTopicOrPartition):
			continue
		case dp.Err != nil:
			return nil, fmt.Errorf("describe producers of %s/%d: %w", dp.Topic, dp.Partition, dp.Err)
		}
		p := producerState{Topic: dp.Topic, Partition: dp.Partition}
		if e, ok := dp.ActiveProducers[pid]; ok {
			p.Found, p.Open, p.Start, p.Epoch = true, e.CurrentTxnStartOffset >= 0, e.CurrentTxnStartOffset, e.ProducerEpoch
		}
		out = append(out, p)
	}
	return out, nil
}

// describeCoordinator reads the transactional id's state.
func (t *Txn) describeCoordinator(ctx context.Context) (coordState, error) {
	d, err := t.adm.DescribeTransactions(ctx, t.txnID)
	if err != nil {
		return coordState{}, err
	}
	s, ok := d[t.txnID]
	switch {
	case !ok:
		return coordState{}, errors.New("no description")
	case s.Err != nil:
		return coordState{}, s.Err
	}
	c := coordState{Known: true, State: s.State, ProducerID: s.ProducerID, Epoch: s.ProducerEpoch, Listed: map[string]map[int32]bool{}}
	s.Topics.Each(func(tp string, p int32) {
		if c.Listed[tp] == nil {
			c.Listed[tp] = map[int32]bool{}
		}
		c.Listed[tp][p] = true
	})
	return c, nil
}

// noteCoordinator keeps the coordinator's state before this instance's
// InitProducerId erases the last transaction's outcome (hangState.before);
// one that does not answer within a minute leaves it not known.
func (t *Txn) noteCoordinator(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t.hang.before, _ = t.describeCoordinator(ctx)
}

// acked: whether PostgreSQL may have been told that the last transaction's
// events are delivered (what this instance committed, and what the start
// was told, Config.Acknowledged). A settle's own unconfirmed commit was
// not; a transaction that moved no position (a snapshot's, a gap
// repair's) cannot be told from the position.
func (t *Txn) acked(s *positionsRead) ackState {
	n := s.last.pos
	if u := t.unsure; u != nil && n.Txn == u.txn && n.Instance == t.instance {
		return ackNo
	}
	told := max(t.cfg.Acknowledged, lsn.LSN(t.committed.Load()))
	switch {
	case n.Part != nil && n.LSN <= s.before.LSN && told != 0 && told <= n.Part.Final:
		// Only a part of a transaction (split.go), no whole one: the
		// slot passes it only once its last part commits.
		return ackNo
	case n.LSN <= s.before.LSN || told == 0:
		return ackUnknown
	case told <= s.before.LSN:
		return ackNo
	case told >= n.LSN:
		return ackYes
	}
	return ackUnknown
}

// hangInputs are a hang check's readings.
type hangInputs struct {
	pid    int64
	coord  coordState // now
	before coordState // before this instance's InitProducerId
	parts  []producerState
	acked  ackState // the last transaction's
}

// readingsOf makes one txnReading per transaction of s's last ones: the
// last, and each other epoch of pid open on a partition (an older
// transaction whose marker never came there; transaction version 2 gives
// each transaction its own epoch, version 1 one per producer session).
func readingsOf(s *positionsRead, in hangInputs) []txnReading {
	last := s.lastEpoch()
	epochs := []int16{last}
	if h := s.last.hanging; h != nil {
		for _, r := range h.Held {
			if !slices.Contains(epochs, r.ProducerEpoch) {
				epochs = append(epochs, r.ProducerEpoch)
			}
		}
	}
	for _, p := range in.parts {
		if p.Open && !slices.Contains(epochs, p.Epoch) {
			epochs = append(epochs, p.Epoch)
		}
	}
	out := make([]txnReading, 0, len(epochs))
	for _, e := range epochs {
		r := txnReading{Outcome: s.outcomeAt(in, e, e == last), Acked: ackUnknown, Positions: s.positionsPart(in.pid, e)}
		if e == last {
			r.Acked = in.acked
		}
		for _, p := range in.parts {
			r.Events = append(r.Events, eventPart(p, in.pid, e, in.coord))
		}
		out = append(out, r)
	}
	return out
}

// lastEpoch is the last transaction's epoch.
func (s *positionsRead) lastEpoch() int16 {
	if s.last.rec != nil {
		return s.last.rec.ProducerEpoch
	}
	if h := s.last.hanging; h != nil {
		return h.Epoch
	}
	return -1
}

// outcomeAt is the outcome of the transaction of pid at epoch e: the last
// one's marker, another's as the read saw it (not the last one's: one
// epoch can hold several transactions), else the coordinator's.
func (s *positionsRead) outcomeAt(in hangInputs, e int16, last bool) txnOutcome {
	if last && s.last.outcome != outcomeUnknown {
		return s.last.outcome
	}
	if o := s.outcomes[pidEpoch{in.pid, e}]; !last && o != outcomeUnknown {
		return o
	}
	if o := in.before.outcomeOf(in.pid, e); o != outcomeUnknown {
		return o
	}
	return in.coord.outcomeOf(in.pid, e)
}

// positionsPart is the positions partition's part in the transaction at
// epoch e: hanging when the read ended on it, else decided (its record is
// marked, or was compacted away once it was).
func (s *positionsRead) positionsPart(pid int64, e int16) partReading {
	if h := s.last.hanging; h != nil && slices.ContainsFunc(h.Held, func(r *kgo.Record) bool { return r.ProducerEpoch == e }) {
		return partReading{Topic: h.Topic, Partition: h.Partition, State: partHanging, Start: h.Offset, ProducerID: h.ProducerID, Epoch: h.Epoch}
	}
	p := partReading{Topic: s.topic, State: partMarked, ProducerID: pid, Epoch: e}
	if s.last.rec != nil {
		p.Partition = s.last.rec.Partition
	}
	return p
}

// ended asks the coordinator whether the transaction holding r has ended
// (topicread.Await.Ended). Not knowing is "not ended": the read waits.
func (t *Txn) ended(ctx context.Context, r *kgo.Record) (bool, error) {
	c, err := t.describeCoordinator(ctx)
	if err != nil {
		return false, nil
	}
	return txnEnded(c.State, c.ProducerID, c.Epoch, r.ProducerID, r.ProducerEpoch), nil
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
