package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// StateClient reads and writes the quarantine state topic for the
// command line (outbox-cdc redrive).
type StateClient struct {
	cl     *kgo.Client
	topic  string
	source string
}

// NewStateClient connects with conn (the cluster and security options)
// for topic, the state topic, and the keys of source. Pass the producer's
// partitioner: a request lands in its key's partition, where the
// connector's answer follows it. extra (tests) go last.
func NewStateClient(conn []kgo.Opt, partitioner kgo.Partitioner, topic, source string, extra ...kgo.Opt) (*StateClient, error) {
	opts := append(slices.Clip(conn), kgo.RecordPartitioner(partitioner),
		kgo.WithLogger(kgo.BasicLogger(discard{}, kgo.LogLevelNone, nil)))
	opts = append(opts, extra...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &StateClient{cl: cl, topic: topic, source: source}, nil
}

// Close closes the client.
func (c *StateClient) Close() { c.cl.Close() }

// List returns this connector's quarantines as the state topic holds them.
func (c *StateClient) List(ctx context.Context) (map[string]*StateRecord, error) {
	latest, _, err := readState(ctx, c.opts(), c.topic, c.source)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*StateRecord, len(latest))
	for k, l := range latest {
		if !l.stale {
			out[k] = l.rec
		}
	}
	return out, nil
}

func (c *StateClient) opts(extra ...kgo.Opt) []kgo.Opt {
	return append(c.cl.Opts(), extra...)
}

// ErrNotQuarantined is a redrive of an aggregate that is not quarantined.
var ErrNotQuarantined = errors.New("the aggregate is not quarantined")

// Redrive asks the connector to lift agg's quarantine (skip: without
// republishing the dead letter) and waits, until ctx ends, for its answer:
// nil once lifted, the failure record's reason, or ctx's error while the
// request is pending (it stays, for the connector to carry out).
func (c *StateClient) Redrive(ctx context.Context, agg string, skip bool) error {
	all, err := c.List(ctx)
	if err != nil {
		return err
	}
	rec, ok := all[agg]
	if !ok {
		return ErrNotQuarantined
	}
	now := time.Now().UTC()
	rec.State, rec.Requested, rec.Failure = StateRedrive, &now, ""
	if skip {
		rec.State = StateSkip
	}
	key := c.source + "/" + agg
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	res := c.cl.ProduceSync(ctx, &kgo.Record{Topic: c.topic, Key: []byte(key), Value: v, Partition: -1})
	req, err := res.First()
	if err != nil {
		return fmt.Errorf("write the request to %s: %w", c.topic, err)
	}
	// Committed answers only: in exactly_once an aborted redrive wrote one.
	cons, err := kgo.NewClient(c.opts(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		c.topic: {req.Partition: kgo.NewOffset().At(req.Offset + 1)}}), kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cons.Close()
	for {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("no answer yet; the request stays pending: %w", err)
		}
		if err := fetchErr(fs); err != nil {
			return fmt.Errorf("read %s: %w", c.topic, err)
		}
		var answer error
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if done || string(r.Key) != key {
				return
			}
			if r.Value == nil {
				done = true
				return
			}
			var got StateRecord
			if json.Unmarshal(r.Value, &got) == nil && got.State == StateFailed && got.answers(rec) {
				done, answer = true, errors.New(got.Failure)
			}
		})
		if done {
			return answer
		}
	}
}
