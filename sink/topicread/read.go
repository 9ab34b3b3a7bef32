package topicread

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Read reads every non-empty span of ranges and hands fn the committed
// records, each partition in offset order, on the calling goroutine: a
// record outside transactions at once, a transaction's records when its
// commit marker is read, never an aborted one's nor one still open at the
// end. It ends when every span is read, with fn's first error, with the
// first fetch error (a record deleted before it was read among them:
// OFFSET_OUT_OF_RANGE), or when ctx ends (the caller's deadline).
//
// Why not read_committed: its fetches stop at the last stable offset and
// drop aborted records and (without KeepControlRecords) markers, so a
// reader cannot tell when it has passed a given offset: an aborted record
// before an open transaction of another producer, or a marker at the end,
// left earlier readers waiting for an offset never returned. Raw reading
// returns every offset of the log, markers included, so "done" is the
// offset itself. A partition ends when a record at or past Until-1 is read
// (offsets need not be contiguous; the last record before Until is in the
// active segment, which compaction leaves alone, unless the log rolled).
func (r *Reader) Read(ctx context.Context, ranges Ranges, fn func(*kgo.Record) error) error {
	return r.ReadAwaiting(ctx, ranges, Await{}, fn)
}

// Await is what ReadAwaiting waits for: a transaction still open at a
// partition's end that holds a record Holds accepts. Its outcome is not
// known yet, so the partition is read on, past its end, to that
// transaction's marker (only the marker is taken from there). The
// transaction coordinator answers EndTxn once the outcome is durable and
// writes the markers after it (Kafka's transactions design, KIP-98: the
// markers follow the PREPARE_COMMIT record of the transaction log), so a
// commit whose answer was lost can be unmarked for a while, longer after a
// broker restart; taking it for aborted repeats it.
//
// Ended, if set, asks the coordinator whether such a transaction has ended
// there, after each poll that did not bring its marker. A broker can end a
// transaction without writing its markers (Kafka 4.x drops the markers of a
// partition that has no leader at that moment, logging "these partitions
// are likely deleted already"); the records then stay unmarked, and the
// producer's next marker on that partition decides them, commit or abort.
// When Ended says so twice, with a poll in between (a marker written just
// before the coordinator's answer is read by then), the read ends with a
// *HangingError.
//
// Aborted, if set, is handed each record Holds accepts whose transaction
// aborted (on the calling goroutine, in offset order with fn's): a reader
// that must know what its last transaction was learns it of an abort too.
type Await struct {
	Holds   func(*kgo.Record) bool
	Ended   func(context.Context, *kgo.Record) (bool, error)
	Aborted func(*kgo.Record)
}

// HangingError is a transaction whose coordinator has ended it without a
// marker on this partition (Await.Ended): a hanging transaction, KIP-664.
type HangingError struct {
	Topic      string
	Partition  int32
	Offset     int64 // its first record here
	ProducerID int64
	Epoch      int16
	Held       []*kgo.Record // its records here that Await.Holds accepts, in offset order
}

func (e *HangingError) Error() string {
	return fmt.Sprintf("the transaction of producer id %d (epoch %d) starting at %s/%d offset %d has no marker, and its coordinator has ended it",
		e.ProducerID, e.Epoch, e.Topic, e.Partition, e.Offset)
}

// ReadAwaiting is Read, except that a transaction open at a partition's
// end that await.Holds a record of is waited for (Await).
func (r *Reader) ReadAwaiting(ctx context.Context, ranges Ranges, await Await, fn func(*kgo.Record) error) error {
	from := map[string]map[int32]kgo.Offset{}
	until := map[string]map[int32]int64{}
	left := 0
	for t, ps := range ranges {
		for p, s := range ps {
			if s.From >= s.Until {
				continue
			}
			if from[t] == nil {
				from[t], until[t] = map[int32]kgo.Offset{}, map[int32]int64{}
			}
			from[t][p], until[t][p] = kgo.NewOffset().At(s.From), s.Until
			left++
		}
	}
	if left == 0 {
		return nil
	}
	r.cl.AddConsumePartitions(from)
	txns := committedLog{open: make(map[txnKey][]*kgo.Record), await: await.Holds, aborted: await.Aborted, ended: map[txnKey]bool{}, past: map[tp]bool{}}
	for left > 0 {
		fs, polled := r.poll(ctx, len(txns.past) > 0 && await.Ended != nil)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := firstError(fs); polled && err != nil {
			return err
		}
		var cbErr error
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			end, reading := until[p.Topic][p.Partition]
			if !reading || cbErr != nil {
				return
			}
			var done bool
			if done, cbErr = txns.take(p, end, fn); done {
				delete(until[p.Topic], p.Partition)
				r.cl.RemoveConsumePartitions(map[string][]int32{p.Topic: {p.Partition}})
				left--
			}
		})
		if cbErr != nil {
			return cbErr
		}
		if left > 0 && await.Ended != nil {
			if err := txns.checkEnded(ctx, await.Ended); err != nil {
				return err
			}
		}
	}
	return nil
}

// take hands fn what p's fetch committed before end (and the markers of
// awaited transactions past it), and reports whether p is read: its end
// reached with no awaited transaction open.
func (l *committedLog) take(p kgo.FetchTopicPartition, end int64, fn func(*kgo.Record) error) (bool, error) {
	for _, rec := range p.Records {
		if rec.Offset >= end && !l.awaited(rec) {
			continue // written after the read started
		}
		if err := l.add(rec, fn); err != nil {
			return false, err
		}
	}
	n := len(p.Records)
	if n == 0 || p.Records[n-1].Offset+1 < end {
		return false, nil
	}
	if l.awaiting(p.Topic, p.Partition) {
		l.past[tp{p.Topic, p.Partition}] = true
		return false, nil
	}
	return true, nil
}

// checkEnded asks ended about each awaited transaction still open, and
// returns a *HangingError for one it said ended at the previous check too.
func (l *committedLog) checkEnded(ctx context.Context, ended func(context.Context, *kgo.Record) (bool, error)) error {
	for k, recs := range l.open {
		if !l.past[tp{k.topic, k.partition}] || !l.holdsAwaited(k) {
			continue
		}
		done, err := ended(ctx, recs[0])
		if err != nil {
			return err
		}
		switch {
		case !done:
			delete(l.ended, k)
		case l.ended[k]:
			return &HangingError{Topic: k.topic, Partition: k.partition, Offset: recs[0].Offset, ProducerID: k.producer,
				Epoch: recs[0].ProducerEpoch, Held: l.held(recs)}
		default:
			l.ended[k] = true // once more after the next poll
		}
	}
	return nil
}

// awaitPoll bounds a poll while an awaited transaction is open past its
// partition's end: an empty long poll returns nothing to PollFetches, and
// Await.Ended must still be asked. A marker ends the poll as soon as it is
// written, so this only paces the questions: a hanging transaction is
// declared one awaitPoll after the coordinator first says it ended, which
// leaves a late marker (or a test deciding its transaction) two seconds.
const awaitPoll = 2 * time.Second

// poll polls once; bounded, it reports polled false when awaitPoll passed
// with nothing fetched.
func (r *Reader) poll(ctx context.Context, bounded bool) (kgo.Fetches, bool) {
	if !bounded {
		return r.cl.PollFetches(ctx), true
	}
	pctx, cancel := context.WithTimeout(ctx, awaitPoll)
	defer cancel()
	fs := r.cl.PollFetches(pctx)
	return fs, pctx.Err() == nil || ctx.Err() != nil
}

// firstError is a poll's first error, naming its partition. franz-go
// retries the retriable ones itself; what reaches a poll stops the read.
func firstError(fs kgo.Fetches) error {
	var err error
	fs.EachError(func(t string, p int32, e error) {
		if err == nil {
			err = fmt.Errorf("fetch %s/%d: %w", t, p, e)
		}
	})
	return err
}

// committedLog resolves transactions in a raw read: each producer's
// transactional records wait, per partition, for the marker that ends their
// transaction there.
type committedLog struct {
	open    map[txnKey][]*kgo.Record
	await   func(*kgo.Record) bool // Await.Holds; nil: nothing is waited for
	aborted func(*kgo.Record)      // Await.Aborted; nil: not told
	ended   map[txnKey]bool        // Await.Ended said so at the last check
	past    map[tp]bool            // partitions read to their end with an awaited transaction open
}

type tp struct {
	topic     string
	partition int32
}

// awaiting reports whether a transaction open in topic's partition p holds
// an awaited record.
func (l *committedLog) awaiting(topic string, p int32) bool {
	for k := range l.open {
		if k.topic == topic && k.partition == p && l.holdsAwaited(k) {
			return true
		}
	}
	return false
}

// awaited reports whether r, read past its partition's end, is the marker
// of a transaction that holds an awaited record.
func (l *committedLog) awaited(r *kgo.Record) bool {
	return r.Attrs.IsControl() && l.holdsAwaited(txnKey{r.Topic, r.Partition, r.ProducerID})
}

func (l *committedLog) holdsAwaited(k txnKey) bool {
	if l.await == nil {
		return false
	}
	for _, r := range l.open[k] {
		if l.await(r) {
			return true
		}
	}
	return false
}

// held is what of recs Await.Holds accepts.
func (l *committedLog) held(recs []*kgo.Record) []*kgo.Record {
	var out []*kgo.Record
	for _, r := range recs {
		if l.await != nil && l.await(r) {
			out = append(out, r)
		}
	}
	return out
}

type txnKey struct {
	topic     string
	partition int32
	producer  int64
}

func (l *committedLog) add(r *kgo.Record, fn func(*kgo.Record) error) error {
	k := txnKey{r.Topic, r.Partition, r.ProducerID}
	switch {
	case r.Attrs.IsControl():
		recs := l.open[k]
		delete(l.open, k)
		if !commitMarker(r.Key) {
			if l.aborted != nil {
				for _, x := range l.held(recs) {
					l.aborted(x)
				}
			}
			return nil
		}
		for _, x := range recs {
			if err := fn(x); err != nil {
				return err
			}
		}
		return nil
	case r.Attrs.IsTransactional():
		l.open[k] = append(l.open[k], r)
		return nil
	}
	return fn(r)
}

// commitMarker: a control record's key is a version (int16) and a type
// (int16): 0 abort, 1 commit (Kafka protocol, "Record Batch", control
// batches).
func commitMarker(key []byte) bool {
	return len(key) >= 4 && binary.BigEndian.Uint16(key[2:4]) == 1
}
