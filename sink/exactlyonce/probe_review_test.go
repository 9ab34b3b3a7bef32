package exactlyonce_test

// Adversarial review reproduction (history marks).

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
)

// TestReviewProbeRestampsUnprovenPosition: the idle probe commits the LAST
// COMMITTED LSN again with the CURRENT proof (positionRecord reads
// cfg.Proof()). After a start that did not trust that LSN (decideStart's
// "kafka-proof": committed E past its mark's C; the server was restored to R
// with C < R < E and wrote past E), the run's proof moves to its own mark,
// decoded past E on the new history, while the new history's transactions
// in (R, E] wait in the batch (kafka.transaction_interval, a repair's hold).
// The probe then commits {LSN: E, Mark: new, MarkAt >= E}: a position that
// the NEXT start trusts whole (m.found && m.at >= committed), skipping the
// new history's (R, E] that never reached Kafka. A crash before the batch
// commits loses them.
func TestReviewProbeRestampsUnprovenPosition(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one"))
	// Run 1, old history: commits E=100 while its proof is mark 5 at C=50.
	tx, _, closeA := newTxn(ctx, t, c, "sys/db/slot", time.Millisecond, func(cfg *exactlyonce.Config) {
		cfg.Proof = func() (uint64, lsn.LSN, time.Time) { return 5, 50, time.Time{} }
	})
	done := sinktest.NewOutcomes()
	produceTxn(ctx, t, tx, done, 100, "one", "old")
	okOutcomes(ctx, t, done, 1)
	closeA()
	if p := lastPositionOf(ctx, t, c); p.LSN != 100 || p.Mark != 5 || p.MarkAt != 50 {
		t.Fatalf("run 1 committed %+v", p)
	}
	// Run 2, on the restored server: its start trusts 50 only (kafka-proof).
	var proof atomic.Uint64
	proof.Store(50)
	tx2, committed, closeB := newTxn(ctx, t, c, "sys/db/slot", time.Minute, func(cfg *exactlyonce.Config) {
		cfg.Proof = func() (uint64, lsn.LSN, time.Time) {
			if p := lsn.LSN(proof.Load()); p != 50 {
				return 9, p, time.Time{}
			}
			return 5, 50, time.Time{}
		}
		cfg.FenceCheck = 50 * time.Millisecond
	})
	if committed != 100 {
		t.Fatalf("run 2 read %v", committed)
	}
	// The new history's transaction ending at 80 (below E) is handed over and
	// waits for the interval; the processor then decodes the run's mark 9 at
	// 200 (>= E), which becomes the proof.
	produceTxn(ctx, t, tx2, sinktest.NewOutcomes(), 80, "one", "new")
	proof.Store(200)
	time.Sleep(500 * time.Millisecond) // idle probes run meanwhile
	closeB()                           // the crash: the batch never commits
	p := lastPositionOf(ctx, t, c)
	if p.Mark == 9 && p.MarkAt >= p.LSN && p.LSN > 80 {
		t.Fatalf("the probe committed %v proven by mark %d at %v: the next start skips to %v on the new history "+
			"although its transaction ending at 80 is not in Kafka (read_committed: %v)",
			p.LSN, p.Mark, p.MarkAt, p.LSN, values(readCommitted(ctx, t, c, "one", true, false)))
	}
}
