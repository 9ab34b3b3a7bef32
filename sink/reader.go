package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/backoff"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
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
	// Orig is the topic a dead letter or a parked record was meant for:
	// the topic header its producer put second, after error or quarantine
	// ("" for any other record: an event may have a topic header of its
	// own, outbox.header_columns).
	Orig string
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
// topicread.Reader.Read), and hands each to fn on the calling goroutine. It
// uses a client of its own (cfg's brokers and options: TLS, SASL) that
// joins no group and commits nothing.
func ReadRange(ctx context.Context, cfg Config, topics []string, since time.Time, fn func(ReadRecord) error) (ReadStats, error) {
	var st ReadStats
	conn, err := cfg.ConnOpts()
	if err != nil {
		return st, err
	}
	// Larger partition fetches than the default 1 MiB: the read is
	// sequential and the records are small.
	rd, err := topicread.New(append(append(conn, kgo.FetchMaxPartitionBytes(8<<20)), cfg.TestOpts...)...)
	if err != nil {
		return st, err
	}
	defer rd.Close()
	if len(topics) == 0 {
		return st, nil
	}
	// Before 1970 (an unknown start less a margin) is from the start: Kafka
	// reads a negative timestamp as a special offset, or refuses it
	// (UNSUPPORTED_VERSION).
	var starts, ends kadm.ListedOffsets
	err = retryLost(ctx, func() (err error) {
		starts, err = rd.Admin().ListOffsetsAfterMilli(ctx, max(since.UnixMilli(), 0), topics...)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("list offsets at %s: %w", since.Format(time.RFC3339), err)
	}
	err = retryLost(ctx, func() (err error) {
		ends, err = rd.Admin().ListEndOffsets(ctx, topics...)
		return err
	})
	if err != nil {
		return st, fmt.Errorf("list end offsets: %w", err)
	}
	ranges, missing, err := topicread.Spans(starts, ends, "offset at "+since.Format(time.RFC3339))
	if err != nil {
		return st, err
	}
	st.MissingTopics = missing
	for _, ps := range ranges {
		st.Partitions += len(ps)
	}
	err = rd.Read(ctx, ranges, func(r *kgo.Record) error {
		rr := ReadRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value}
		for _, h := range r.Headers {
			if h.Key == wire.HeaderID {
				rr.ID, rr.HasID = h.Value, true
				break
			}
		}
		rr.Orig = meantFor(r.Headers)
		return fn(rr)
	})
	if err != nil {
		return st, err
	}
	return st, nil
}

// meantFor is the topic a dead letter (kafka.Event.ToDeadLetter) or a
// parked record (quarantine.Parked) was meant for: the second of the two
// headers they put in front of the event's own; "" for another record.
func meantFor(h []kgo.RecordHeader) string {
	if len(h) < 2 || h[1].Key != wire.HeaderTopic || h[0].Key != wire.HeaderError && h[0].Key != quarantine.Header {
		return ""
	}
	return string(h[1].Value)
}

// retryLost runs list again while it fails for a lost connection or a
// retriable broker error (a broker restart, a network fault: franz-go
// retries fetches itself, not an admin request), up to about half a
// minute; any other error, or ctx's end, is returned at once.
func retryLost(ctx context.Context, list func() error) error {
	for attempt := 0; ; attempt++ {
		err := list()
		var ne net.Error
		lost := kerr.IsRetriable(err) || errors.As(err, &ne) || errors.Is(err, io.EOF)
		if err == nil || !lost || ctx.Err() != nil || attempt >= 15 {
			return err
		}
		backoff.Sleep(ctx, backoff.Nth(100*time.Millisecond, 2*time.Second, attempt))
	}
}
