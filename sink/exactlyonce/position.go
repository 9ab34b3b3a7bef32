package exactlyonce

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// PositionKey is the source identity the position is kept under: the
// cluster's system identifier, the database and the slot. The timeline is
// left out: positions stay comparable across a promotion.
func PositionKey(systemID, database, slot string) string {
	return kafka.SourceKey(systemID, database, slot)
}

// Position is the value of a position record. Its key (PositionKey) is the
// identity a checkpoint has; the timeline completes it, so that a start can
// tell a position this server never had (a restore, a promoted standby that
// was behind) from one it has (replication.CheckCommitted).
type Position struct {
	LSN       lsn.LSN   `json:"lsn"` // end of the last PostgreSQL transaction committed
	Source    string    `json:"source"`
	Committed time.Time `json:"committed_at"`
	// Timeline is the one the stream was on when the position was
	// committed; 0 in records of versions before it.
	Timeline int32 `json:"timeline,omitempty"`
	// Txn numbers the Kafka transactions of the transactional id, strictly
	// increasing across attempts and instances: a commit whose answer was
	// lost committed if and only if the committed record carries its number
	// (wasCommitted). The end LSN cannot tell: a snapshot's or a gap repair's
	// transaction carries a position already committed.
	Txn uint64 `json:"txn,omitempty"`
	// Instance names the process that committed it (random at start), so
	// that a settle can tell its own commit from another instance's
	// (settleFenced); "" in records of versions before it.
	Instance string `json:"instance,omitempty"`
	// Mark proves that the server's history has every position up to
	// MarkAt (replication/marks.go); 0 in records of versions before it
	// and without marks (PostgreSQL 13): the start checks the WAL end only.
	Mark   uint64  `json:"mark,omitempty"`
	MarkAt lsn.LSN `json:"mark_at,omitempty"`
	// MarkTime is the commit time of the mark's transaction, when it was
	// decoded: what lies past MarkAt committed after it.
	MarkTime time.Time `json:"mark_time,omitzero"`
	// Topics are the topics this source's transactions wrote to lately,
	// this one's among them (at most maxTopics): a start or settle looks
	// for a hanging transaction on their partitions (hanging.go). Empty in
	// records of versions before it: the positions partition alone.
	Topics []string `json:"topics,omitempty"`
	// Part: the first events of the PostgreSQL transaction after LSN are
	// committed too (a transaction committed in parts, split.go); nil when
	// LSN ends the last transaction committed, and in records of versions
	// before it.
	Part *Part `json:"part,omitempty"`
}

// positionRecord is the record that commits end, and part, with
// transaction txn.
func (t *Txn) positionRecord(end lsn.LSN, txn uint64, part *Part) (*kgo.Record, error) {
	pos := Position{LSN: end, Source: t.cfg.Source, Committed: time.Now().UTC(),
		Timeline: t.timeline.Load(), Txn: txn, Instance: t.instance, Topics: t.topicsWritten(), Part: part}
	t.mu.Lock()
	handed := end <= t.end // this run handed it over, so decoded it
	t.mu.Unlock()
	switch {
	case !handed:
		pos.Mark, pos.MarkAt, pos.MarkTime = t.prior.Mark, t.prior.MarkAt, t.prior.MarkTime
	case t.cfg.Proof != nil:
		pos.Mark, pos.MarkAt, pos.MarkTime = t.cfg.Proof()
	}
	v, err := json.Marshal(pos)
	if err != nil {
		return nil, fmt.Errorf("position record: %w", err)
	}
	return &kgo.Record{Topic: t.cfg.Positions, Key: []byte(t.cfg.Source), Value: v, Partition: -1}, nil
}
