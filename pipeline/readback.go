package pipeline

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"log/slog"
	"time"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// readBackMargin is how far before the first event's time the read-back
// starts: a record's timestamp may come from an outbox column
// (outbox.timestamp_column), whose clock is the application's.
const readBackMargin = time.Hour

// readRange is sink.ReadRange: the committed records of topics from the
// first one at or after since to each partition's end.
type readRange func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error)

// readBack keeps exactly_once to "each event once" when a run has no
// position committed to Kafka but streams from a slot that existed: after a
// restore or a promotion, the refusal's fix forgets the position, and the
// slot, restored with the data, sends again what it had sent before (the
// old history's transactions between the slot and the copy, all in Kafka);
// on a switch from at_least_once, what the last run delivered past its
// checkpoint is in Kafka too. The first transactions of such a run are
// looked up in what their topics hold, and an event found there is not
// published again; the first transaction none of whose events is found
// ends the read-back: that one and everything after it are new.
//
// An event is found by its topic, key, id header and value, so a new row
// that reuses an old id (a sequence restored with the data) is not taken
// for the old one unless its key and value are the same too. What the
// read-back cannot find (a record parked by a quarantine, one older than
// its start) is published again: a duplicate, never a loss.
type readBack struct {
	read   readRange
	log    *slog.Logger
	since  time.Time // set by the first event
	seeds  [2]maphash.Seed
	loaded map[string]bool
	held   map[[2]uint64]struct{}
	buf    []byte

	found, notFound int // events of the open transaction
	skipped         int // events not published again, over the read-back
	txns            int // transactions read back
	done            bool
}

func newReadBack(read readRange, log *slog.Logger) *readBack {
	return &readBack{read: read, log: log, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		loaded: map[string]bool{}, held: map[[2]uint64]struct{}{}}
}

// inKafka reports whether rec is in Kafka already, reading its topic first
// when this is the first of its events; a nil or finished read-back holds
// nothing.
func (b *readBack) inKafka(ctx context.Context, rec *router.Record, commit time.Time) (bool, error) {
	if b == nil || b.done {
		return false, nil
	}
	if b.since.IsZero() {
		at := commit
		if !rec.Timestamp.IsZero() && rec.Timestamp.Before(at) {
			at = rec.Timestamp
		}
		b.since = at.Add(-readBackMargin)
	}
	if !b.loaded[rec.Topic] {
		if err := b.load(ctx, rec.Topic); err != nil {
			return false, err
		}
	}
	var id []byte
	for _, h := range rec.Headers {
		if h.Key == wire.HeaderID {
			id = h.Value
			break
		}
	}
	_, ok := b.held[b.fingerprint(rec.Topic, rec.Key, id, rec.Value)]
	if ok {
		b.found++
	} else {
		b.notFound++
	}
	return ok, nil
}

func (b *readBack) load(ctx context.Context, topic string) error {
	start := time.Now()
	n := 0
	_, err := b.read(ctx, []string{topic}, b.since, func(r sink.ReadRecord) error {
		if r.HasID {
			b.held[b.fingerprint(r.Topic, r.Key, r.ID, r.Value)] = struct{}{}
			n++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read back %s: %w", topic, err)
	}
	b.loaded[topic] = true
	b.log.Info("exactly-once: read back what a topic holds before publishing again", "topic", topic,
		"since", b.since.UTC().Format(time.RFC3339), "records", n, "took", time.Since(start).Round(time.Millisecond))
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

// commit closes the open transaction: one with events none of which was
// found ends the read-back.
func (b *readBack) commit() {
	if b == nil || b.done || b.found+b.notFound == 0 {
		return
	}
	b.txns++
	b.skipped += b.found
	if b.found > 0 && b.notFound > 0 {
		b.log.Warn("exactly-once: a transaction read back is in Kafka in part; publishing the events not found",
			"found", b.found, "not_found", b.notFound)
	}
	if b.found == 0 {
		b.done = true
		b.held, b.loaded = nil, nil
		b.log.Info("exactly-once: read back the transactions already in Kafka; publishing from here",
			"transactions_in_kafka", b.txns-1, "events_not_published_again", b.skipped)
	}
	b.found, b.notFound = 0, 0
}

// abort forgets the open transaction's counts (cut short; it comes again).
func (b *readBack) abort() {
	if b != nil {
		b.found, b.notFound = 0, 0
	}
}
