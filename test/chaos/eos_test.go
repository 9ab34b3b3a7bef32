package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// EnvDelivery runs the suite against kafka.delivery exactly_once:
// OUTBOX_CDC_CHAOS_DELIVERY=exactly_once. The suite then reads every topic
// with read_committed and requires no duplicate at all, each PostgreSQL
// transaction in one Kafka transaction, and per key seq 1, 2, 3, … with no
// replayed tail.
const EnvDelivery = "OUTBOX_CDC_CHAOS_DELIVERY"

// exactlyOnce reports the exactly_once run.
func exactlyOnce() bool { return os.Getenv(EnvDelivery) == "exactly_once" }

// modeName is the run's name in the results: the mode, plus the delivery
// when it is exactly_once (results/last-run-<name>.json).
func modeName(m mode) string {
	if exactlyOnce() {
		return m.Name + "-exactly_once"
	}
	return m.Name
}

// eosSkip leaves out the kinds a delivery mode cannot have: the EndTxn
// faults outside exactly_once, and its read-back's restore kind.
func eosSkip(t *testing.T, skip map[string]bool) {
	if !exactlyOnce() {
		for _, k := range txnFaults {
			skip[k] = true // no transactions to fault
		}
		skip[fPGRestoreCompacted] = true // its subject is exactly_once's read-back
		return
	}
	if v := os.Getenv(EnvDelivery); v != "exactly_once" && v != "" && v != "at_least_once" {
		t.Fatalf("%s=%q: use exactly_once or at_least_once", EnvDelivery, v)
	}
	// ops-publication-gap and its messages variant run: the repair publishes
	// the gap's rows once (TestGapRepairExactlyOnce), and its Kafka
	// transaction waits until the stream passed every transaction whose rows
	// it read, so a gap transaction's messages join its rows (sink.Txn
	// HoldUntil).
	// dlq.mode is quarantine here too (the default): the redrive kinds run;
	// their checks are the at_least_once run's, and checkExactlyOnce counts
	// each event once aside (parked or dead-lettered) and once on its topic
	// after a redrive.
}

// withDelivery adds the exactly_once keys to the connector's configuration.
func withDelivery(yaml, prefix string) string {
	if !exactlyOnce() {
		return yaml
	}
	return strings.Replace(yaml, "kafka:\n", fmt.Sprintf("kafka:\n  delivery: exactly_once\n  positions_topic: %q\n",
		prefix+"-positions"), 1)
}

// isolation is how the suite's consumers read: read_committed in the
// exactly_once run, keeping the transaction markers so that a reader can
// tell it reached a partition's end.
func isolation() []kgo.Opt {
	if !exactlyOnce() {
		return nil
	}
	return []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords()}
}

// eosReport is what the exactly_once checks found.
type eosReport struct {
	Duplicates        int `json:"duplicates"`
	KafkaTransactions int `json:"kafka_transactions"` // distinct producer epochs among the records
	PGTransactions    int `json:"pg_transactions"`
	SplitTransactions int `json:"split_transactions"` // PostgreSQL transactions over more than one Kafka transaction
	// SplitBeforeDetection: split transactions committed between a
	// publication gap's removal and the exit of the process that found it
	// (detectionWindow), counted apart: docs/operations.md, "Exactly-once
	// delivery", says why they can be split.
	SplitBeforeDetection int `json:"split_before_gap_detection"`
	// SplitByDesign: transactions over several Kafka transactions that are
	// the parts the connector cut (splitByDesign), not counted as split;
	// byDesign holds each one's parts for the large-transaction check.
	SplitByDesign int `json:"split_by_design"`
	byDesign      map[pgTxn]int
	wholeRest     map[pgTxn]bool
	// RestKeptWhole: of those, the ones whose last part, committed by a
	// process started after the part before it, holds more than
	// kafka.max_buffered_records events (the rest kept whole after a
	// restart's read-back).
	RestKeptWhole int `json:"split_by_design_rest_kept_whole"`
	OrderBreaks   int `json:"order_breaks"`
}

func (er *eosReport) String() string {
	return fmt.Sprintf("exactly_once (read_committed): duplicates %d, PostgreSQL transactions %d in %d Kafka transactions, split %d "+
		"(and %d committed before the guard saw a publication gap, counted apart; %d committed in parts by design, %d of them with the rest kept whole after a restart), order breaks %d",
		er.Duplicates, er.PGTransactions, er.KafkaTransactions, er.SplitTransactions, er.SplitBeforeDetection, er.SplitByDesign, er.RestKeptWhole, er.OrderBreaks)
}

// checkExactlyOnce: no event twice; the events of each PostgreSQL
// transaction in one Kafka transaction (under KIP-890, each transaction has
// a producer epoch of its own), or, for one too large for a Kafka
// transaction, in the parts its headers name, each part in one
// (splitByDesign); per key, in partition order, seq 1, 2, 3, … (past the
// dead-lettered, lost and redriven ones, as the order check steps over)
func (o *observation) checkExactlyOnce(rep *Report, recs []copyRec, copies map[string][]copyRec, byID map[string]*event, dead deadSeqs, fail func(string, ...any)) {
	if !o.ExactlyOnce {
		return
	}
	er := &eosReport{byDesign: map[pgTxn]int{}, wholeRest: map[pgTxn]bool{}}
	rep.ExactlyOnce = er
	kafka := map[kTxn]bool{}
	of := map[pgTxn]map[kTxn]bool{}
	copiesOf := map[pgTxn][]copyRec{}
	committed := map[pgTxn]time.Time{}
	inWindow := o.detectionWindow()
	for id, all := range copies {
		// Also after a restore or a promotion and the refusal's fix: the
		// run after the tombstone reads back what Kafka holds (readback.go).
		extra, cs := o.eosCopies(id, all)
		if extra > 0 {
			er.Duplicates += extra
			if er.Duplicates <= 5 {
				fail("exactly_once: event %s has %d copies for read_committed: %s", id, len(all), o.copiesAt(all))
			}
		}
		e := byID[id]
		if e == nil {
			continue
		}
		k := pgTxn{e.Writer, e.Txn}
		if of[k] == nil {
			of[k] = map[kTxn]bool{}
		}
		committed[k] = e.Committed
		copiesOf[k] = append(copiesOf[k], cs...)
		for _, c := range cs {
			of[k][kTxn{c.Producer, c.Epoch}] = true
			kafka[kTxn{c.Producer, c.Epoch}] = true
		}
	}
	er.PGTransactions, er.KafkaTransactions = len(of), len(kafka)
	for k, ks := range of {
		if len(ks) < 2 {
			continue
		}
		parts, wholeRest, why := splitByDesign(copiesOf[k], o.restartedBetween)
		switch {
		case why == "":
			er.SplitByDesign++
			er.byDesign[k] = parts
			if wholeRest {
				er.RestKeptWhole++
				er.wholeRest[k] = true
			}
		case inWindow(committed[k]):
			er.SplitBeforeDetection++
		default:
			er.SplitTransactions++
			if er.SplitTransactions <= 5 {
				fail("exactly_once: writer %d transaction %d (committed %s) spread over %d Kafka transactions, not in parts: %s (%s)",
					k.writer, k.txn, committed[k].Format("15:04:05.000"), len(ks), why, o.faultAt(committed[k]))
			}
		}
	}
	last := map[string]int{}
	for _, c := range recs {
		if byID[c.ID] == nil {
			continue
		}
		if c.Seq != dead.next(c.Key, last[c.Key]) {
			er.OrderBreaks++
			if er.OrderBreaks <= 5 {
				fail("exactly_once: key %s seq %d after %d (%s/%d@%d appended %s, %s)", c.Key, c.Seq, last[c.Key], c.Topic, c.Partition, c.Offset,
					c.Append.Format("15:04:05.000"), o.faultAt(c.Append))
			}
		}
		last[c.Key] = c.Seq
	}
	if er.Duplicates > 5 || er.SplitTransactions > 5 || er.OrderBreaks > 5 {
		fail("exactly_once: %d duplicates, %d split transactions, %d order breaks in all", er.Duplicates, er.SplitTransactions, er.OrderBreaks)
	}
}

// eosCopies is how many copies of event id past one exactly_once allows
// (extra) and the copies of its first delivery, by which its PostgreSQL
// transaction's Kafka transactions are told. An event dead-lettered or
// parked has one copy aside (the dead-letter or parking topic) and, once a
// redrive republished it, one on its topic, in the redrive's own Kafka
// transaction: its first delivery is the copy aside. An event the parking
// retention deleted is published again by verify --repair, at least once
// by design (docs/operations.md): its copies are left out of the count.
func (o *observation) eosCopies(id string, cs []copyRec) (int, []copyRec) {
	var aside, own []copyRec
	for _, c := range cs {
		if c.Topic == o.ParkingTopic || c.Topic == o.DLQ {
			aside = append(aside, c)
		} else {
			own = append(own, c)
		}
	}
	first := own
	if len(aside) > 0 {
		first = aside[:1]
	}
	if o.Redrive.Lost[id] != "" {
		return 0, first
	}
	extra := max(0, len(aside)-1) + max(0, len(own)-1)
	if len(aside) > 0 && len(own) > 0 && !o.Redrive.Republished[id] {
		extra++ // on its topic and aside, without a redrive
	}
	return extra, first
}

// txnFaults are the EndTxn faults of the Kafka proxy: exactly_once only.
var txnFaults = []string{fNetKafkaForge, fNetKafkaSwallow, fNetKafkaAbort, fKafkaKillCommit}

// txnFault arms an EndTxn fault of the Kafka proxy: forged retriable
// answers for a while, or the next commit swallowed, or the next abort's
// answer cut (armed for at most 10s: aborts are rare in a healthy run), or
// the next commit's answer cut and the broker killed (killAfterCommit).
func (r *run) txnFault(ctx context.Context, kind string) (string, error) {
	p := env.brokerProxy
	forged0, swallowed0, aborts0 := p.TxnCounts()
	switch kind {
	case fKafkaKillCommit:
		return r.killAfterCommit(ctx)
	case fNetKafkaForge:
		d := r.between(time.Second, 4*time.Second)
		p.SetTxnFault(TxnForge)
		sleepCtx(ctx, d) // how long every commit answer is forged
		p.Heal()
		forged, _, _ := p.TxnCounts()
		return fmt.Sprintf("EndTxn commit answers forged as COORDINATOR_LOAD_IN_PROGRESS for %v: %d", d, forged-forged0), nil
	case fNetKafkaSwallow:
		p.SetTxnFault(TxnSwallow)
	default:
		p.SetTxnFault(TxnCutAbort)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, s, a := p.TxnCounts(); s > swallowed0 || a > aborts0 {
			break
		}
		sleepCtx(ctx, 20*time.Millisecond) // polls the proxy's counter
	}
	p.Heal()
	_, swallowed, aborts := p.TxnCounts()
	if kind == fNetKafkaSwallow {
		return fmt.Sprintf("EndTxn commits swallowed (connection reset): %d", swallowed-swallowed0), nil
	}
	return fmt.Sprintf("EndTxn aborts cut before the answer: %d (armed up to 10s)", aborts-aborts0), nil
}

// killAfterCommit cuts the answer of the next EndTxn commit (forwarded to
// the coordinator) and SIGKILLs the broker as soon as it is cut, down up to
// 2s: whether the commit was decided before the broker died, and when its
// markers are written after the restart, is the broker's; the connector
// must settle it without publishing its events twice.
func (r *run) killAfterCommit(ctx context.Context) (string, error) {
	p := env.brokerProxy
	cut0 := p.CommitsCut()
	p.SetTxnFault(TxnCutCommit)
	deadline := time.Now().Add(10 * time.Second)
	for p.CommitsCut() == cut0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Millisecond) // polls the proxy's counter: the kill follows the cut closely
	}
	p.Heal()
	if p.CommitsCut() == cut0 {
		return "no EndTxn commit within 10s: nothing cut, broker not killed", nil
	}
	if err := env.kafka.Kill(); err != nil {
		return "", err
	}
	down := time.Duration(r.rng.Int64N(int64(2 * time.Second)))
	sleepCtx(ctx, down) // the outage under test
	return fmt.Sprintf("EndTxn commit forwarded, its answer cut, SIGKILL; down %v before restart", down.Round(time.Millisecond)), restartKafka(ctx)
}

// detectionWindow reports whether a writer learned of a commit while the
// outbox was outside the publication and the process streaming then had
// not yet exited on it: that process decoded the transaction's rows written
// before the removal and its table-less events, and committed them in
// Kafka before the guard's reading found the gap; the repair after the
// restart publishes the rest in another Kafka transaction.
func (o *observation) detectionWindow() func(time.Time) bool {
	type span struct{ from, to time.Time }
	var spans []span
	incs := o.Incarnations
	for _, f := range o.Faults {
		if !gapKind(f.Kind) {
			continue
		}
		for _, in := range incs {
			if in.Reason == reasonAfterGap && in.Start.After(f.Start) {
				spans = append(spans, span{f.Start, in.Start})
				break
			}
		}
	}
	return func(at time.Time) bool {
		for _, s := range spans {
			if !at.Before(s.from) && !at.After(s.to) {
				return true
			}
		}
		return false
	}
}

// copiesAt names where and when each copy was appended, and the faults
// under way then, for a duplicate's failure line.
func (o *observation) copiesAt(cs []copyRec) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s/%d@%d at %s (%s)", c.Topic, c.Partition, c.Offset, c.Append.Format("15:04:05.000"), o.faultAt(c.Append))
	}
	return strings.Join(parts, "; ")
}
