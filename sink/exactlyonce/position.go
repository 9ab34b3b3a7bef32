package exactlyonce

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// PositionKey is the source identity the position is kept under: the
// cluster's system identifier, the database and the slot. The timeline is
// left out: positions stay comparable across a promotion.
func PositionKey(systemID, database, slot string) string {
	return systemID + "/" + database + "/" + slot
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
}

// positionRecord is the record that commits end with transaction txn.
func (t *Txn) positionRecord(end lsn.LSN, txn uint64) (*kgo.Record, error) {
	v, err := json.Marshal(Position{LSN: end, Source: t.cfg.Source, Committed: time.Now().UTC(),
		Timeline: t.timeline.Load(), Txn: txn, Instance: t.instance})
	if err != nil {
		return nil, fmt.Errorf("position record: %w", err)
	}
	return &kgo.Record{Topic: t.cfg.Positions, Key: []byte(t.cfg.Source), Value: v, Partition: -1}, nil
}
