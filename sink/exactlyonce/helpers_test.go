package exactlyonce_test

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

// The kfake helpers of package sink's tests that these tests use, on a
// plain client instead of an idempotent sink.

const (
	topic = "t"
	dlq   = "outbox.dlq"
	// testTimeout bounds every test; generous for -race on a busy machine.
	testTimeout = 30 * time.Second
)

// outcomes is a Done that hands outcomes to the test goroutine through a
// buffered channel, so Delivered never blocks; only the test goroutine fails
// the test.
type outcomes struct {
	ch       chan sink.Outcome
	overflow atomic.Int32 // outcomes that did not fit: more than expected
}

func (o *outcomes) Delivered(x sink.Outcome) {
	select {
	case o.ch <- x:
	default:
		o.overflow.Add(1)
	}
}

func newOutcomes() *outcomes { return &outcomes{ch: make(chan sink.Outcome, 16)} }

// wait returns the next outcome or fails the test when ctx ends.
func (o *outcomes) wait(ctx context.Context, t *testing.T) sink.Outcome {
	t.Helper()
	select {
	case x := <-o.ch:
		return x
	case <-ctx.Done():
		t.Fatalf("no outcome: %v", ctx.Err())
		return sink.Outcome{}
	}
}

// none fails when another outcome arrives within d: every record has
// exactly one outcome. d is an observation window for an absence, which has
// no signal to wait for.
func (o *outcomes) none(t *testing.T, d time.Duration) {
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

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, topic, dlq)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// admin is a client of c for the tests' requests; closed before c.
func admin(t *testing.T, c *kfake.Cluster) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// createTopic creates name on c with topic-level configs.
func createTopic(ctx context.Context, t *testing.T, c *kfake.Cluster, name string, configs map[string]string) {
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
	resp, err := req.RequestWith(ctx, admin(t, c))
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

// topicNames maps the ids of topics to their names: produce v13+
// addresses topics by id.
func topicNames(ctx context.Context, t *testing.T, c *kfake.Cluster, topics ...string) map[[16]byte]string {
	t.Helper()
	cl := admin(t, c)
	m := map[[16]byte]string{}
	for _, name := range topics {
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
		m[resp.Topics[0].TopicID] = name
	}
	return m
}

// refuse installs decide on every produce request and counts the requests
// it refused: a non-zero error code from a partition's record batch refuses
// the whole request with it.
func refuse(c *kfake.Cluster, names map[[16]byte]string, decide func(topic string, batch []byte) int16) *atomic.Int32 {
	refused := new(atomic.Int32)
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
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
				}
			}
		}
		if code == 0 {
			return nil, nil, false
		}
		refused.Add(1)
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
		return resp, nil, true
	})
	return refused
}
