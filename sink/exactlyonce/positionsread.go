package exactlyonce

import (
	"encoding/json"
	"log/slog"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

// positionsRead is what a read of the positions topic learned of this
// source: the position it returns, and the last transaction that carried
// one of its position records, whatever its outcome (the one a hang check
// starts from).
type positionsRead struct {
	source string
	topic  string
	log    *slog.Logger

	pos    Position // the last committed: what the read returns
	before Position // the committed one before the last transaction: where an abort of it leaves the source
	last   lastTxn
	// outcomes are the outcomes of this source's transactions the read
	// saw, by producer id and epoch; unknown where they disagree (one
	// epoch for several transactions: transaction version 1).
	outcomes map[pidEpoch]txnOutcome
}

type pidEpoch struct {
	pid   int64
	epoch int16
}

// lastTxn is the last transaction with a position record of this source.
type lastTxn struct {
	rec     *kgo.Record // its position record; nil: none
	pos     Position
	outcome txnOutcome              // its marker's; unknown while it hangs
	hanging *topicread.HangingError // its records open on the positions partition, the coordinator done with it
}

func newPositionsRead(source, topic string, log *slog.Logger) *positionsRead {
	return &positionsRead{source: source, topic: topic, log: log, outcomes: map[pidEpoch]txnOutcome{}}
}

func (s *positionsRead) ours(r *kgo.Record) bool { return string(r.Key) == s.source }

// committed takes a committed record (topicread's fn).
func (s *positionsRead) committed(r *kgo.Record) error {
	if !s.ours(r) {
		return nil
	}
	if r.Value == nil {
		// A tombstone: an operator forgot the position.
		s.pos, s.before, s.last = Position{}, Position{}, lastTxn{}
		return nil
	}
	p, ok := s.decode(r)
	if !ok {
		return nil
	}
	s.note(r, outcomeCommitted)
	s.before, s.pos = s.pos, p
	s.last = lastTxn{rec: r, pos: p, outcome: outcomeCommitted}
	return nil
}

// aborted takes an aborted record (topicread.Await.Aborted).
func (s *positionsRead) aborted(r *kgo.Record) {
	if !s.ours(r) {
		return
	}
	p, ok := s.decode(r)
	if !ok {
		return
	}
	s.note(r, outcomeAborted)
	s.before = s.pos
	s.last = lastTxn{rec: r, pos: p, outcome: outcomeAborted}
}

// hang takes the read's end on a hanging transaction: its last position
// record is the last transaction's.
func (s *positionsRead) hang(h *topicread.HangingError) {
	s.before = s.pos
	s.last = lastTxn{outcome: outcomeUnknown, hanging: h}
	for _, r := range h.Held {
		if p, ok := s.decode(r); ok {
			s.last.rec, s.last.pos = r, p
		}
	}
}

func (s *positionsRead) note(r *kgo.Record, o txnOutcome) {
	k := pidEpoch{r.ProducerID, r.ProducerEpoch}
	if was, seen := s.outcomes[k]; seen && was != o {
		o = outcomeUnknown
	}
	s.outcomes[k] = o
}

func (s *positionsRead) decode(r *kgo.Record) (Position, bool) {
	var p Position
	if err := json.Unmarshal(r.Value, &p); err != nil {
		s.log.Warn("kafka: ignoring an unreadable position record", "topic", s.topic, "offset", r.Offset, "err", err)
		return Position{}, false
	}
	return p, true
}

// topics are the topics the last transaction's records name (Position.Topics),
// the positions topic left out: the read has it.
func (s *positionsRead) topics() []string {
	var out []string
	add := func(p Position) {
		for _, t := range p.Topics {
			if t != s.topic && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	add(s.last.pos)
	if h := s.last.hanging; h != nil {
		for _, r := range h.Held {
			if p, ok := s.decode(r); ok {
				add(p)
			}
		}
	}
	slices.Sort(out)
	return out
}
