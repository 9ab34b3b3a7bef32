// Package quarantine keeps an aggregate's events behind its dead letter
// (dlq.mode quarantine): once one event of a key is dead-lettered, the
// key's later events are parked on the parking topic, in order, until an
// operator redrives or skips it. The set is saved on the compacted state
// topic (state.go) and a redrive is carried out here (redrive.go).
//
// The producer (package sink) calls a Set at its decision points: Ready
// (no record reaches Kafka before the saved set is restored), Begin (a
// record is dead-lettered), Route (park or hold a record of a quarantined
// key) and Save (the dead letter that began a quarantine is acknowledged).
// It sees the producer's records only through Record.
package quarantine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/kafkaopt"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/kafka"
)

// Header names the quarantine a parked record belongs to: the id of the
// event whose dead letter started it (its key when it has none).
const Header = "quarantine"

// Quarantine is an aggregate (a record key) whose later events are parked
// because one of its events was dead-lettered: delivering them would let
// them overtake it.
type Quarantine struct {
	Key     string    `json:"key"`
	FirstID string    `json:"first_id"` // id header of the dead-lettered event
	Reason  string    `json:"reason"`
	Topic   string    `json:"topic"` // the dead-lettered event's topic ("" for the router's refusals)
	Since   time.Time `json:"since"`
	Parked  int64     `json:"-"` // records parked so far by this process
}

// Config is the quarantine's part of the producer's configuration.
type Config struct {
	Parking string // kafka.parking_topic
	DLQ     string // kafka.dlq_topic, where a redrive reads the dead letter
	Max     int    // dlq.max_quarantined; 0 means the default
	// Topic is the state topic (kafka.quarantine_topic), Source this
	// connector's key prefix on it; Topic "" keeps the set in memory.
	Topic, Source string
	Owner         func() bool                // nil: always (sink.Config.Owner)
	Fail          func(error)                // sink.Config.Fail
	Report        func(result string, n int) // sink.Config.Redrives
	// Conn are the cluster and security options, for the quarantine's
	// own consumers and the redrive's producer.
	Conn        []kgo.Opt
	Codec       kgo.CompressionCodec // kafka.compression
	Replication int16                // for the state topic it creates; -1: the broker's default
	// Tx, when set, is the transactional producer (exactly_once) the set
	// writes through, and whose commits alone change it (txn.go).
	Tx Transactor
	// Contracts, when set, checks what a redrive republishes against the
	// event contracts' latest versions (revalidate.go).
	Contracts Revalidator
}

// Record is a producer's record as the quarantine sees it.
type Record interface {
	Kafka() *kgo.Record // the record as it goes to Kafka
	Mark() *Mark        // the quarantine's state on it
	// Resubmit hands a held record back to the producer (parked first,
	// when park, as Route parks it); Fail reports err as its outcome.
	Resubmit(park bool)
	Fail(err error)
}

// Mark is the quarantine's state on one record, kept in the record.
type Mark struct {
	starts *quarantined // the quarantine this dead letter started: its outcome waits until it is saved
	parked *quarantined // the quarantine it is parked for
	pass   passing      // passNormal, or how Route lets a released record pass
}

// Saving reports whether the record's outcome waits until the quarantine
// it started is saved (Save).
func (m *Mark) Saving() bool { return m.starts != nil }

// PassEarlier lets the record go to its own topic whatever its key's
// quarantine: it was produced before the dead letter that began it (it
// waited for its topic's metadata, or in a repair's retry list).
func (m *Mark) PassEarlier() {
	if m.pass == passNormal {
		m.pass = passRelease
	}
}

// Done tells the quarantine that the record's outcome is in.
func (m *Mark) Done() {
	if m.parked != nil {
		m.parked.inflight.Add(-1)
	}
}

// quarantined is a Quarantine as the set keeps it.
type quarantined struct {
	Quarantine
	// holding: later records of the key wait in held (in Produce order)
	// while the quarantine is being saved or redriven.
	holding bool
	held    []Record
	state   *StateRecord // as saved on the state topic; nil until saved
	stateAt int64        // state's offset: an older tombstone is not this quarantine's
	// inflight counts the key's parked records without an outcome.
	inflight atomic.Int64
}

// passing is how Route lets a record pass.
type passing int

const (
	passNormal  passing = iota
	passRelease         // lifted by a redrive: to its own topic
	passPark            // released after the quarantine was saved: to parking
)

// Set is the quarantined aggregates of one producer. Its lock is taken
// inside the producer's (Route runs under it), never around it.
type Set struct {
	parking, dlq   string
	maxQuarantined int
	log            *slog.Logger
	fail           func(error)
	onQuarantines  func(result string, quarantined int)

	cl          *kgo.Client // the producer's: state records are written through it
	tx          Transactor  // exactly_once: writes go through it instead (txn.go)
	contracts   Revalidator // nil: contracts off (revalidate.go)
	adm         *kadm.Client
	connOpts    []kgo.Opt
	codec       kgo.CompressionCodec
	replication int16

	// ctx is the producer's: it ends at its Close, and so do the
	// goroutines of the restore, the saves and the redrive loop.
	ctx context.Context
	wg  sync.WaitGroup

	mu          sync.Mutex
	quarantined map[string]*quarantined // by key
	liftedAt    map[string]int64        // a transactional set's: the offset of the tombstone that lifted a key
	state       *stateTopic             // nil: quarantines are not saved (state.go)
	restored    chan struct{}           // closed once the saved quarantines are in quarantined
	started     atomic.Bool             // Start was called
}

// New makes the set of a producer whose context is ctx and whose client
// is cl. It reads nothing yet: Start restores the saved set.
func New(ctx context.Context, cfg Config, cl *kgo.Client, log *slog.Logger) *Set {
	s := &Set{parking: cfg.Parking, dlq: cfg.DLQ, maxQuarantined: cfg.Max, log: log, fail: cfg.Fail, onQuarantines: cfg.Report,
		cl: cl, tx: cfg.Tx, contracts: cfg.Contracts, adm: kadm.NewClient(cl), connOpts: cfg.Conn, codec: cfg.Codec, replication: cfg.Replication,
		ctx: ctx, quarantined: make(map[string]*quarantined), liftedAt: map[string]int64{}, restored: make(chan struct{})}
	if s.maxQuarantined <= 0 {
		s.maxQuarantined = kafkaopt.DefaultMaxQuarantined
	}
	if cfg.Topic != "" {
		s.state = &stateTopic{name: cfg.Topic, source: cfg.Source, owner: cfg.Owner, pending: map[string]*StateRecord{}}
	} else {
		close(s.restored) // nothing to restore
	}
	return s
}

// Ready is closed once the saved quarantines are restored (at once
// without a state topic): no record may reach Kafka before.
func (s *Set) Ready() <-chan struct{} { return s.restored }

// Started reports whether records may be produced: Start was called, or
// there is nothing to restore.
func (s *Set) Started() bool { return s.state == nil || s.started.Load() }

// Begin starts a quarantine for r's key as r is dead-lettered (topic is
// the one r was meant for), unless r has no key or the key is quarantined
// already; it reports whether it began one. Past dlq.max_quarantined it
// fails: dropping the rule silently would break order.
func (s *Set) Begin(r Record, topic, reason string) (bool, error) {
	kr := r.Kafka()
	if len(kr.Key) == 0 {
		return false, nil
	}
	key := string(kr.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.quarantined[key]; ok {
		return false, nil
	}
	if len(s.quarantined) >= s.maxQuarantined {
		return false, fmt.Errorf("cannot quarantine aggregate %q: %d aggregates are quarantined already (dlq.max_quarantined); redrive or skip some, or raise the bound", key, len(s.quarantined))
	}
	id := kafka.Header(kr, wire.HeaderID)
	if id == "" {
		id = key
	}
	q := &quarantined{Quarantine: Quarantine{Key: key, FirstID: id, Reason: reason, Topic: topic, Since: time.Now()}}
	if s.state != nil {
		// Later records wait until the quarantine is saved (state.go).
		q.holding, r.Mark().starts = true, q
	}
	s.quarantined[key] = q
	n := len(s.quarantined)
	s.reportQuarantines("", n)
	if n > s.maxQuarantined*8/10 {
		s.log.Warn("many aggregates are quarantined; at dlq.max_quarantined the connector stops rather than let events overtake",
			"quarantined", n, "max", s.maxQuarantined)
	}
	return true, nil
}

// Routing is what Route did with a record: the one choice between a
// record's own topic, the parking topic and its quarantine's held queue.
type Routing int

const (
	Pass Routing = iota // nothing: r goes to its topic
	Park                // r is bound for the parking topic now
	Hold                // r waits in its quarantine's held queue
)

// Route sends r to the parking topic when its key is quarantined, with the
// quarantine and original topic in front of its headers, or holds it while
// the quarantine is being saved or redriven. The producer calls it in
// Produce order for each key, for records that are neither dead letters
// nor parked already.
func (s *Set) Route(r Record) Routing {
	m, kr := r.Mark(), r.Kafka()
	if len(kr.Key) == 0 || m.pass == passRelease {
		return Pass
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.quarantined[string(kr.Key)]
	if !ok {
		return Pass
	}
	if q.holding && m.pass != passPark {
		q.held = append(q.held, r)
		return Hold
	}
	q.Parked++
	q.inflight.Add(1)
	m.parked = q
	Parked(kr, q.FirstID, s.parking)
	return Park
}

// Unpark takes off a parked record the headers Route put in front of its
// own (the parking topic refused it: it goes back to the event it was).
func Unpark(kr *kgo.Record) { kr.Headers = kr.Headers[2:] }

// Close waits for the set's goroutines, which end with the producer's
// context, and fails the records still held. Call it after the
// producer's client is closed.
func (s *Set) Close() {
	s.wg.Wait()
	if s.state != nil && s.state.cons != nil {
		s.state.cons.Close() // after the restore and the redrive loop, which read it
	}
	s.mu.Lock()
	var left []Record
	for _, q := range s.quarantined {
		left = append(left, q.held...)
		q.held = nil
	}
	s.mu.Unlock()
	for _, r := range left {
		r.Fail(kgo.ErrClientClosed)
	}
}

// Quarantined lists the quarantined aggregates, in no particular order.
func (s *Set) Quarantined() []Quarantine {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Quarantine, 0, len(s.quarantined))
	for _, q := range s.quarantined {
		out = append(out, q.Quarantine)
	}
	return out
}

// Holding reports whether key's new records wait: its quarantine is being
// saved or redriven.
func (s *Set) Holding(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.quarantined[key]
	return q != nil && q.holding
}

// reportQuarantines tells Config.Report a redrive's result ("" for any
// other change of the set) and the set's size.
func (s *Set) reportQuarantines(result string, n int) {
	if s.onQuarantines != nil {
		s.onQuarantines(result, n)
	}
}
