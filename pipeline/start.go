package pipeline

import (
	"fmt"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// startReadings are what a run's start is decided from. The checks of the
// server (replication.CheckPosition, trustCommitted) already refused a
// position beyond its WAL end or past a fork of its timeline; a WAL end
// that moved past the position again proves nothing, so the marks decide
// the rest.
type startReadings struct {
	slot    lsn.LSN // the slot's confirmed position: the server's own, restored with it
	created bool    // this run created the slot
	// ckpt is the checkpoint's position; zero when there is none, or it
	// was set aside (a slot this run created).
	ckpt     lsn.LSN
	ckptMark markReading
	// committed is exactly_once's position committed to Kafka; zero when
	// there is none (or at_least_once).
	committed     lsn.LSN
	committedMark markReading
	// fresh is the mark this run wrote before it streams (marks.Prepare):
	// it proves every position up to its at that the run decodes, so a
	// start no saved mark proves has a proof from the first position on.
	fresh markReading
}

// markReading is a saved position's history mark and whether the server
// has it (replication/marks.go).
type markReading struct {
	id     uint64    // 0: none recorded (PostgreSQL 13, an older version)
	at     lsn.LSN   // the mark proves every position up to it
	commit time.Time // its transaction's commit time, when known
	found  bool
}

// proves reports whether the reading proves pos: its mark is on the
// server, decoded at or past pos.
func (m markReading) proves(pos lsn.LSN) bool { return m.id != 0 && m.found && m.at >= pos }

// startAt is where a run starts, and which reading decided it.
type startAt struct {
	// stream is where PostgreSQL streams from.
	stream lsn.LSN
	// skip: transactions committing below it were delivered already and
	// are decoded but not published; the tracker's first watermark.
	skip lsn.LSN
	from string // "slot", "checkpoint", "kafka" or "kafka-proof"
	// proof proves skip; a reconnect resumes no later than it (history.go).
	proof proof
	// readBack: the transactions between skip and the committed position
	// are in Kafka unless the server's history left them: each is looked up
	// there before it is published (readback.go).
	readBack bool
}

// notInHistory is a saved position whose mark the server lacks.
type notInHistory struct {
	what string // "checkpoint" or "kafka"
	pos  lsn.LSN
	mark uint64
}

func (e *notInHistory) Error() string {
	return fmt.Sprintf("the %s position %v is not in this server's history: the server lacks history mark %d, written after it "+
		"was reached (the server was restored from an older copy, a point-in-time restore or a promotion left that history, "+
		"or the %s belongs to another deployment); this stays so whatever the server's WAL end becomes", e.what, e.pos, e.mark, e.what)
}

// decideStart is the one place the start is decided. The slot goes back
// after a PostgreSQL crash, or by the replay window (postgres.retain), so a
// later checkpoint means what lies between was acknowledged: streaming
// starts there. In exactly_once everything up to the committed position is
// in Kafka, committed: it is skipped, but the stream still starts at the
// slot or checkpoint, because the hold and a gap repair need what lies
// between decoded (hold.go).
//
// A saved position counts only in this server's history: one whose mark the
// server lacks is refused, for good (a restore to before the mark never
// gets it back). A marked exactly_once position beyond its mark is trusted
// up to the mark, and what lies past it is read back from Kafka. A position
// without a mark (PostgreSQL 13, an older version) was checked against the
// WAL end alone; the slot's own position is the server's.
func decideStart(r startReadings) (startAt, error) {
	st, err := decideSaved(r)
	if err == nil && st.proof.mark == 0 && r.fresh.proves(st.proof.at) {
		st.proof.mark = r.fresh.id
	}
	return st, err
}

// decideSaved decides from the slot and the saved positions.
func decideSaved(r startReadings) (startAt, error) {
	st := startAt{stream: r.slot, from: "slot", proof: proof{at: r.slot}}
	// A checkpoint behind the slot decides nothing: the slot is the
	// server's own, restored with it.
	if r.ckpt > st.stream && r.ckptMark.id != 0 && !r.ckptMark.found {
		return startAt{}, &notInHistory{what: "checkpoint", pos: r.ckpt, mark: r.ckptMark.id}
	}
	if r.ckpt > st.stream {
		st.stream, st.from = r.ckpt, "checkpoint"
	}
	if r.ckpt != 0 && r.ckptMark.proves(st.stream) {
		st.proof = proof{mark: r.ckptMark.id, at: st.stream}
	}
	st.proof.at, st.skip = st.stream, st.stream
	if r.committed == 0 {
		return st, nil
	}
	m := r.committedMark
	switch {
	case r.committed <= st.skip: // decides nothing
	case m.id != 0 && !m.found:
		return startAt{}, &notInHistory{what: "kafka", pos: r.committed, mark: m.id}
	case m.id == 0 || m.at >= r.committed:
		st.skip, st.from = r.committed, "kafka"
		st.proof = proof{mark: m.id, at: r.committed}
	case m.at > st.skip:
		st.skip, st.from, st.readBack = m.at, "kafka-proof", true
		st.proof = proof{mark: m.id, at: m.at, commit: m.commit}
	default:
		st.from, st.readBack = "kafka-proof", true
	}
	return st, nil
}

// logStart says, once, which reading decided the start.
func (su *starter) logStart(r startReadings, st startAt) {
	p := su.p
	switch st.from {
	case "checkpoint":
		p.log.Info("resuming after the checkpoint", "checkpoint", r.ckpt, "slot_confirmed", r.slot)
	case "kafka":
		p.log.Info("resuming after the position committed to Kafka", "committed", r.committed,
			"slot_or_checkpoint", st.stream, "history_mark", r.committedMark.id, "mark_found", r.committedMark.found,
			"mark_at", r.committedMark.at)
	case "kafka-proof":
		p.log.Info("resuming after the position committed to Kafka that the server's history proves; what lies past it "+
			"up to the committed position is looked up in Kafka before it is published", "committed", r.committed,
			"proven", st.skip, "mark", r.committedMark.id)
	}
}
