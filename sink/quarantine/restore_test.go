package quarantine_test

import (
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestQuarantineRestoreRetriedReadsFromStart: a restore that fails after it
// read part of the state topic is retried from the topic's start, not from
// where the failed attempt stopped: every saved quarantine is restored, and
// the records of each quarantined key are parked, none delivered.
func TestQuarantineRestoreRetriedReadsFromStart(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	first, closeFirst := sinktest.NewSink(t, c, nil, savedMode)
	if err := first.StartQuarantines(ctx); err != nil {
		t.Fatal(err)
	}
	// One state record each, a's first.
	for i, key := range []string{"a", "b"} {
		res := sinktest.NewResults(1)
		sinktest.Produce(ctx, t, first, routerDead(key, i), res.Slot(0))
		if o := res.All(ctx, t, 1)[0]; !o.DeadLettered {
			t.Fatalf("%s: outcome %+v, want dead-lettered", key, o)
		}
	}
	stateID := sinktest.TopicID(ctx, t, sinktest.Admin(t, c), stateTopic)
	closeFirst()

	// The next start reads one batch per fetch; its first fetch of the
	// state topic past offset 0 fails (an ACL revoked for a moment).
	var failed atomic.Bool
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		for _, rt := range req.Topics {
			if rt.Topic != stateTopic && rt.TopicID != stateID {
				continue
			}
			for _, rp := range rt.Partitions {
				if rp.FetchOffset > 0 && failed.CompareAndSwap(false, true) {
					resp := req.ResponseKind().(*kmsg.FetchResponse)
					st := kmsg.NewFetchResponseTopic()
					st.Topic, st.TopicID = rt.Topic, rt.TopicID
					sp := kmsg.NewFetchResponseTopicPartition()
					sp.Partition, sp.ErrorCode = rp.Partition, kerr.TopicAuthorizationFailed.Code
					st.Partitions = append(st.Partitions, sp)
					resp.Topics = append(resp.Topics, st)
					return resp, nil, true
				}
			}
		}
		return nil, nil, false
	})
	s, _ := sinktest.NewSink(t, c, nil, savedMode, kgo.FetchMaxBytes(1), kgo.FetchMaxPartitionBytes(1))
	if err := s.StartQuarantines(ctx); err != nil {
		t.Fatalf("StartQuarantines: %v; want the start to go on", err)
	}
	res := sinktest.NewResults(3)
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "a", 2, ""), res.Slot(0))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "b", 3, ""), res.Slot(1))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "c", 4, ""), res.Slot(2))
	out := res.All(ctx, t, 3)
	if !failed.Load() {
		t.Fatal("the restore's fetch was never refused: the test did not test the retry")
	}
	if !out[0].Parked || !out[1].Parked || out[2] != (sink.Outcome{}) {
		t.Fatalf("outcomes %+v: want a parked, b parked, c delivered (quarantines restored: %+v)", out, s.Quarantined())
	}
}
