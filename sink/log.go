package sink

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// newLogClient is a client for readLog: cfg's brokers and options (TLS,
// SASL), no group, and the raw log with its transaction markers, which
// readLog resolves itself.
func newLogClient(cfg Config, opts ...kgo.Opt) (*kgo.Client, error) {
	all, err := cfg.ConnOpts()
	if err != nil {
		return nil, err
	}
	all = append(all, kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords())
	cl, err := kgo.NewClient(append(append(all, opts...), cfg.TestOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// readLog reads each partition of from up to its offset in until
// (exclusive) and hands fn the committed records, in offset order, on the
// calling goroutine: a record outside transactions at once, a
// transaction's records when its commit marker is read, never an aborted
// one's nor one still open at the end.
//
// Why not read_committed: its fetches stop at the last stable offset and
// drop aborted records and (without KeepControlRecords) markers, so a
// reader cannot tell when it has passed a given offset: an aborted record
// before an open transaction of another producer, or a marker at the end,
// left earlier readers waiting for an offset never returned. Raw reading
// returns every offset of the log, markers included, so "done" is the
// offset itself. A partition ends when a record at or past until-1 is read
// (the end as listed when the read starts: the last record before it is in
// the active segment, which compaction leaves alone, unless the log rolled).
func readLog(ctx context.Context, cl *kgo.Client, from map[string]map[int32]kgo.Offset, until map[string]map[int32]int64, fn func(*kgo.Record) error) error {
	left := 0
	for _, ps := range until {
		left += len(ps)
	}
	if left == 0 {
		return nil
	}
	cl.AddConsumePartitions(from)
	txns := committedLog{open: make(map[txnKey][]*kgo.Record)}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil {
				ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		var cbErr error
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			end, reading := until[p.Topic][p.Partition]
			if !reading || cbErr != nil {
				return
			}
			for _, r := range p.Records {
				if r.Offset >= end {
					break // written after the read started
				}
				if cbErr = txns.add(r, fn); cbErr != nil {
					return
				}
			}
			if n := len(p.Records); n > 0 && p.Records[n-1].Offset+1 >= end {
				delete(until[p.Topic], p.Partition)
				cl.RemoveConsumePartitions(map[string][]int32{p.Topic: {p.Partition}})
				left--
			}
		})
		if cbErr != nil {
			return cbErr
		}
	}
	return nil
}

// ReadTopic reads every partition of topic from its start to its end as
// listed when the read starts, handing fn the committed records in offset
// order (readLog), on the calling goroutine: sink/exactlyonce's read of
// the positions topic.
func ReadTopic(ctx context.Context, cfg Config, topic string, fn func(*kgo.Record) error) error {
	cl, err := newLogClient(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return err
	}
	from := map[string]map[int32]kgo.Offset{topic: {}}
	until := map[string]map[int32]int64{topic: {}}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			from[topic][o.Partition], until[topic][o.Partition] = kgo.NewOffset().AtStart(), o.Offset
		}
	})
	return readLog(ctx, cl, from, until, fn)
}

// committedLog resolves transactions in a raw read: each producer's
// transactional records wait, per partition, for the marker that ends their
// transaction there.
type committedLog struct {
	open map[txnKey][]*kgo.Record
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
			return nil // aborted
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
