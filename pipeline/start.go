package pipeline

import "github.com/outbox-cdc/outbox-cdc/lsn"

// startReadings are what a run's start is decided from, each one already
// trusted by the server's checks (replication.CheckPosition for the
// checkpoint, trustCommitted for the position committed to Kafka): a
// position the server cannot have reached is refused before it gets here.
type startReadings struct {
	slot    lsn.LSN // the slot's confirmed position
	created bool    // this run created the slot
	// ckpt is the checkpoint's position; zero when there is none, or it
	// was set aside (a slot this run created).
	ckpt lsn.LSN
	// committed is exactly_once's position committed to Kafka; zero when
	// there is none (or at_least_once).
	committed lsn.LSN
}

// startAt is where a run starts, and which reading decided it.
type startAt struct {
	// stream is where PostgreSQL streams from.
	stream lsn.LSN
	// skip: transactions committing below it were delivered already and
	// are decoded but not published; the tracker's first watermark.
	skip lsn.LSN
	from string // "slot", "checkpoint" or "kafka"
}

// decideStart is the one place the start is decided. The slot goes back
// after a PostgreSQL crash, or by the replay window (postgres.retain), so a
// later checkpoint means what lies between was acknowledged: streaming
// starts there. In exactly_once everything up to the committed position is
// in Kafka, committed: it is skipped, but the stream still starts at the
// slot or checkpoint, because the hold and a gap repair need what lies
// between decoded (hold.go).
func decideStart(r startReadings) startAt {
	st := startAt{stream: r.slot, from: "slot"}
	if r.ckpt > st.stream {
		st.stream, st.from = r.ckpt, "checkpoint"
	}
	st.skip = st.stream
	if r.committed > st.skip {
		st.skip, st.from = r.committed, "kafka"
	}
	return st
}

// logStart says, once, which reading decided the start.
func (p *Pipeline) logStart(r startReadings, st startAt) {
	switch st.from {
	case "checkpoint":
		p.log.Info("resuming after the checkpoint", "checkpoint", r.ckpt, "slot_confirmed", r.slot)
	case "kafka":
		p.log.Info("resuming after the position committed to Kafka", "committed", r.committed,
			"slot_or_checkpoint", st.stream)
	}
}
