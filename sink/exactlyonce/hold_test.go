package exactlyonce_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestTxnHoldUntil: under a hold, the PostgreSQL transactions handed over
// stay out of any Kafka transaction until one ends at or past the hold, or
// the stream passes it; then they commit in one. Flush does not commit
// them; a hold that keeps too much gives up.
func TestTxnHoldUntil(t *testing.T) {
	oneTxn := func(t *testing.T, c *kfake.Cluster, tp, want string) {
		t.Helper()
		recs := readCommitted(sinktest.Ctx(t), t, c, tp, true, true)
		markers := 0
		for _, r := range recs {
			if r.Attrs.IsControl() {
				markers++
			}
		}
		if got := fmt.Sprint(values(recs)); got != want || markers != 1 {
			t.Fatalf("read_committed sees %s with %d transaction markers, want %s in one transaction", got, markers, want)
		}
	}
	t.Run("a transaction past the hold", func(t *testing.T) {
		ctx := sinktest.Ctx(t)
		c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
		tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
		done := sinktest.NewOutcomes()
		produceTxn(ctx, t, tx, done, 100, "one", "repair1", "repair2") // the repair joins the transaction ending at 100
		tx.HoldUntil(300)
		produceTxn(ctx, t, tx, done, 200, "one", "b1")
		tx.Pass(250)
		done.None(t, 200*time.Millisecond) // 200 times the interval
		if err := tx.Flush(ctx); err == nil {
			t.Fatal("Flush under a hold committed")
		}
		done.None(t, 50*time.Millisecond)
		produceTxn(ctx, t, tx, done, 300, "one", "c1")
		for range 4 {
			if o := done.Wait(ctx, t); o.Err != nil {
				t.Fatalf("outcome %+v", o)
			}
		}
		if got := tx.Committed(); got != 300 {
			t.Fatalf("Committed() = %v, want 300", got)
		}
		oneTxn(t, c, "one", "[repair1 repair2 b1 c1]")
	})
	t.Run("the stream passes the hold", func(t *testing.T) {
		ctx := sinktest.Ctx(t)
		c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
		tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond)
		done := sinktest.NewOutcomes()
		tx.HoldUntil(300)
		produceTxn(ctx, t, tx, done, 100, "one", "a1")
		done.None(t, 100*time.Millisecond)
		tx.Pass(300)
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
		if got := tx.Committed(); got != 100 {
			t.Fatalf("Committed() = %v, want 100", got)
		}
	})
	t.Run("bounded", func(t *testing.T) {
		ctx := sinktest.Ctx(t)
		c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
		tx, _, _ := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond, func(cfg *exactlyonce.Config) { cfg.MaxRecords = 2 })
		done := sinktest.NewOutcomes()
		tx.HoldUntil(1000)
		for i := range 19 {
			produceTxn(ctx, t, tx, done, lsn.LSN(100+i), "one", fmt.Sprint("e", i))
		}
		done.None(t, 100*time.Millisecond)              // 19 < 10 x MaxRecords
		produceTxn(ctx, t, tx, done, 200, "one", "e19") // the 20th: the hold gives up and commits at once
		for range 16 {                                  // what the outcome channel holds; the other 4 overflow
			if o := done.Wait(ctx, t); o.Err != nil {
				t.Fatalf("outcome %+v", o)
			}
		}
		if n := done.Overflow(); n != 4 {
			t.Fatalf("%d outcomes past the channel, want 4", n)
		}
		if got := tx.Committed(); got != 200 {
			t.Fatalf("Committed() = %v, want 200", got)
		}
	})
}
