package exactlyonce_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
)

// A PostgreSQL transaction of more events than MaxRecords is committed in
// parts (split.go): these tests hand one over on kfake and read what
// read_committed sees and what the position records say.

const splitSource = "sys/db/split"

// splitTxn starts a producer committing parts of max events; fail gets
// the run's fatal errors.
func splitTxn(ctx context.Context, t *testing.T, c *kfake.Cluster, max int, fail func(error)) (*exactlyonce.Txn, exactlyonce.Position, func()) {
	t.Helper()
	cfg := txnConfig(c, splitSource, time.Millisecond)
	cfg.MaxRecords, cfg.Fail = max, fail
	tx, err := exactlyonce.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	closeOnce := sync.OnceFunc(tx.Close)
	t.Cleanup(closeOnce)
	pos, err := tx.Start(ctx)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return tx, pos, closeOnce
}

// handOver produces events from..to-1 of a transaction (values "e<i>").
func handOver(ctx context.Context, t *testing.T, tx *exactlyonce.Txn, done sink.Done, from, to int) error {
	t.Helper()
	for i := from; i < to; i++ {
		v := fmt.Sprintf("e%d", i)
		if err := tx.Produce(ctx, &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(v), Timestamp: time.Now()}, done); err != nil {
			return err
		}
	}
	return nil
}

func positionOf(ctx context.Context, t *testing.T, c *kfake.Cluster) exactlyonce.Position {
	t.Helper()
	var pos exactlyonce.Position
	for _, r := range readCommitted(ctx, t, c, positions, true, false) {
		if string(r.Key) == splitSource {
			pos = exactlyonce.Position{}
			if err := json.Unmarshal(r.Value, &pos); err != nil {
				t.Fatalf("position %s: %v", r.Value, err)
			}
		}
	}
	return pos
}

// events are the values of the transaction's events (key k), in their
// partition's order.
func events(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		if !r.Attrs.IsControl() && string(r.Key) == "k" {
			out = append(out, string(r.Value))
		}
	}
	return out
}

// parts is the txn_part header of each of the transaction's events.
func parts(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		if r.Attrs.IsControl() || string(r.Key) != "k" {
			continue
		}
		p := "-"
		for _, h := range r.Headers {
			if h.Key == wire.HeaderTxnPart {
				p = string(h.Value)
			}
		}
		out = append(out, p)
	}
	return out
}

// warm commits a first whole transaction ending at 100: a position exists.
func warm(ctx context.Context, t *testing.T, tx *exactlyonce.Txn, done *sinktest.Outcomes) {
	t.Helper()
	tx.BeginTxn(exactlyonce.TxnID{Final: 90, Xid: 9}, true)
	produceTxn(ctx, t, tx, done, 100, topic, "w")
	if o := done.Wait(ctx, t); o.Err != nil {
		t.Fatalf("first transaction: %+v", o)
	}
}

// TestSplitCommitsParts: 25 events of a transaction with parts of 10 are
// visible to read_committed as two parts (20 events) before it ends, the
// position says so, and its end commits the rest as the last part.
func TestSplitCommitsParts(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	tx, _, _ := splitTxn(ctx, t, c, 10, nil)
	done := sinktest.OutcomesFor(64)
	warm(ctx, t, tx, done)
	id := exactlyonce.TxnID{Final: 500, Xid: 77}
	tx.BeginTxn(id, true)
	if err := handOver(ctx, t, tx, done, 0, 25); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("part outcome %+v", o)
		}
	}
	done.None(t, 50*time.Millisecond)
	if got := events(readCommitted(ctx, t, c, topic, true, false)); len(got) != 20 || got[19] != "e19" {
		t.Fatalf("read_committed before the end sees %d events (%v), want e0..e19", len(got), got)
	}
	pos := positionOf(ctx, t, c)
	if pos.LSN != 100 || pos.Part == nil || *pos.Part != (exactlyonce.Part{Final: 500, Xid: 77, Events: 20, Parts: 2, Last: pos.Part.Last}) {
		t.Fatalf("position %+v (part %+v), want LSN 100 and 20 events of 77@500 in 2 parts", pos, pos.Part)
	}
	tx.EndTxn(600)
	for range 5 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("last part outcome %+v", o)
		}
	}
	recs := readCommitted(ctx, t, c, topic, true, false)
	got := events(recs)
	if len(got) != 25 {
		t.Fatalf("read_committed sees %d events, want 25", len(got))
	}
	for i, v := range got {
		if v != fmt.Sprintf("e%d", i) {
			t.Fatalf("event %d is %s: out of order", i, v)
		}
	}
	want := strings.TrimSpace(strings.Repeat(" 1", 10) + strings.Repeat(" 2", 10) + strings.Repeat(" 3/3", 5))
	if hs := strings.Join(parts(recs), " "); hs != want {
		t.Fatalf("txn_part headers\n%s\nwant\n%s", hs, want)
	}
	if pos := positionOf(ctx, t, c); pos.LSN != 600 || pos.Part != nil {
		t.Fatalf("position after the end %+v, want 600 without a part", pos)
	}
}

// TestSplitRestartPassesOverCommittedParts: the producer stops (a kill) with
// two parts committed; the next one reads the part from the position, the
// transaction comes again whole, and read_committed sees each event once.
func TestSplitRestartPassesOverCommittedParts(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	first, _, stop := splitTxn(ctx, t, c, 10, nil)
	done := sinktest.OutcomesFor(64)
	warm(ctx, t, first, done)
	id := exactlyonce.TxnID{Final: 500, Xid: 77}
	first.BeginTxn(id, true)
	if err := handOver(ctx, t, first, done, 0, 27); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		done.Wait(ctx, t)
	}
	stop()

	second, pos, _ := splitTxn(ctx, t, c, 10, nil)
	if pos.LSN != 100 || pos.Part == nil || pos.Part.Events != 20 {
		t.Fatalf("start position %+v (part %+v), want 100 with 20 events of the transaction", pos, pos.Part)
	}
	if !second.Resuming() {
		t.Fatal("Resuming() = false with a part committed")
	}
	again := sinktest.OutcomesFor(64)
	second.BeginTxn(id, true)
	if !second.Resumes(id) {
		t.Fatal("Resumes(77@500) = false")
	}
	if err := handOver(ctx, t, second, again, 0, 33); err != nil {
		t.Fatal(err)
	}
	second.EndTxn(600)
	for i := range 33 {
		if o := again.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %d: %+v", i, o)
		}
	}
	got := events(readCommitted(ctx, t, c, topic, true, false))
	if len(got) != 33 {
		t.Fatalf("read_committed sees %d events, want 33 (e0..e32 once each): %v", len(got), got)
	}
	for i, v := range got {
		if v != fmt.Sprintf("e%d", i) {
			t.Fatalf("event %d is %s: lost or repeated", i, v)
		}
	}
	if p := positionOf(ctx, t, c); p.LSN != 600 || p.Part != nil {
		t.Fatalf("position %+v, want 600", p)
	}
}

// TestSplitReconnectPassesOver: a reconnect (AbortTxn) in the middle of a
// split transaction; the stream sends it again and the committed parts are
// passed over.
func TestSplitReconnectPassesOver(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	tx, _, _ := splitTxn(ctx, t, c, 10, nil)
	done := sinktest.OutcomesFor(128)
	warm(ctx, t, tx, done)
	id := exactlyonce.TxnID{Final: 500, Xid: 77}
	tx.BeginTxn(id, true)
	if err := handOver(ctx, t, tx, done, 0, 15); err != nil {
		t.Fatal(err)
	}
	tx.AbortTxn()
	tx.BeginTxn(id, true)
	if err := handOver(ctx, t, tx, done, 0, 22); err != nil {
		t.Fatal(err)
	}
	tx.EndTxn(600)
	var aborted, ok int
	for range 15 + 22 {
		o := done.Wait(ctx, t)
		switch {
		case o.Err == nil:
			ok++
		case errors.Is(o.Err, kgo.ErrAborting):
			aborted++
		default:
			t.Fatalf("outcome %+v", o)
		}
	}
	if ok != 10+22 || aborted != 5 {
		t.Fatalf("%d delivered, %d aborted; want 32 and the 5 not in a part", ok, aborted)
	}
	got := events(readCommitted(ctx, t, c, topic, true, false))
	if want := 22; len(got) != want {
		t.Fatalf("read_committed sees %d events, want %d: %v", len(got), want, got)
	}
}

// TestSplitRefusesAnotherTransaction: at start the position names a
// transaction committed in part; one that decodes to other events, or a
// stream past it, stops the run rather than lose or repeat events.
func TestSplitRefusesAnotherTransaction(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(ctx context.Context, tx *exactlyonce.Txn, done sink.Done) error
	}{
		{"other events", func(ctx context.Context, tx *exactlyonce.Txn, done sink.Done) error {
			tx.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, true)
			for i := range 12 {
				rec := &router.Record{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprintf("other%d", i))}
				if err := tx.Produce(ctx, rec, done); err != nil {
					return err
				}
			}
			return nil
		}},
		{"stream past it", func(_ context.Context, tx *exactlyonce.Txn, _ sink.Done) error {
			tx.BeginTxn(exactlyonce.TxnID{Final: 700, Xid: 78}, true)
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t)
			first, _, stop := splitTxn(ctx, t, c, 10, nil)
			done := sinktest.OutcomesFor(64)
			warm(ctx, t, first, done)
			first.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, true)
			if err := handOver(ctx, t, first, done, 0, 11); err != nil {
				t.Fatal(err)
			}
			stop()
			fails := make(chan error, 4)
			second, _, _ := splitTxn(ctx, t, c, 10, func(err error) { fails <- err })
			_ = tc.run(ctx, second, sinktest.OutcomesFor(64))
			select {
			case err := <-fails:
				if !strings.Contains(err.Error(), "77@0/1F4") {
					t.Fatalf("fatal error %v does not name the transaction", err)
				}
			case <-time.After(time.Second):
				t.Fatal("no fatal error")
			}
		})
	}
}

// TestSplitKeepsWhole: a transaction the pipeline keeps whole (a gap repair
// depends on it), or the very first of a source (no position to commit with
// a part), is not split.
func TestSplitKeepsWhole(t *testing.T) {
	for _, tc := range []struct {
		name    string
		warm    bool
		allowed bool
	}{
		{"not allowed", true, false},
		{"first of the source, no floor", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			c := sinktest.NewCluster(t)
			tx, _, _ := splitTxn(ctx, t, c, 10, nil)
			done := sinktest.OutcomesFor(64)
			if tc.warm {
				warm(ctx, t, tx, done)
			}
			tx.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, tc.allowed)
			if err := handOver(ctx, t, tx, done, 0, 25); err != nil {
				t.Fatal(err)
			}
			done.None(t, 100*time.Millisecond)
			tx.EndTxn(lsn.LSN(600))
			for range 25 {
				if o := done.Wait(ctx, t); o.Err != nil {
					t.Fatalf("outcome %+v", o)
				}
			}
			recs := readCommitted(ctx, t, c, topic, true, false)
			for _, p := range parts(recs) {
				if p != "-" {
					t.Fatalf("txn_part %s on a transaction kept whole", p)
				}
			}
		})
	}
}

// TestSplitReadBackAndPassOver: the restart runs a read-back (a position
// whose history mark lags), which holds back the first events of the
// transaction it finds in Kafka (HeldBack), then the producer passes over
// the rest of what the part committed: together they skip exactly the
// committed events, never more.
func TestSplitReadBackAndPassOver(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	first, _, stop := splitTxn(ctx, t, c, 10, nil)
	done := sinktest.OutcomesFor(64)
	warm(ctx, t, first, done)
	id := exactlyonce.TxnID{Final: 500, Xid: 77}
	first.BeginTxn(id, true)
	if err := handOver(ctx, t, first, done, 0, 11); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		done.Wait(ctx, t)
	}
	stop()
	second, _, _ := splitTxn(ctx, t, c, 10, nil)
	second.BeginTxn(id, false)
	if !second.Resumes(id) {
		t.Fatal("not resumed")
	}
	for range 5 { // the read-back found e0..e4
		second.HeldBack()
	}
	second.Allow() // and ended at e5
	again := sinktest.OutcomesFor(64)
	if err := handOver(ctx, t, second, again, 5, 12); err != nil {
		t.Fatal(err)
	}
	second.EndTxn(600)
	for range 7 {
		if o := again.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
	}
	got := events(readCommitted(ctx, t, c, topic, true, false))
	if want := "[e0 e1 e2 e3 e4 e5 e6 e7 e8 e9 e10 e11]"; fmt.Sprint(got) != want {
		t.Fatalf("read_committed sees %v, want %s", got, want)
	}
}

// TestSplitFirstTransactionFromTheFloor: the first transaction of a source
// (no position yet) is split once the run's floor is known: its parts are
// committed with the floor as position.
func TestSplitFirstTransactionFromTheFloor(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	tx, _, _ := splitTxn(ctx, t, c, 10, nil)
	tx.SetFloor(50)
	done := sinktest.OutcomesFor(64)
	tx.BeginTxn(exactlyonce.TxnID{Final: 500, Xid: 77}, true)
	if err := handOver(ctx, t, tx, done, 0, 15); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("part outcome %+v", o)
		}
	}
	if pos := positionOf(ctx, t, c); pos.LSN != 50 || pos.Part == nil || pos.Part.Events != 10 {
		t.Fatalf("position %+v (part %+v), want the floor 50 with 10 events", pos, pos.Part)
	}
}

// TestSplitCountsHeldBackEvents: a read-back held back the first events of
// the transaction (Kafka has them) and ended inside it (Allow); the parts
// cut after count the held-back events too, so a restart without a
// read-back, which hands every event over, passes over the same ones.
func TestSplitCountsHeldBackEvents(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t)
	first, _, stop := splitTxn(ctx, t, c, 10, nil)
	first.SetFloor(50)
	done := sinktest.OutcomesFor(64)
	id := exactlyonce.TxnID{Final: 500, Xid: 77}
	first.BeginTxn(id, false)
	for range 5 { // e0..e4: in Kafka already
		first.HeldBack()
	}
	first.Allow()
	if err := handOver(ctx, t, first, done, 5, 16); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if o := done.Wait(ctx, t); o.Err != nil {
			t.Fatalf("part outcome %+v", o)
		}
	}
	stop()
	if pos := positionOf(ctx, t, c); pos.Part == nil || pos.Part.Events != 15 {
		t.Fatalf("position %+v (part %+v), want 15 events of the transaction committed (5 held back, 10 in the part)", pos, pos.Part)
	}
	second, _, _ := splitTxn(ctx, t, c, 10, nil)
	again := sinktest.OutcomesFor(64)
	second.BeginTxn(id, true)
	if err := handOver(ctx, t, second, again, 0, 20); err != nil {
		t.Fatal(err)
	}
	second.EndTxn(600)
	for range 20 {
		if o := again.Wait(ctx, t); o.Err != nil {
			t.Fatalf("outcome %+v", o)
		}
	}
	got := events(readCommitted(ctx, t, c, topic, true, false))
	if want := "[e5 e6 e7 e8 e9 e10 e11 e12 e13 e14 e15 e16 e17 e18 e19]"; fmt.Sprint(got) != want {
		t.Fatalf("read_committed sees %v, want %s", got, want)
	}
}
