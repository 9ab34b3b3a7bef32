// Package topicread reads a bounded range of Kafka partitions to its end:
// from given offsets up to the end offsets listed when the read starts,
// committed records only, in offset order, records deleted before they are
// read an error. It is the one reader of verify's range read, the
// positions topic, the quarantine state topic's restore and a redrive's
// reads of the dead-letter and parking topics.
package topicread

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Span is a partition's offsets to read: From up to Until, exclusive.
type Span struct{ From, Until int64 }

// Ranges are the spans of a read, by topic and partition.
type Ranges map[string]map[int32]Span

// Add sets the span of topic's partition p.
func (r Ranges) Add(topic string, p int32, s Span) {
	if r[topic] == nil {
		r[topic] = map[int32]Span{}
	}
	r[topic][p] = s
}

// Reader is a client for bounded reads: it joins no group and commits
// nothing.
type Reader struct {
	cl  *kgo.Client
	adm *kadm.Client
}

// New makes a reader with opts (the cluster, security, fetch sizes; they
// may override nothing below). It reads the raw log with its transaction
// markers, which Read resolves itself, and never resets an offset out of
// range: a reset would skip records deleted before they were read, or wait
// for ever on a log emptied.
func New(opts ...kgo.Opt) (*Reader, error) {
	all := append([]kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NoResetOffset())}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &Reader{cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes the reader's client.
func (r *Reader) Close() { r.cl.Close() }

// Admin is the reader's client as an admin client, to list offsets.
func (r *Reader) Admin() *kadm.Client { return r.adm }

// Whole lists the spans that hold each partition of topics now, from its
// log start to its end (empty ones included: a caller may follow the
// partition from there), and the topics that do not exist.
func (r *Reader) Whole(ctx context.Context, topics ...string) (Ranges, []string, error) {
	ends, err := r.adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, nil, fmt.Errorf("end offsets: %w", err)
	}
	starts, err := r.adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return nil, nil, fmt.Errorf("start offsets: %w", err)
	}
	return Spans(starts, ends, "start offset")
}

// Spans pairs starts and ends, listed offsets of the same topics, into the
// ranges between them; a start at or past the end (or -1: a timestamp after
// every record) is an empty span. A topic that does not exist is listed in
// missing; any other failed partition is an error (what names starts).
func Spans(starts, ends kadm.ListedOffsets, what string) (Ranges, []string, error) {
	out := Ranges{}
	var missing []string
	var err error
	ends.Each(func(e kadm.ListedOffset) {
		switch {
		case err != nil:
		case e.Err != nil && errors.Is(e.Err, kerr.UnknownTopicOrPartition) && e.Partition == -1:
			missing = append(missing, e.Topic)
		case e.Err != nil:
			err = fmt.Errorf("end offset of %s/%d: %w", e.Topic, e.Partition, e.Err)
		default:
			s, ok := starts.Lookup(e.Topic, e.Partition)
			if !ok || s.Err != nil {
				err = fmt.Errorf("%s of %s/%d: %v", what, e.Topic, e.Partition, s.Err)
				return
			}
			from := s.Offset
			if from < 0 || from > e.Offset {
				from = e.Offset
			}
			out.Add(e.Topic, e.Partition, Span{From: from, Until: e.Offset})
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return out, missing, nil
}
