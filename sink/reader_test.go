package sink_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestReadRangeTransactional: a range read of a topic written in
// transactions ends (its last offset is a commit marker, never handed out
// as a record) and returns the committed records only, not the copies of
// an aborted transaction.
func TestReadRangeTransactional(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("writer"), kgo.DefaultProduceTopic("one"))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cl.Close()
	since := time.Now().Add(-time.Minute)
	write := func(commit kgo.TransactionEndTry, ids ...string) {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		for _, id := range ids {
			rec := &kgo.Record{Key: []byte("k"), Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}}}
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
		}
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatalf("end: %v", err)
		}
	}
	write(kgo.TryCommit, "e1", "e2")
	write(kgo.TryAbort, "e3", "e4") // an aborted attempt's copies
	write(kgo.TryCommit, "e3", "e4", "e5")
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var ids []string
	_, err = sink.ReadRange(short, sink.Config{Brokers: c.ListenAddrs(), ClientID: "verify"}, []string{"one"}, since,
		func(r sink.ReadRecord) error {
			ids = append(ids, string(r.ID))
			return nil
		})
	if err != nil {
		t.Fatalf("ReadRange: %v", err)
	}
	if got := fmt.Sprint(ids); got != "[e1 e2 e3 e4 e5]" {
		t.Fatalf("read %s, want [e1 e2 e3 e4 e5]: the committed records, once each", got)
	}
}
