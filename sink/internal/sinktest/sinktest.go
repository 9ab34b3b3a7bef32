// Package sinktest holds the kfake helpers the tests of the sink packages
// share (sink, sink/exactlyonce, sink/quarantine): only test files import
// it. Its helpers fail the test, so only the test goroutine calls them;
// workers send what they see back on channels (Outcomes, Results).
package sinktest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink"
)

const (
	Topic = "t"          // seeded by NewCluster, 3 partitions
	DLQ   = "outbox.dlq" // seeded by NewCluster, 3 partitions
	// Timeout bounds every test; generous for -race on a busy machine.
	Timeout = 30 * time.Second
)

// Outcomes is a Done that hands outcomes to the test goroutine through a
// buffered channel, so Delivered never blocks; only the test goroutine fails
// the test.
type Outcomes struct {
	ch       chan sink.Outcome
	overflow atomic.Int32 // outcomes that did not fit: more than expected
}

// NewOutcomes holds up to 16 outcomes not waited for yet.
func NewOutcomes() *Outcomes { return OutcomesFor(16) }

// OutcomesFor holds up to n outcomes not waited for yet.
func OutcomesFor(n int) *Outcomes { return &Outcomes{ch: make(chan sink.Outcome, n)} }

func (o *Outcomes) Delivered(x sink.Outcome) {
	select {
	case o.ch <- x:
	default:
		o.overflow.Add(1)
	}
}

// C is the channel the outcomes arrive on, for a test's own select.
func (o *Outcomes) C() <-chan sink.Outcome { return o.ch }

// Overflow counts the outcomes that did not fit in the channel.
func (o *Outcomes) Overflow() int32 { return o.overflow.Load() }

// Wait returns the next outcome or fails the test when ctx ends.
func (o *Outcomes) Wait(ctx context.Context, t *testing.T) sink.Outcome {
	t.Helper()
	select {
	case x := <-o.ch:
		return x
	case <-ctx.Done():
		t.Fatalf("no outcome: %v", ctx.Err())
		return sink.Outcome{}
	}
}

// None fails when another outcome arrives within d: every record has
// exactly one outcome. d is an observation window for an absence, which has
// no signal to wait for.
func (o *Outcomes) None(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case x := <-o.ch:
		t.Fatalf("unexpected extra outcome %+v", x)
	case <-time.After(d): // the window passed without an extra outcome
	}
	if n := o.overflow.Load(); n > 0 {
		t.Fatalf("%d outcomes more than the channel holds", n)
	}
}

// Ctx is the test's context, ended after Timeout or with the test.
func Ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// NewCluster starts a one-broker kfake cluster with Topic and DLQ (opts
// go after: they may seed more), closed when the test ends.
func NewCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, Topic, DLQ)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Admin is a client of c for the tests' requests; closed before c.
func Admin(t *testing.T, c *kfake.Cluster) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// Header is the value of r's header key, and whether r has one.
func Header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// CreateTopic creates name, one partition, with topic-level configs
// through cl.
func CreateTopic(ctx context.Context, t *testing.T, cl *kgo.Client, name string, configs map[string]string) {
	t.Helper()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic = name
	rt.NumPartitions = 1
	rt.ReplicationFactor = 1
	for k, v := range configs {
		rc := kmsg.NewCreateTopicsRequestTopicConfig()
		rc.Name = k
		rc.Value = kmsg.StringPtr(v)
		rt.Configs = append(rt.Configs, rc)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

// TopicID looks up name's topic id through cl, by which produce v13+
// addresses it.
func TopicID(ctx context.Context, t *testing.T, cl *kgo.Client, name string) [16]byte {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(name)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("metadata for %s: %v", name, err)
	}
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != 0 {
		t.Fatalf("metadata for %s: %+v", name, resp.Topics)
	}
	return resp.Topics[0].TopicID
}

// TopicNames maps the ids of topics to their names: produce v13+
// addresses topics by id.
func TopicNames(ctx context.Context, t *testing.T, cl *kgo.Client, topics ...string) map[[16]byte]string {
	t.Helper()
	m := map[[16]byte]string{}
	for _, name := range topics {
		m[TopicID(ctx, t, cl, name)] = name
	}
	return m
}

// Refusal decides a produce request's answer from each partition's record
// batch: a non-zero error code refuses the whole request with it.
type Refusal func(topic string, batch []byte) int16

// Refuse installs decide on every produce request (before runs first, if
// set) and counts the requests it refused and the most records a refused
// batch held.
func Refuse(c *kfake.Cluster, names map[[16]byte]string, before func(), decide Refusal) (refused, most *atomic.Int32) {
	refused, most = new(atomic.Int32), new(atomic.Int32)
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if before != nil {
			before()
		}
		req := kr.(*kmsg.ProduceRequest)
		var code int16
		for _, rt := range req.Topics {
			name := rt.Topic
			if name == "" {
				name = names[rt.TopicID]
			}
			for _, rp := range rt.Partitions {
				if x := decide(name, rp.Records); x != 0 {
					code = x
					var b kmsg.RecordBatch
					if b.ReadFrom(rp.Records) == nil && b.NumRecords > most.Load() {
						most.Store(b.NumRecords)
					}
				}
			}
		}
		if code == 0 {
			return nil, nil, false
		}
		refused.Add(1)
		return ProduceRefused(req, code), nil, true
	})
	return refused, most
}

// ProduceRefused is the answer to req that refuses every partition of it
// with code.
func ProduceRefused(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition, sp.ErrorCode = rp.Partition, code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}
