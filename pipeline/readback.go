package pipeline

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"time"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

const (
	// readBackMargin is how far before its start time the read-back reads:
	// a record's timestamp may come from an outbox column
	// (outbox.timestamp_column), whose clock is the application's.
	readBackMargin = time.Hour
	// readBackMaxHeld bounds the records the read-back keeps, 16 bytes
	// each: 64 MiB, the order of the read's own fetch buffer (franz-go's
	// 50 MiB), and over an hour at 1,000 events a second. Reading more
	// (a GiB or so of records) would hold the start for minutes; past it the
	// read-back ends instead (duplicates).
	readBackMaxHeld = 4 << 20
	// readBackProgress is how often a long read logs how far it is.
	readBackProgress = 5 * time.Second
)

// errReadBackFull ends a read that would hold more than maxHeld records.
var errReadBackFull = errors.New("the read-back holds its maximum of records")

// readRange is sink.ReadRange: the committed records of topics from the
// first one at or after since to each partition's end.
type readRange func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error)

// readBack keeps exactly_once to "each event once" when a run has no
// position committed to Kafka but streams from a slot that existed: after a
// restore or a promotion, the refusal's fix forgets the position, and the
// slot, restored with the data, sends again what it had sent before (the
// old history's transactions between the slot and the copy, all in Kafka);
// on a switch from at_least_once, what the last run delivered past its
// checkpoint is in Kafka too. The first events of such a run are looked up
// in what their topics hold, and one found there is not published again.
//
// The first event not found ends the read-back: it and everything after it
// are published, in order, even what Kafka holds (duplicates). Going on
// past it would publish it after newer events of its key that are held
// back as already in Kafka: a key's log would end with an older value, for
// good on a compacted topic. Events found before it, even of its own
// transaction, stay held: they are in Kafka before anything the run writes,
// and every later event of their keys is published after them. A
// transaction cut short (abort) is decided again when it comes again.
//
// An event is found by its topic, key, id header and value, so a new row
// that reuses an old id (a sequence restored with the data) is not taken
// for the old one unless its key and value are the same too. What the
// read-back cannot find (a record compacted away, expired, a dead letter
// made smaller, or stamped before the read's start) ends it there; so does
// a read past maxHeld records: a duplicate, never a loss. A dead letter or
// a parked record is found on its topic (side) under the topic it was
// meant for.
type readBack struct {
	read readRange
	log  *slog.Logger
	// stop is the run's context: publish's outlives a stop, and a read may
	// take minutes.
	stop context.Context
	// floor is the earliest time a record sent again can carry (the slot's
	// restart position's commit); zero when not known.
	floor time.Time
	// margin is readBackMargin when a record's timestamp may come from the
	// application (outbox.timestamp_column), else a minute: the records'
	// timestamps are then the transactions' commit times.
	margin time.Duration
	since  time.Time // set by the first event
	// redo: a snapshot taken again; the read starts at the topics' start
	// (the interrupted snapshot's records may be older than any reading).
	redo     bool
	maxHeld  int
	progress time.Duration
	seeds    [2]maphash.Seed
	// side are the dead-letter and parking topics: an event found there,
	// under the topic it was meant for, was published too.
	side   []string
	loaded map[string]bool
	held   fingerprints
	buf    []byte

	found   int  // events of the open transaction held back
	cut     bool // an event of the open transaction was not found
	full    bool // a read passed maxHeld: nothing is held any more
	skipped int  // events not published again, over the read-back
	txns    int  // transactions read back whole
	done    bool

	repair      bool // the gap repair's rows are looked up (readback_repair.go)
	repairFound int  // of them, found in Kafka and not published again
}

func newReadBack(stop context.Context, read readRange, floor time.Time, log *slog.Logger) *readBack {
	return &readBack{read: read, log: log, stop: stop, floor: floor, margin: readBackMargin, maxHeld: readBackMaxHeld, progress: readBackProgress,
		seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, loaded: map[string]bool{}}
}

// inKafka reports whether rec is in Kafka already, reading its topic first
// when this is the first of its events; a nil or finished read-back holds
// nothing.
func (b *readBack) inKafka(ctx context.Context, rec *router.Record, commit time.Time) (bool, error) {
	if b != nil && b.repair {
		return b.repairRow(ctx, rec)
	}
	if b == nil || b.done || b.cut {
		return false, nil
	}
	if b.since.IsZero() {
		b.since = b.start(rec, commit)
	}
	for i := 0; i <= len(b.side); i++ {
		topic := rec.Topic
		if i < len(b.side) {
			topic = b.side[i]
		}
		if b.loaded[topic] {
			continue
		}
		if err := b.load(ctx, topic); errors.Is(err, errReadBackFull) {
			b.log.Warn("exactly-once: the read-back would hold too many records; publishing from here, what follows may be published twice",
				"topic", topic, "since", b.since.UTC().Format(time.RFC3339), "max_records", b.maxHeld)
			b.cut, b.full = true, true
			b.held, b.loaded = fingerprints{}, nil
			return false, nil
		} else if err != nil {
			return false, err
		}
	}
	if !b.holds(rec) {
		b.cut = true
		return false, nil
	}
	b.found++
	return true, nil
}

// holds reports whether the read holds rec: its topic, key, id header and
// value.
func (b *readBack) holds(rec *router.Record) bool {
	var id []byte
	for _, h := range rec.Headers {
		if h.Key == wire.HeaderID {
			id = h.Value
			break
		}
	}
	return b.held.has(b.fingerprint(rec.Topic, rec.Key, id, rec.Value))
}

// start is where the read starts: the first event's time (its record's
// timestamp when older), no earlier than the floor, less the margin.
func (b *readBack) start(rec *router.Record, commit time.Time) time.Time {
	if b.redo {
		return time.Time{} // from the topics' start
	}
	at := commit
	if !rec.Timestamp.IsZero() && rec.Timestamp.Before(at) {
		at = rec.Timestamp
	}
	if at.Before(b.floor) {
		at = b.floor
	}
	return at.Add(-b.margin)
}

// load reads what topic holds since b.since into the held set, on the
// processor goroutine (nothing is published meanwhile), logging its
// progress; it ends with errReadBackFull past maxHeld records.
func (b *readBack) load(ctx context.Context, topic string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if b.stop != nil {
		defer context.AfterFunc(b.stop, cancel)()
	}
	start := time.Now()
	logged, n := start, 0
	_, err := b.read(ctx, []string{topic}, b.since, func(r sink.ReadRecord) error {
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if now := time.Now(); now.Sub(logged) >= b.progress {
				logged = now
				b.log.Info("exactly-once: reading back a topic", "topic", topic, "records", n, "held", b.held.n,
					"elapsed", now.Sub(start).Round(time.Second))
			}
		}
		if !r.HasID {
			return nil
		}
		if b.held.n >= b.maxHeld {
			return errReadBackFull
		}
		meant := r.Topic
		if r.Orig != "" && slices.Contains(b.side, r.Topic) {
			meant = r.Orig // a dead letter or a parked record: the event as routed
		}
		b.held.add(b.fingerprint(meant, r.Key, r.ID, r.Value), b.maxHeld)
		return nil
	})
	if errors.Is(err, errReadBackFull) {
		return err
	}
	if err != nil {
		return fmt.Errorf("read back %s: %w", topic, err)
	}
	b.held.seal()
	b.loaded[topic] = true
	b.log.Info("exactly-once: read back what a topic holds before publishing again", "topic", topic,
		"since", b.since.UTC().Format(time.RFC3339), "records", n, "held", b.held.n, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// fingerprint is 128 bits (two seeds) of the record's identity, each part
// length-prefixed: a false match would skip a new event.
func (b *readBack) fingerprint(topic string, key, id, value []byte) [2]uint64 {
	b.buf = b.buf[:0]
	for _, part := range [][]byte{[]byte(topic), key, id, value} {
		b.buf = binary.BigEndian.AppendUint32(b.buf, uint32(len(part)))
		b.buf = append(b.buf, part...)
	}
	return [2]uint64{maphash.Bytes(b.seeds[0], b.buf), maphash.Bytes(b.seeds[1], b.buf)}
}

// commit closes the open transaction: one with an event not found ends the
// read-back.
func (b *readBack) commit() {
	if b == nil || b.done {
		return
	}
	if !b.cut {
		if b.found > 0 {
			b.txns++
			b.skipped += b.found
		}
		b.found = 0
		return
	}
	b.done = true
	b.held, b.loaded = fingerprints{}, nil
	b.log.Info("exactly-once: read back the transactions already in Kafka; publishing from here",
		"transactions_in_kafka", b.txns, "events_not_published_again", b.skipped+b.found,
		"held_of_the_first_not_found_whole", b.found)
	b.found = 0
}

// abort forgets the open transaction (cut short; it comes again, and is
// decided again unless a read passed maxHeld).
func (b *readBack) abort() {
	if b != nil && !b.done {
		b.found, b.cut = 0, b.full
	}
}

// fingerprints is a set kept in sorted runs: appended to runs that never
// move (a growing slice's copy would double the peak), each sorted once
// its read ends, and looked up by binary search in each.
type fingerprints struct {
	runs   [][][2]uint64
	n      int
	sorted int // runs[:sorted] are sorted
}

const (
	firstRun = 1 << 12
	maxRun   = 1 << 20 // 16 MiB
)

// add appends fp; the set never allocates room for more than limit.
func (s *fingerprints) add(fp [2]uint64, limit int) {
	last := len(s.runs) - 1
	if last < 0 || len(s.runs[last]) == cap(s.runs[last]) {
		size := firstRun
		if last >= 0 {
			size = min(2*cap(s.runs[last]), maxRun)
		}
		s.runs = append(s.runs, make([][2]uint64, 0, max(min(size, limit-s.n), 1)))
		last++
	}
	s.runs[last] = append(s.runs[last], fp)
	s.sorted = min(s.sorted, last)
	s.n++
}

// seal sorts the runs appended to since the last seal.
func (s *fingerprints) seal() {
	for _, r := range s.runs[s.sorted:] {
		slices.SortFunc(r, compareFP)
	}
	s.sorted = len(s.runs)
}

func (s *fingerprints) has(fp [2]uint64) bool {
	for _, r := range s.runs[:s.sorted] {
		if _, ok := slices.BinarySearchFunc(r, fp, compareFP); ok {
			return true
		}
	}
	return false
}

func compareFP(a, b [2]uint64) int {
	if c := cmp.Compare(a[0], b[0]); c != 0 {
		return c
	}
	return cmp.Compare(a[1], b[1])
}
