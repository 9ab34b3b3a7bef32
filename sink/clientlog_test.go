package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The contract tests of clientlog.go: the pinned franz-go, against kfake,
// emits each line the repair reads, and the matcher holds the topic back
// for it before the records' promises run.

// heardLog records what franz-go logged and which topics the matcher held.
type heardLog struct {
	mu   sync.Mutex
	msgs []string
	held []string
}

func (h *heardLog) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (h *heardLog) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	h.mu.Lock()
	h.msgs = append(h.msgs, msg)
	if testing.Verbose() {
		fmt.Println("LOG", msg, keyvals)
	}
	h.mu.Unlock()
	clientLog{hold: func(topic string) {
		h.mu.Lock()
		h.held = append(h.held, topic+" after "+msg)
		h.mu.Unlock()
	}}.Log(level, msg, keyvals...)
}

// check fails unless franz-go logged want and the matcher held topic for it.
func (h *heardLog) check(t *testing.T, want, topic string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	logged := false
	for _, m := range h.msgs {
		logged = logged || strings.Contains(m, want)
	}
	if !logged {
		t.Fatalf("franz-go did not log %q (reworded?); it logged %q", want, h.msgs)
	}
	for _, x := range h.held {
		if strings.HasPrefix(x, topic+" after ") && strings.Contains(x, want) {
			return
		}
	}
	t.Fatalf("the matcher did not hold %s back for %q; held %q", topic, want, h.held)
}

// produceFails produces one record to topic and waits for its failure.
func produceFails(t *testing.T, cl *kgo.Client, topic string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}).FirstErr()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("produce to %s: %v, want a refusal", topic, err)
	}
	return err
}

func contractClient(t *testing.T, c *kfake.Cluster, h *heardLog, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.WithLogger(h),
		kgo.MetadataMinAge(10 * time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond })}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func TestClientLogBatchFailed(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "refusing"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.MessageTooLarge.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	h := &heardLog{}
	if err := produceFails(t, contractClient(t, c, h), "refusing"); !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("produce: %v, want MESSAGE_TOO_LARGE", err)
	}
	h.check(t, logBatchFailed, "refusing")
}

func TestClientLogLoadErrorWillFail(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "deleted"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := &heardLog{}
	cl := contractClient(t, c, h, kgo.UnknownTopicRetries(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Known first, then gone: the partition's metadata keeps failing.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "deleted", Value: []byte("v")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := kadm.NewClient(cl).DeleteTopic(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	if err := produceFails(t, cl, "deleted"); !errors.Is(err, kerr.UnknownTopicOrPartition) && !errors.Is(err, kerr.UnknownTopicID) {
		t.Fatalf("produce: %v, want the topic unknown", err)
	}
	h.check(t, logLoadError, "deleted")
}

func TestClientLogUnknownTopicFailed(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := &heardLog{}
	if err := produceFails(t, contractClient(t, c, h, kgo.UnknownTopicRetries(1)), "never"); !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("produce: %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}
	h.check(t, logUnknownFailed, "never")
}
