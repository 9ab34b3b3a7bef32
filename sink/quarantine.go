package sink

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// The producer's side of package quarantine (dlq.mode quarantine): it
// calls the set where its decisions depend on it: no record reaches the
// client before the set is restored (awaitRestore), a dead letter starts
// a quarantine (quarantine), a record of a quarantined key is parked or
// held (divert), and the dead letter that started one gets its outcome
// once the quarantine is saved (settle).

// openQuarantine makes the set when cfg parks (ParkingTopic set); conn
// are the cluster and security options, codec kafka.compression.
func (s *Sink) openQuarantine(cfg Config, conn []kgo.Opt, codec kgo.CompressionCodec) {
	if cfg.ParkingTopic == "" {
		ready := make(chan struct{})
		close(ready) // nothing to restore
		s.restored = ready
		return
	}
	s.q = quarantine.New(s.ctx, cfg.QuarantineConfig(conn, codec, s.meta.Replication()), s.cl, s.log)
	s.restored = s.q.Ready()
}

// QuarantineConfig is the quarantine's configuration (dlq.mode
// quarantine) for a producer of cfg: conn are the cluster and security
// options, codec kafka.compression, replication the state topic's.
func (cfg Config) QuarantineConfig(conn []kgo.Opt, codec kgo.CompressionCodec, replication int16) quarantine.Config {
	return quarantine.Config{Parking: cfg.ParkingTopic, DLQ: cfg.DLQTopic, Max: cfg.MaxQuarantined,
		Topic: cfg.QuarantineTopic, Source: cfg.QuarantineSource, Owner: cfg.Owner, Fail: cfg.Fail, Report: cfg.Redrives,
		Conn: conn, Codec: codec, Replication: replication, Contracts: cfg.Contracts}
}

// StartQuarantines restores the quarantines saved on the state topic and
// follows it for redrive requests (quarantine.Set.Start). Call it before
// the first Produce; without a state topic it does nothing.
func (s *Sink) StartQuarantines(ctx context.Context) error {
	if s.q == nil {
		return nil
	}
	return s.q.Start(ctx)
}

// Quarantined lists the quarantined aggregates, in no particular order:
// the producer's own view, the only one without a state topic, and with
// the records this process parked for each (the state topic, which
// outbox-cdc redrive --list reads, keeps no count). Empty without a
// parking topic.
func (s *Sink) Quarantined() []quarantine.Quarantine {
	if s.q == nil {
		return []quarantine.Quarantine{}
	}
	return s.q.Quarantined()
}

// Holding reports whether key's new records wait: its quarantine is being
// saved or redriven (quarantine.Set.Holding).
func (s *Sink) Holding(key string) bool { return s.q != nil && s.q.Holding(key) }

// awaitRestore waits until the quarantines are restored (at once without
// a state topic), ctx ends or the sink closes.
func (s *Sink) awaitRestore(ctx context.Context) error {
	select {
	case <-s.restored:
		return nil
	default:
	}
	select {
	case <-s.restored:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return kgo.ErrClientClosed
	}
}

// quarantine starts a quarantine for r's key as r is dead-lettered,
// unless the sink only skips (no parking topic).
func (s *Sink) quarantine(r *record, reason string, seq uint64) error {
	if s.q == nil {
		return nil
	}
	// Under the producer's lock, so that no earlier record of the key is
	// handed over between the quarantine's start and passEarlier.
	s.mu.Lock()
	defer s.mu.Unlock()
	began, err := s.q.Begin(r, r.Orig(), reason)
	if began {
		s.passEarlier(string(r.Key), seq)
	}
	return err
}

// passEarlier lets the records of key produced before seq (the dead
// letter's place in Produce order; 0: a dead letter not submitted yet, so
// every record waiting) that still wait for their topic (held for its
// metadata, or in a repair's retry list) go to their own topic: parking
// them would put them behind the dead letter whose quarantine just began.
// Called with s.mu held.
func (s *Sink) passEarlier(key string, seq uint64) {
	for _, t := range s.topics {
		for _, q := range [][]*record{t.held, t.retry} {
			for _, r := range q {
				if string(r.Key) == key && !r.DeadLettered() && !r.parked && (seq == 0 || r.seq < seq) {
					r.qm.PassEarlier()
				}
			}
		}
	}
}

// divert sends r to the parking topic when its key is quarantined, or
// holds it while the quarantine is being saved or redriven (the set's
// Route decides). Called with s.mu held, in Produce order for each key
// (see submit and handOver).
func (s *Sink) divert(r *record) quarantine.Routing {
	if s.q == nil || r.DeadLettered() || r.parked {
		return quarantine.Pass
	}
	orig := r.Topic
	how := s.q.Route(r)
	if how == quarantine.Park {
		r.parked = true
		r.err, r.alone, r.resent = nil, false, false
		r.Rerouted(orig)
	}
	return how
}

// The record as package quarantine sees it (quarantine.Record).

func (r *record) Kafka() *kgo.Record     { return &r.Record }
func (r *record) Mark() *quarantine.Mark { return &r.qm }
func (r *record) Fail(err error)         { r.finish(Outcome{Err: err}) }

// Resubmit hands a record the quarantine held back to the sink; park
// parks it first: its own topic may be under repair, with later records
// of the key in its retry list.
func (r *record) Resubmit(park bool) {
	s := r.sink
	if park {
		s.mu.Lock()
		s.divert(r)
		s.mu.Unlock()
	}
	_ = s.submit(r, false)
}

// NewStateClient connects to cfg's cluster for cfg.QuarantineTopic and the
// keys of cfg.QuarantineSource, for the command line (outbox-cdc redrive).
func NewStateClient(cfg Config) (*quarantine.StateClient, error) {
	conn, err := cfg.ConnOpts()
	if err != nil {
		return nil, err
	}
	return quarantine.NewStateClient(conn, kafka.NewPartitioner(), cfg.QuarantineTopic, cfg.QuarantineSource, cfg.TestOpts...)
}
