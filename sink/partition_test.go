package sink_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// A record with a partition (an outbox.fields partition column) goes there;
// one without goes where its key hashes (murmur2, as the Java producer); a
// partition the topic lacks fails the record for good, as it fails
// Debezium's task.
func TestRecordPartition(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t) // topic has 3 partitions
	s := newSink(t, c, nil)
	keyed := int32(kgo.StickyKeyPartitioner(nil).ForTopic(topic).Partition(&kgo.Record{Key: []byte("agg-1")}, 3))
	pinned := (keyed + 1) % 3
	tests := []struct {
		name string
		set  bool
		p    int32
		want int32
	}{
		{name: "by key", want: keyed},
		{name: "pinned", set: true, p: pinned, want: pinned},
		{name: "pinned to 0", set: true, p: 0, want: 0},
	}
	for _, tc := range tests {
		rec := baseRecord(topic, []byte(tc.name))
		rec.Partition, rec.HasPartition = tc.p, tc.set
		done := sinktest.NewOutcomes()
		sinktest.Produce(ctx, t, s, rec, done)
		if o := done.Wait(ctx, t); o != (sink.Outcome{}) {
			t.Fatalf("%s: outcome %+v", tc.name, o)
		}
	}
	for _, r := range sinktest.Consume(ctx, t, c, topic, len(tests)) {
		for _, tc := range tests {
			if string(r.Value) == tc.name && r.Partition != tc.want {
				t.Errorf("%s: partition %d, want %d", tc.name, r.Partition, tc.want)
			}
		}
	}

	rec := baseRecord(topic, []byte("beyond"))
	rec.Partition, rec.HasPartition = 3, true
	done := sinktest.NewOutcomes()
	sinktest.Produce(ctx, t, s, rec, done)
	o := done.Wait(ctx, t)
	if o.Err == nil || sink.Classify(o.Err) != sink.ClassFatal || o.DeadLettered {
		t.Fatalf("record for partition 3 of 3: outcome %+v (class %v), want a fatal error", o, sink.Classify(o.Err))
	}
}
