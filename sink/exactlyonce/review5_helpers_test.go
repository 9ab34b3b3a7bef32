package exactlyonce_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// Review 5: dlq.mode quarantine with kafka.delivery exactly_once, on kfake.

const (
	r5Parking = "outbox.parking"
	r5State   = "outbox-cdc.quarantine"
	r5Small   = "small" // max.message.bytes 1024: a bigger event is dead-lettered
	r5Source  = "sys/db/r5"
)

// r5Cluster is a kfake cluster with the sink topics, the parking topic
// and a topic "small" whose limit dead-letters events over 1 KiB.
func r5Cluster(ctx context.Context, t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c := sinktest.NewCluster(t, append([]kfake.Opt{kfake.SeedTopics(3, r5Parking)}, opts...)...)
	sinktest.CreateTopic(ctx, t, sinktest.Admin(t, c), r5Small, map[string]string{"max.message.bytes": "1024"})
	return c
}

// r5Config is a transactional producer in dlq.mode quarantine.
func r5Config(c *kfake.Cluster) exactlyonce.Config {
	cfg := txnConfig(c, r5Source, 5*time.Millisecond)
	cfg.Sink.ParkingTopic = r5Parking
	cfg.Sink.QuarantineTopic = r5State
	cfg.Sink.QuarantineSource = r5Source
	return cfg
}

// r5Txn starts the producer and its quarantines; closed before the cluster.
func r5Txn(ctx context.Context, t *testing.T, cfg exactlyonce.Config) (*exactlyonce.Txn, func()) {
	t.Helper()
	tx, err := exactlyonce.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	closeOnce := sync.OnceFunc(tx.Close)
	t.Cleanup(closeOnce)
	if _, err := tx.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := tx.StartQuarantines(ctx); err != nil {
		t.Fatalf("StartQuarantines: %v", err)
	}
	return tx, closeOnce
}

// r5Event is an event of key k with id id to tp; big makes it too large
// for topic small.
func r5Event(tp, k, id string, big bool) *router.Record {
	v := "v-" + id
	if big {
		v += strings.Repeat("x", 4096)
	}
	return &router.Record{Topic: tp, Key: []byte(k), Value: []byte(v), Timestamp: time.Now(),
		Headers: []router.Header{{Key: wire.HeaderID, Value: []byte(id)}}}
}

// r5Hand hands one PostgreSQL transaction of recs over, ending at end, and
// waits for every outcome.
func r5Hand(ctx context.Context, t *testing.T, tx *exactlyonce.Txn, end lsn.LSN, recs ...*router.Record) []sink.Outcome {
	t.Helper()
	res := sinktest.NewResults(len(recs))
	for i, r := range recs {
		if err := tx.Produce(ctx, r, res.Slot(i)); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	tx.EndTxn(end)
	return res.All(ctx, t, len(recs))
}

// r5IDs is the id header of each record of recs for key k (all keys: "").
func r5IDs(recs []*kgo.Record, k string) []string {
	var out []string
	for _, r := range recs {
		if r.Attrs.IsControl() || k != "" && string(r.Key) != k {
			continue
		}
		id, _ := sinktest.Header(r, wire.HeaderID)
		out = append(out, id)
	}
	return out
}

// r5States is the committed state records of key k on the state topic,
// in order (nil: a tombstone).
func r5States(ctx context.Context, t *testing.T, c *kfake.Cluster, k string) []*quarantine.StateRecord {
	t.Helper()
	var out []*quarantine.StateRecord
	for _, r := range readCommitted(ctx, t, c, r5State, true, false) {
		if string(r.Key) != r5Source+"/"+k {
			continue
		}
		if r.Value == nil {
			out = append(out, nil)
			continue
		}
		var rec quarantine.StateRecord
		if err := json.Unmarshal(r.Value, &rec); err != nil {
			t.Fatalf("state record %s: %v", r.Value, err)
		}
		out = append(out, &rec)
	}
	return out
}
