package exactlyonce

import (
	"fmt"
	"strings"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// The error a hanging transaction stops the connector with: what hangs,
// where, and what ends it (decideHang), one command per partition, so
// that an operator (and the chaos suite's, test/chaos/hanging_test.go)
// can follow it as printed.

// hangingError is the error the connector stops with for the decisions ds
// (none of them hangNone or hangWait).
func (t *Txn) hangingError(s *positionsRead, ds []hangDecision) error {
	brokers := strings.Join(t.cfg.Sink.Brokers, ",")
	n, before := s.last.pos, s.before
	var problem, fix []string
	for _, d := range ds {
		problem = append(problem, hangProblem(d))
		fix = append(fix, hangFix(d, brokers, n.LSN, before.LSN))
	}
	head := fmt.Sprintf("a Kafka transaction of this source (its last position: txn %d, lsn %v) was ended by its coordinator without its "+
		"markers on some of its partitions (a hanging transaction, KIP-664): ", n.Txn, n.LSN)
	tail := "; read_committed consumers of those partitions stop at it, and this producer's next marker there would decide it either way, " +
		"so the connector does not guess"
	return fmt.Errorf("%w: %w", errHanging, t.prerequisite(head+strings.Join(problem, "; ")+tail, strings.Join(fix, "; then ")))
}

// hangProblem names the transaction of d, its outcome and where it hangs.
func hangProblem(d hangDecision) string {
	h := d.Hanging[0]
	var where []string
	for _, p := range d.Hanging {
		where = append(where, fmt.Sprintf("%s/%d from offset %d", p.Topic, p.Partition, p.Start))
	}
	msg := fmt.Sprintf("producer id %d, epoch %d: %s; no marker on %s", h.ProducerID, h.Epoch, d.Outcome, strings.Join(where, ", "))
	if len(d.Marked) > 0 {
		msg += fmt.Sprintf(" (its marker is on %s)", partList(d.Marked))
	}
	return msg
}

// hangFix is the runbook of d.
func hangFix(d hangDecision, brokers string, n, before lsn.LSN) string {
	switch d.Action {
	case hangAbort:
		fix := "abort it on each partition where it hangs, then restart: the connector then publishes its events once, again, " +
			fmt.Sprintf("from the position before it (lsn %v): ", before) + abortCommands(d, brokers)
		if d.CheckSlot {
			fix += fmt.Sprintf(" (first check that the slot's confirmed_flush_lsn in pg_replication_slots is below %v: at or past it, "+
				"PostgreSQL was told the events are delivered, an abort loses them, and the transaction needs COMMIT markers instead, "+
				"which no kafka-transactions.sh command writes)", n)
		}
		return fix
	case hangCommit:
		return "it committed, so an abort would lose its events where it hangs or, the position going back, publish them twice " +
			"where its marker is; it needs a COMMIT marker on each partition where it hangs: " + commitMarkers(d) + ". " +
			"kafka-transactions.sh writes only aborts (KIP-664), so this cannot be repaired with it without loss or duplicates; " +
			"the WriteTxnMarkers request its abort sends (producer epoch and coordinator epoch as kafka-transactions.sh describe-producers " +
			"lists them for the partition), with committed=true, to the partition's leader (ClusterAction permission), writes one. " +
			fmt.Sprintf("After the markers, restart: the connector goes on after lsn %v and publishes none of its events again", n)
	}
	return fmt.Sprintf("its outcome could not be learned here (the coordinator moved on) and its marker on %s decides it: "+
		"kafka-transactions.sh cannot show it; kafka-dump-log.sh --print-data-log on that partition's segment does "+
		"(endTxnMarker ABORT or COMMIT, producerId %d). ABORT: abort it where it hangs, then restart (its events are published once, again): %s. "+
		"COMMIT: it needs a COMMIT marker where it hangs (%s), which no kafka-transactions.sh command writes: it cannot be repaired "+
		"with it without loss or duplicates", partList(d.Marked), d.Hanging[0].ProducerID, abortCommands(d, brokers), commitMarkers(d))
}

// abortCommands are kafka-transactions.sh's commands for d's partitions:
// find-hanging (over no minimum age: the default lists only transactions
// open for 15 minutes) then abort, each.
func abortCommands(d hangDecision, brokers string) string {
	var cmds []string
	for _, p := range d.Hanging {
		cmds = append(cmds, fmt.Sprintf("kafka-transactions.sh --bootstrap-server %s find-hanging --topic %s --partition %d --max-transaction-timeout 0 "+
			"(lists producer id %d, start offset %d), then kafka-transactions.sh --bootstrap-server %s abort --topic %s --partition %d --start-offset %d",
			brokers, p.Topic, p.Partition, p.ProducerID, p.Start, brokers, p.Topic, p.Partition, p.Start))
	}
	return strings.Join(cmds, "; ")
}

// commitMarkers names the COMMIT markers d needs.
func commitMarkers(d hangDecision) string {
	var ms []string
	for _, p := range d.Hanging {
		ms = append(ms, fmt.Sprintf("COMMIT marker on %s/%d (producer id %d, its transaction from offset %d)", p.Topic, p.Partition, p.ProducerID, p.Start))
	}
	return strings.Join(ms, ", ")
}

func partList(ps []partReading) string {
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
	}
	return strings.Join(out, ", ")
}
