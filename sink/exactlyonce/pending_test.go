package exactlyonce_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestTxnPositionReadAwaitsOpenCommit: a position record of this source
// in a transaction still open when the positions topic is read is a commit
// whose outcome is not known yet. The coordinator answers EndTxn once the
// commit is decided and writes the markers afterwards (after a broker
// restart, once the partitions are back), so a read between the two found
// the record unmarked, took the position before it, and the start (or the
// settle of a lost answer) published that transaction's events again: the
// long exactly_once chaos run, seed 1106547526833261802, had one duplicate
// after a broker kill. The read waits for the transaction's marker and
// takes the position when it is a commit, the one before when an abort.
func TestTxnPositionReadAwaitsOpenCommit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit kgo.TransactionEndTry
		want   lsn.LSN
	}{
		{"committed", kgo.TryCommit, 200},
		{"aborted", kgo.TryAbort, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
			// The lost commit: this source's next position, its records
			// written, its outcome not yet marked. (Another transactional
			// id stands in for the earlier instance's: a start's fence
			// does not touch it.)
			late := openPosition(ctx, t, c, "earlier-instance")

			type started struct {
				pos lsn.LSN
				err error
				at  time.Time
			}
			got := make(chan started, 1)
			go func() {
				pos, err := startPosition(ctx, c, "sys/db/slot")
				got <- started{pos, err, time.Now()}
			}()
			time.Sleep(300 * time.Millisecond) // the start reads while the commit is open
			decided := time.Now()
			if err := late.EndTransaction(ctx, tc.commit); err != nil {
				t.Fatalf("end: %v", err)
			}
			select {
			case s := <-got:
				if s.err != nil {
					t.Fatalf("start: %v", s.err)
				}
				if s.pos != tc.want {
					t.Fatalf("start read position %v, want %v", s.pos, tc.want)
				}
				if s.at.Before(decided) {
					t.Fatalf("start returned before the open transaction was decided")
				}
			case <-ctx.Done():
				t.Fatal("start did not return after the open transaction was decided")
			}
		})
	}
}

// openPosition commits position 0/64 of source sys/db/slot, then leaves
// the next one, 0/C8, open in a transaction of transactional id txnID
// (closed when the test ends).
func openPosition(ctx context.Context, t *testing.T, c *kfake.Cluster, txnID string) *kgo.Client {
	t.Helper()
	first, _, closeFirst := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, first, done, 100, "one", "a1")
	okOutcomes(ctx, t, done, 1)
	closeFirst()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(positions))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("begin: %v", err)
	}
	rec := &kgo.Record{Key: []byte("sys/db/slot"), Value: []byte(`{"lsn":"0/C8","source":"sys/db/slot","txn":9}`)}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	return cl
}

// startPosition starts a transactional sink for source and returns the
// position its start read; it reports through its results only, so that it
// can run off the test goroutine.
func startPosition(ctx context.Context, c *kfake.Cluster, source string) (lsn.LSN, error) {
	tx, err := exactlyonce.New(txnConfig(c, source, time.Millisecond), slog.New(slog.DiscardHandler))
	if err != nil {
		return 0, err
	}
	defer tx.Close()
	pos, err := tx.Start(ctx)
	return pos.LSN, err
}

// TestTxnStartRefusesHangingPosition: a position of this source in a
// transaction that stays unmarked while its coordinator has ended it (here:
// another producer id's, which this transactional id's coordinator state
// cannot be running) is a hanging transaction: the start stops with what
// to do instead of guessing its outcome. No other partition has its marker,
// so no reader saw any of it: an abort there, and the restart publishes
// its events once, unless PostgreSQL was told they are delivered, which a
// start without Config.Acknowledged cannot know: the runbook says to check.
func TestTxnStartRefusesHangingPosition(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	openPosition(ctx, t, c, "hung")
	_, err := startPosition(ctx, c, "sys/db/slot")
	for _, w := range []string{"hanging transaction", "no marker on " + positions + "/0 from offset 2",
		"kafka-transactions.sh --bootstrap-server " + c.ListenAddrs()[0] + " abort --topic " + positions + " --partition 0 --start-offset 2",
		"from the position before it (lsn 0/64)", "confirmed_flush_lsn"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Fatalf("start: %v\nwant the hanging transaction on %s/0 and the commands that end it: %q", err, positions, w)
		}
	}
}
