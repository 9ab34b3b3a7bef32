package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// TestReview5ReadBackUserTopicHeader: sink.ReadRange now takes a record's
// first "topic" header as the topic it was meant for (sink/reader.go:84,
// ReadRecord.Orig), for dead letters and parked records, and the read-back
// fingerprints every record it reads under that topic (readback.go:200).
// "topic" is no reserved header (wire.Reserved): outbox.header_columns may
// name a column topic, and every event of such an outbox carries the
// header on its own topic. The read-back then fingerprints those records
// under the header's value, never finds the event under its own topic, and
// ends at the first one: what Kafka holds is published again (DUPLICATE),
// a regression of this change (before it, the record's own topic was
// used).
func TestReview5ReadBackUserTopicHeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "outbox.dlq", "outbox.parking"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cl.Close()
	commit := time.Now()
	// What the last run published: an event whose header column "topic"
	// holds an application value.
	rec := &router.Record{Topic: "orders", Key: []byte("k1"), Value: []byte(`{"n":1}`), Timestamp: commit,
		Headers: []router.Header{{Key: wire.HeaderID, Value: []byte("e1")}, {Key: "topic", Value: []byte("billing")}}}
	kr := &kgo.Record{Topic: rec.Topic, Key: rec.Key, Value: rec.Value, Timestamp: commit}
	for _, h := range rec.Headers {
		kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if err := cl.ProduceSync(ctx, kr).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}

	cfg := sink.Config{Brokers: c.ListenAddrs()}
	rb := newReadBack(ctx, func(ctx context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadRange(ctx, cfg, topics, since, fn)
	}, time.Time{}, discard)
	rb.side = []string{"outbox.dlq", "outbox.parking"} // as eos.startReadBack sets them
	held, err := rb.inKafka(ctx, rec, commit)
	if err != nil {
		t.Fatalf("inKafka: %v", err)
	}
	if !held {
		t.Fatalf("DUPLICATE: event e1 is in orders as it comes again, but the read-back does not find it (its header \"topic\" was taken for a dead letter's): it is published again")
	}
}
