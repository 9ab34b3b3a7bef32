package exactlyonce

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// TestDecideHang: every case of the decision table (decideHang's comment):
// the coordinator's outcome, the positions partition and an event
// partition, marked or hanging; an acknowledged transaction; one whose
// markers are still being written.
func TestDecideHang(t *testing.T) {
	pp := func(s partState) partReading { return partReading{Topic: "positions", State: s, Start: 7} }
	ev := func(p int32, s partState) partReading {
		return partReading{Topic: "orders", Partition: p, State: s, Start: 40}
	}
	const (
		c, a, u = outcomeCommitted, outcomeAborted, outcomeUnknown
		m, h    = partMarked, partHanging
	)
	for _, tc := range []struct {
		name      string
		outcome   txnOutcome
		acked     ackState
		positions partState
		events    []partReading
		want      hangAction
		hanging   string
		checkSlot bool
	}{
		{"committed, all marked", c, ackUnknown, m, []partReading{ev(0, m), ev(1, m)}, hangNone, "[]", false},
		{"committed, one event partition hangs", c, ackNo, m, []partReading{ev(0, m), ev(1, h)}, hangCommit, "[orders/1]", false},
		{"committed, only the positions partition hangs", c, ackNo, h, []partReading{ev(0, m)}, hangCommit, "[positions/0]", false},
		{"committed, all hang, not acknowledged", c, ackNo, h, []partReading{ev(0, h), ev(1, h)}, hangAbort, "[positions/0 orders/0 orders/1]", false},
		{"committed, all hang, acknowledged", c, ackYes, h, []partReading{ev(0, h)}, hangCommit, "[positions/0 orders/0]", false},
		{"committed, all hang, acknowledgement not known", c, ackUnknown, h, []partReading{ev(0, h)}, hangAbort, "[positions/0 orders/0]", true},
		{"aborted, all marked", a, ackNo, m, []partReading{ev(0, m)}, hangNone, "[]", false},
		{"aborted, one event partition hangs", a, ackNo, m, []partReading{ev(0, m), ev(1, h)}, hangAbort, "[orders/1]", false},
		{"aborted, the positions partition hangs", a, ackNo, h, []partReading{ev(0, m)}, hangAbort, "[positions/0]", false},
		{"aborted, all hang", a, ackUnknown, h, []partReading{ev(0, h)}, hangAbort, "[positions/0 orders/0]", false},
		{"not known, positions hangs, an event partition marked", u, ackNo, h, []partReading{ev(0, m), ev(1, h)}, hangUnknown, "[positions/0 orders/1]", false},
		{"not known, all hang", u, ackNo, h, []partReading{ev(0, h)}, hangAbort, "[positions/0 orders/0]", false},
		{"not known, all hang, acknowledged: committed", u, ackYes, h, []partReading{ev(0, h)}, hangCommit, "[positions/0 orders/0]", false},
		{"not known, an older transaction's partition hangs", u, ackUnknown, m, []partReading{ev(0, h)}, hangUnknown, "[orders/0]", false},
		{"partitions it did not write to do not count", c, ackNo, h, []partReading{ev(0, partOther), ev(1, h)}, hangAbort, "[positions/0 orders/1]", false},
		{"a pending partition is read again", c, ackNo, h, []partReading{ev(0, partPending), ev(1, h)}, hangWait, "[]", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decideHang(txnReading{Outcome: tc.outcome, Acked: tc.acked, Positions: pp(tc.positions), Events: tc.events})
			if d.Action != tc.want || partNames(d.Hanging) != tc.hanging || d.CheckSlot != tc.checkSlot {
				t.Fatalf("decideHang = action %d on %s (check slot %v), want %d on %s (check slot %v)",
					d.Action, partNames(d.Hanging), d.CheckSlot, tc.want, tc.hanging, tc.checkSlot)
			}
		})
	}
}

func partNames(ps []partReading) string {
	out := []string{}
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
	}
	return fmt.Sprint(out)
}

// TestReadingsOf: DescribeProducers' entries against the coordinator make
// each partition's part (open and no longer listed: hanging; listed:
// pending; no open one at the next epoch: the transaction's own marker,
// transaction version 2), per transaction (an older epoch open somewhere is
// its own, with the outcome the positions read saw), and the outcome of a
// hanging last one comes from the coordinator's reading before the fence.
func TestReadingsOf(t *testing.T) {
	const pid = 7
	rec := func(epoch int16) *kgo.Record { return &kgo.Record{ProducerID: pid, ProducerEpoch: epoch} }
	open := func(p int32, epoch int16) producerState {
		return producerState{Topic: "orders", Partition: p, Found: true, Open: true, Start: 40, Epoch: epoch}
	}
	done := func(p int32, epoch int16) producerState {
		return producerState{Topic: "orders", Partition: p, Found: true, Start: -1, Epoch: epoch}
	}
	empty := coordState{Known: true, State: "Empty", ProducerID: pid, Epoch: 9}
	for _, tc := range []struct {
		name string
		last lastTxn
		seen map[pidEpoch]txnOutcome
		in   hangInputs
		want string // per transaction: outcome, positions and event parts
	}{
		{"committed at 5: one partition marked (epoch 6), one hanging, one not written",
			lastTxn{rec: rec(5), outcome: outcomeCommitted}, nil,
			hangInputs{pid: pid, coord: empty, parts: []producerState{done(0, 6), open(1, 5), done(2, 3)}},
			"[{committed positions:marked [marked hanging other]}]"},
		{"the coordinator still lists it: pending",
			lastTxn{rec: rec(5), outcome: outcomeAborted}, nil,
			hangInputs{pid: pid, coord: coordState{Known: true, State: "PrepareAbort", ProducerID: pid, Epoch: 6,
				Listed: map[string]map[int32]bool{"orders": {1: true}}}, parts: []producerState{open(1, 5)}},
			"[{aborted positions:marked [pending]}]"},
		{"the coordinator did not answer: pending",
			lastTxn{rec: rec(5), outcome: outcomeAborted}, nil,
			hangInputs{pid: pid, parts: []producerState{open(1, 5)}},
			"[{aborted positions:marked [pending]}]"},
		{"hanging on the positions partition: the coordinator's outcome before the fence",
			lastTxn{rec: rec(5), hanging: &topicread.HangingError{Topic: "positions", Held: []*kgo.Record{rec(5)}}}, nil,
			hangInputs{pid: pid, coord: empty, before: coordState{Known: true, State: "CompleteCommit", ProducerID: pid, Epoch: 6},
				parts: []producerState{open(0, 5)}},
			"[{committed positions:hanging [hanging]}]"},
		{"an older transaction open at epoch 3: its own reading, with the outcome the read saw",
			lastTxn{rec: rec(5), outcome: outcomeCommitted}, map[pidEpoch]txnOutcome{{pid, 3}: outcomeAborted},
			hangInputs{pid: pid, coord: empty, parts: []producerState{open(0, 3), done(1, 6)}},
			"[{committed positions:marked [other marked]} {aborted positions:marked [hanging other]}]"},
		{"another producer id's open transaction is not this source's",
			lastTxn{rec: rec(5), outcome: outcomeCommitted}, nil,
			hangInputs{pid: pid, coord: empty, parts: []producerState{{Topic: "orders", Partition: 0}}},
			"[{committed positions:marked [other]}]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &positionsRead{topic: "positions", last: tc.last, outcomes: tc.seen}
			if s.outcomes == nil {
				s.outcomes = map[pidEpoch]txnOutcome{}
			}
			var got []string
			for _, r := range readingsOf(s, tc.in) {
				var evs []string
				for _, e := range r.Events {
					evs = append(evs, stateName(e.State))
				}
				got = append(got, fmt.Sprintf("{%s positions:%s %v}", outcomeName(r.Outcome), stateName(r.Positions.State), evs))
			}
			if fmt.Sprint(got) != tc.want {
				t.Fatalf("readingsOf = %v, want %s", got, tc.want)
			}
		})
	}
}

func stateName(s partState) string {
	return [...]string{"other", "marked", "hanging", "pending"}[s]
}

func outcomeName(o txnOutcome) string {
	return [...]string{"unknown", "committed", "aborted"}[o]
}
