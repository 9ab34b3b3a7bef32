package exactlyonce_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestTxnStartRefusesHangingEventPartition: the last transaction's marker
// reached the positions partition but not an event partition (a
// multi-broker cluster where only that partition's leader was missing when
// the coordinator sent them). The positions read alone saw a decided
// transaction and went on: an aborted one's events were published again
// and the next commit on that partition showed both copies; a committed
// one left read_committed consumers stopped there. The start looks at the
// event partitions too (DescribeProducers) and stops with the runbook for
// that partition: an abort when the transaction aborted, and, when it
// committed, that it needs a COMMIT marker no kafka-transactions.sh command
// writes.
func TestTxnStartRefusesHangingEventPartition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit bool
		want   []string
		not    []string
	}{
		{"aborted", false, []string{"aborted; no marker on one/0 from offset 2", "abort --topic one --partition 0 --start-offset 2",
			"find-hanging --topic one --partition 0", "publishes its events once, again, from the position before it (lsn 0/64)"},
			[]string{"abort --topic " + positions}},
		{"committed", true, []string{"committed; no marker on one/0 from offset 2", "COMMIT marker on one/0",
			"cannot be repaired with it without loss or duplicates", "goes on after lsn 0/C8"},
			[]string{"abort --topic"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
			hangOnEvents(ctx, t, c, tc.commit)
			_, err := startPosition(ctx, c, "sys/db/slot")
			if err == nil || !strings.Contains(err.Error(), "hanging transaction") {
				t.Fatalf("start: %v; want a hanging transaction on one/0", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("start: %v\nwant it to say %q", err, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(err.Error(), n) {
					t.Fatalf("start: %v\nwant it not to say %q", err, n)
				}
			}
		})
	}
}

// hangOnEvents commits position 0/64 of source sys/db/slot (its
// transaction wrote to one/0 at offset 0), then leaves the next
// transaction (an event on one/0, position 0/C8) with a marker on the
// positions partition only: a WriteTxnMarkers request, as a coordinator
// whose marker to one/0 was dropped. Another transactional id writes it (a
// start's fence does not touch it), so its producer id is not the one the
// coordinator of this source's id runs: the coordinator is done with it.
func hangOnEvents(ctx context.Context, t *testing.T, c *kfake.Cluster, commit bool) {
	t.Helper()
	first, _, closeFirst := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, first, done, 100, "one", "a1")
	okOutcomes(ctx, t, done, 1)
	closeFirst()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("earlier-instance"))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("begin: %v", err)
	}
	for _, r := range []*kgo.Record{{Topic: "one", Value: []byte("b1")},
		{Topic: positions, Key: []byte("sys/db/slot"), Value: []byte(`{"lsn":"0/C8","source":"sys/db/slot","txn":9,"topics":["one"]}`)}} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatalf("producer id: %v", err)
	}
	m := kadm.TxnMarkers{ProducerID: pid, ProducerEpoch: epoch, Commit: commit, Topics: kadm.TopicsSet{positions: {0: {}}}}
	resp, err := kadm.NewClient(cl).WriteTxnMarkers(ctx, m)
	if err == nil {
		resp.EachPartition(func(p kadm.TxnMarkersPartitionResponse) {
			if err == nil {
				err = p.Err
			}
		})
	}
	if err != nil {
		t.Fatalf("marker on %s/0: %v", positions, err)
	}
}

// TestTxnPositionNamesTopics: each position record names the topics this
// source's transactions wrote to lately, the next instance's too (what a
// start looks for a hanging transaction on), also when its last
// transaction was the idle check's, which writes no event.
func TestTxnPositionNamesTopics(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one", "two"))
	tx, _, closeTx := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "a1")
	produceTxn(ctx, t, tx, done, 200, "two", "b1")
	okOutcomes(ctx, t, done, 2)
	closeTx()
	first := lastPositionOf(ctx, t, c)
	if got := fmt.Sprint(first.Topics); got != "[one two]" {
		t.Fatalf("position names topics %s, want [one two]", got)
	}
	_, _, closeNext := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.FenceCheck = 50 * time.Millisecond
	})
	time.Sleep(time.Second) // its idle checks commit the position again
	closeNext()
	next := lastPositionOf(ctx, t, c)
	if next.Txn == first.Txn || fmt.Sprint(next.Topics) != "[one two]" {
		t.Fatalf("the next instance's idle position: txn %d (first %d), topics %v; want a later one naming [one two]", next.Txn, first.Txn, next.Topics)
	}
}

// lastPositionOf is the last committed position of source sys/db/slot.
func lastPositionOf(ctx context.Context, t *testing.T, c *kfake.Cluster) exactlyonce.Position {
	t.Helper()
	var pos exactlyonce.Position
	for _, r := range readCommitted(ctx, t, c, positions, true, false) {
		if string(r.Key) == "sys/db/slot" {
			if err := json.Unmarshal(r.Value, &pos); err != nil {
				t.Fatalf("position %s: %v", r.Value, err)
			}
		}
	}
	return pos
}
