package exactlyonce_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestTxnProducerSettings: the transactional client produces with the
// settings the idempotent sink has (sink.Config.ProducerOpts): a record
// with a partition column's value lands in that partition (the sink's
// partitioner; franz-go's default would hash its key), and keyed records
// stay together.
func TestTxnProducerSettings(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, "three"))
	tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	done := sinktest.NewOutcomes()
	for _, p := range []int32{2, 0, 1, 2} {
		rec := &router.Record{Topic: "three", Key: []byte("same-key"), Value: []byte{byte('0' + p)}, HasPartition: true, Partition: p}
		if err := tx.Produce(ctx, rec, done); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	for _, v := range []string{"k1", "k1", "k1"} {
		if err := tx.Produce(ctx, &router.Record{Topic: "three", Key: []byte(v), Value: []byte(v)}, done); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	tx.EndTxn(100)
	okOutcomes(ctx, t, done, 7)
	keyed := map[int32]bool{}
	for _, r := range readCommitted(ctx, t, c, "three", true, false) {
		if string(r.Key) == "k1" {
			keyed[r.Partition] = true
			continue
		}
		if want := int32(r.Value[0] - '0'); r.Partition != want {
			t.Fatalf("record with partition %d landed in %d", want, r.Partition)
		}
	}
	if len(keyed) != 1 {
		t.Fatalf("one key's records landed in partitions %v, want one", keyed)
	}
}
