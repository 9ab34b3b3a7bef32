package exactlyonce

// The decision on a hanging transaction, from its readings (hanging.go
// takes them): pure, so that every case is a row of a table test.

// txnOutcome is how the coordinator ended a transaction, as far as the
// connector can learn it: from a marker it read, or from the coordinator's
// state read before this instance's InitProducerId bumped it away.
type txnOutcome int8

const (
	outcomeUnknown txnOutcome = iota
	outcomeCommitted
	outcomeAborted
)

func (o txnOutcome) String() string {
	switch o {
	case outcomeCommitted:
		return "committed"
	case outcomeAborted:
		return "aborted"
	}
	return "ended (committed or aborted: not known here)"
}

// ackState: whether PostgreSQL may have been told that a transaction's
// events are delivered. Only a commit's answer makes the connector say so,
// and then the slot may move past them: aborting them would lose them.
type ackState int8

const (
	ackUnknown ackState = iota
	ackNo
	ackYes
)

// partState is one partition's part of a transaction.
type partState int8

const (
	partOther   partState = iota // no open transaction of it, and no sign that its marker is here (or it never wrote here)
	partMarked                   // its marker is here: readers have its outcome
	partHanging                  // open here, and the coordinator has ended it (KIP-664 find-hanging's rule)
	partPending                  // open here, and the coordinator still lists the partition: its marker comes
)

// partReading is a partition's reading: DescribeProducers' entry of the
// transaction's producer id there (the positions partition: the read).
type partReading struct {
	Topic      string
	Partition  int32
	State      partState
	Start      int64 // first offset of the open transaction (hanging, pending)
	ProducerID int64
	Epoch      int16
}

// txnReading is one transaction of this producer id: its outcome, whether
// it may have been acknowledged, its positions partition and the partitions
// of the topics it wrote to.
type txnReading struct {
	Outcome   txnOutcome
	Acked     ackState
	Positions partReading
	Events    []partReading
}

// hangAction is what a transaction's readings call for.
type hangAction int8

const (
	hangNone    hangAction = iota // nothing of it hangs: go on
	hangWait                      // its markers are still being written: read again
	hangAbort                     // an abort on each hanging partition, then a restart: its events are published once, again
	hangCommit                    // a commit marker on each hanging partition, which no kafka-transactions.sh command writes
	hangUnknown                   // its outcome is not known here, and its marker is on some partition: that marker decides
)

// hangDecision is the action and the partitions it is for.
type hangDecision struct {
	Action  hangAction
	Outcome txnOutcome    // as learned (an acknowledged one: committed)
	Hanging []partReading // the positions partition first
	Marked  []partReading // where its marker is
	// CheckSlot: the abort is right only if PostgreSQL was not told the
	// events are delivered, which the connector could not tell (a start
	// without Config.Acknowledged): the runbook asks the operator to check.
	CheckSlot bool
}

// decideHang decides what a transaction of this producer id calls for,
// from where its markers are. Kafka 4.x completes a transaction without
// the markers of a partition whose leader was missing when it sent them,
// and the producer's next marker on that partition decides those records.
// A transaction is right only whole: committed everywhere (its position
// counts its events; nothing is published again) or aborted everywhere
// (the position before it stands; the restart publishes its events again,
// from PostgreSQL). kafka-transactions.sh (KIP-664) can only abort.
//
//	coordinator  positions  event part.  decision
//	committed    marked     marked       none: go on after its position
//	committed    marked     hanging      commit: an abort there loses its events (the position counts them)
//	committed    hanging    marked       commit: an abort sends the connector back over events readers have: twice
//	committed    hanging    hanging      abort everywhere: no reader saw any of it; unless acknowledged: commit
//	aborted      marked     marked       none: its events go again from the position before
//	aborted      any partition hanging   abort there: what the coordinator decided; nothing acknowledged it
//	not known    hanging    marked       unknown: the marker there decides (commit or abort as above)
//	not known    marked     hanging      unknown: so too (an older transaction's, its record compacted away)
//	not known    hanging    hanging      as committed/hanging/hanging (an acknowledged one committed)
//
// "Commit" cannot be repaired with kafka-transactions.sh without loss or
// duplicates: the connector stops, and its runbook says so. A partition
// still listed by the coordinator (pending) is read again first.
func decideHang(r txnReading) hangDecision {
	d := hangDecision{Outcome: r.Outcome}
	for _, p := range append([]partReading{r.Positions}, r.Events...) {
		switch p.State {
		case partPending:
			return hangDecision{Action: hangWait, Outcome: r.Outcome}
		case partHanging:
			d.Hanging = append(d.Hanging, p)
		case partMarked:
			d.Marked = append(d.Marked, p)
		}
	}
	if d.Outcome == outcomeUnknown && r.Acked == ackYes {
		d.Outcome = outcomeCommitted // only a commit is acknowledged
	}
	outcome, marked := d.Outcome, len(d.Marked) > 0
	switch {
	case len(d.Hanging) == 0:
		d.Action = hangNone
	case outcome == outcomeAborted:
		d.Action = hangAbort
	case marked && outcome == outcomeCommitted:
		d.Action = hangCommit
	case marked:
		d.Action = hangUnknown
	case r.Acked == ackYes:
		d.Action = hangCommit
	default:
		d.Action, d.CheckSlot = hangAbort, r.Acked == ackUnknown
	}
	return d
}

// coordState is a DescribeTransactions reading of the transactional id.
type coordState struct {
	Known      bool
	State      string
	ProducerID int64
	Epoch      int16
	Listed     map[string]map[int32]bool // partitions it still writes markers to (or runs)
}

// mayMark reports whether the coordinator may still write pid's marker on
// topic's partition p: it lists the partition in a transaction of pid it
// runs or prepares, or it did not answer. Kafka's find-hanging calls an
// open transaction hanging when the coordinator does not list its
// partition (TransactionsCommand, KIP-664).
func (c coordState) mayMark(pid int64, topic string, p int32) bool {
	active := c.State == "Ongoing" || c.State == "PrepareCommit" || c.State == "PrepareAbort" || c.State == "PrepareEpochFence"
	return !c.Known || active && c.ProducerID == pid && c.Listed[topic][p]
}

// outcomeOf is how c ended the transaction of pid at epoch e, when c is a
// reading of that transaction: transaction version 1 keeps the epoch to
// the end, version 2 (KIP-890) ends it at e+1. A prepared one completes
// as prepared.
func (c coordState) outcomeOf(pid int64, e int16) txnOutcome {
	if !c.Known || c.ProducerID != pid || (c.Epoch != e && c.Epoch != e+1) {
		return outcomeUnknown
	}
	switch c.State {
	case "PrepareCommit", "CompleteCommit":
		return outcomeCommitted
	case "PrepareAbort", "CompleteAbort", "PrepareEpochFence":
		return outcomeAborted
	}
	return outcomeUnknown
}

// producerState is DescribeProducers' entry of a producer id on a
// partition; Found false: it has none there.
type producerState struct {
	Topic     string
	Partition int32
	Found     bool
	Open      bool // CurrentTxnStartOffset >= 0
	Start     int64
	Epoch     int16
}

// eventPart is partition s's part in the transaction of pid at epoch e.
// Open at e: hanging, unless the coordinator may still mark it. No open one and the
// epoch e+1: e's own marker (transaction version 2 writes markers at the
// bumped epoch, and a marker sets the entry's epoch); version 1 leaves no
// such sign, so its marked partitions read as partOther.
func eventPart(s producerState, pid int64, e int16, c coordState) partReading {
	p := partReading{Topic: s.Topic, Partition: s.Partition, ProducerID: pid, Epoch: s.Epoch, Start: s.Start}
	switch {
	case !s.Found:
	case s.Open && s.Epoch == e && c.mayMark(pid, s.Topic, s.Partition):
		p.State = partPending
	case s.Open && s.Epoch == e:
		p.State = partHanging
	case !s.Open && s.Epoch == e+1:
		p.State = partMarked
	}
	return p
}
