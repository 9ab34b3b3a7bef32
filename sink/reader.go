package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
)

// ReadRecord is what a range read returns of one record. Its slices are
// valid only during the callback.
type ReadRecord struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	ID        []byte // the id header's value
	HasID     bool
}

// ReadStats says what a range read covered.
type ReadStats struct {
	// Partitions read, and topics that do not exist (nothing to read).
	Partitions    int
	MissingTopics []string
}

// ReadRange reads, from every partition of topics, the committed records
// from the first one with a timestamp at or after since (ListOffsets by
// timestamp) up to the partition's end as listed when the read starts, each
// partition in offset order (a transaction's records at its commit marker:
// readLog), and hands each to fn on the calling goroutine. It uses a client
// of its own (cfg's brokers and options: TLS, SASL) that joins no group and
// commits nothing.
func ReadRange(ctx context.Context, cfg Config, topics []string, since time.Time, fn func(ReadRecord) error) (ReadStats, error) {
	var st ReadStats
	// Larger partition fetches than the default 1 MiB: the read is
	// sequential and the records are small.
	cl, err := newLogClient(cfg, kgo.FetchMaxPartitionBytes(8<<20))
	if err != nil {
		return st, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if len(topics) == 0 {
		return st, nil
	}
	starts, err := adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
	if err != nil {
		return st, fmt.Errorf("list offsets at %s: %w", since.Format(time.RFC3339), err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return st, fmt.Errorf("list end offsets: %w", err)
	}
	// Where each partition starts and ends; a partition with nothing in the
	// range is not read.
	from := map[string]map[int32]kgo.Offset{}
	until := map[string]map[int32]int64{}
	var listErr error
	ends.Each(func(e kadm.ListedOffset) {
		if e.Err != nil {
			if errors.Is(e.Err, kerr.UnknownTopicOrPartition) && e.Partition == -1 {
				st.MissingTopics = append(st.MissingTopics, e.Topic)
			} else if listErr == nil {
				listErr = fmt.Errorf("end offset of %s/%d: %w", e.Topic, e.Partition, e.Err)
			}
			return
		}
		st.Partitions++
		s, ok := starts.Lookup(e.Topic, e.Partition)
		if !ok || s.Err != nil {
			if listErr == nil {
				listErr = fmt.Errorf("offset at %s of %s/%d: %v", since.Format(time.RFC3339), e.Topic, e.Partition, s.Err)
			}
			return
		}
		// A timestamp after every record lists the end offset (or -1 from
		// older brokers): nothing to read.
		if s.Offset < 0 || s.Offset >= e.Offset {
			return
		}
		if from[e.Topic] == nil {
			from[e.Topic], until[e.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		from[e.Topic][e.Partition] = kgo.NewOffset().At(s.Offset)
		until[e.Topic][e.Partition] = e.Offset
	})
	if listErr != nil {
		return st, listErr
	}
	err = readLog(ctx, cl, from, until, func(r *kgo.Record) error {
		rr := ReadRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			if h.Key == wire.HeaderID {
				rr.ID, rr.HasID = h.Value, true
				break
			}
		}
		return fn(rr)
	})
	if err != nil {
		return st, err
	}
	return st, nil
}
