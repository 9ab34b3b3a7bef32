package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-cdc/outbox-cdc/internal/fault"
	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/replication"
)

// prepareMarks sets up the history marks (replication/marks.go) and the
// run's history: marks need PostgreSQL 14 (pgoutput sends logical messages
// from 14 on), and a standby writes them through postgres.primary_dsn.
func (su *starter) prepareMarks(ctx context.Context, pl *plan) error {
	p := su.p
	src := p.cfg.Source
	if p.cfg.MarksTable == "" {
		p.history = newHistory(nil)
		return nil
	}
	major, err := src.DB.Major(ctx)
	if err != nil {
		return err
	}
	if major < replication.MarksVersion {
		p.log.Warn("PostgreSQL 13 decodes no history marks: a saved position is checked against the server's WAL end only, "+
			"which a restore from an older copy passes again once the application writes (docs/operations.md, Restores)",
			"fix", "upgrade PostgreSQL to 14 or later")
		p.history = newHistory(nil)
		return nil
	}
	pl.marks = replication.NewMarks(src, p.cfg.MarksTable)
	if pl.standby && src.Primary == nil {
		// Read on the standby, never written: positions are checked
		// against the WAL end only.
		p.log.Warn("history marks are not written: the server is a standby and postgres.primary_dsn is not set; "+
			"a saved position is checked against the server's WAL end only", "fix", "set postgres.primary_dsn")
		p.history = newHistory(nil)
		return nil
	}
	id, below, err := pl.marks.Prepare(ctx)
	if err != nil {
		return err
	}
	pl.readings.fresh = markReading{id: id, at: below, found: true}
	p.history = newHistory(pl.marks)
	if s, ok := p.cfg.Checkpoints.(interface{ SetMarks(string) }); ok {
		s.SetMarks(pl.marks.Table())
	}
	return nil
}

// freshMark writes the run's own mark again (history.fresh).
func (su *starter) freshMark(ctx context.Context, pl *plan) error {
	id, below, err := pl.marks.Write(ctx)
	if err != nil {
		return err
	}
	pl.readings.fresh = markReading{id: id, at: below, found: true}
	return nil
}

// readMark reads whether the server has a saved position's mark. A
// standby replays what the primary wrote a little later, and from a
// restartpoint after its own restart: it is given standbyMarkWait to show
// a mark before the reading says it lacks it (a refusal is for good).
func readMark(ctx context.Context, pl *plan, id uint64, at lsn.LSN, commit time.Time) (markReading, error) {
	r := markReading{id: id, at: at, commit: commit}
	if id == 0 || pl.marks == nil {
		r.id = 0 // without marks on this server, the WAL-end checks alone
		return r, nil
	}
	for wait := time.Now().Add(standbyMarkWait); ; {
		found, err := pl.marks.Present(ctx, id)
		if err != nil || found || !pl.standby || time.Now().After(wait) {
			r.found = found
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// standbyMarkWait is how long a standby may take to replay a mark (as the
// stream's, replication.checkMark).
const standbyMarkWait = time.Minute

// refuseStart turns a saved position the server's history lacks into the
// refusal with its fix.
func (su *starter) refuseStart(pl *plan, err error) error {
	p := su.p
	var nh *notInHistory
	if !errors.As(err, &nh) {
		return err
	}
	fix := "to stream from the slot's confirmed position (what the restored server committed after it is published; what " +
		"was published from the lost history stays in Kafka), drop the checkpoint: "
	if nh.what == "kafka" {
		fix = fmt.Sprintf("to stream from the slot's confirmed position, forget the position with a tombstone for its key "+
			"(kafka-console-producer.sh --bootstrap-server %s --topic %s --property parse.key=true "+
			"--property key.separator='|' --property null.marker=NULL <<< '%s|NULL'); "+
			"the first transactions are then looked up in Kafka before they are published",
			strings.Join(p.cfg.Sink.Brokers, ","), p.cfg.ExactlyOnce.PositionsTopic, pl.positionKey)
	} else if pl.checkpoints != nil {
		fix += pl.checkpoints.Forget()
	}
	return &fault.PrerequisiteError{Problem: nh.Error(), Fix: fix + " (docs/operations.md, Restores)"}
}

// markProof is the proof the transactional sink records with each position.
func (p *Pipeline) markProof() (uint64, lsn.LSN, time.Time) {
	pr := p.history.proven()
	return pr.mark, pr.at, pr.commit
}
