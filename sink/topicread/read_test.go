package topicread_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/sink/topicread"
)

func setup(t *testing.T) (context.Context, *kfake.Cluster, *topicread.Reader) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "one"))
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	rd, err := topicread.New(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rd.Close)
	return ctx, c, rd
}

// writer is a producer to topic one of c, closed when the test ends.
func writer(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("one")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func values(ctx context.Context, t *testing.T, rd *topicread.Reader, ranges topicread.Ranges) (string, error) {
	t.Helper()
	var got []string
	err := rd.Read(ctx, ranges, func(r *kgo.Record) error {
		got = append(got, string(r.Value))
		return nil
	})
	return fmt.Sprint(got), err
}

// TestReadCommittedToTheEnd: a read hands out the records outside
// transactions and the committed ones, not an aborted transaction's nor one
// still open at the end, and it ends although the last offsets listed are
// the open transaction's.
func TestReadCommittedToTheEnd(t *testing.T) {
	ctx, c, rd := setup(t)
	plain, txn := writer(t, c), writer(t, c, kgo.TransactionalID("w"))
	produce := func(cl *kgo.Client, v string) {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", v, err)
		}
	}
	begin := func(vs ...string) {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			produce(txn, v)
		}
	}
	end := func(how kgo.TransactionEndTry) {
		if err := txn.EndTransaction(ctx, how); err != nil {
			t.Fatal(err)
		}
	}
	produce(plain, "a")
	begin("b", "c")
	end(kgo.TryCommit)
	begin("x")
	end(kgo.TryAbort)
	produce(plain, "d")
	begin("y") // left open
	ranges, missing, err := rd.Whole(ctx, "one", "none")
	if err != nil || fmt.Sprint(missing) != "[none]" {
		t.Fatalf("Whole: %v, missing %v; want [none] missing", err, missing)
	}
	got, err := values(ctx, t, rd, ranges)
	if err != nil || got != "[a b c d]" {
		t.Fatalf("read %s, %v; want [a b c d]", got, err)
	}
}

// TestReadDeletedIsAnError: records deleted before they are read stop the
// read with OFFSET_OUT_OF_RANGE instead of a reset past them; Whole starts
// at the log start.
func TestReadDeletedIsAnError(t *testing.T) {
	ctx, c, rd := setup(t)
	cl := writer(t, c)
	for i := range 5 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "v%d", i)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	offs := kadm.Offsets{}
	offs.AddOffset("one", 0, 3, -1)
	if _, err := kadm.NewClient(cl).DeleteRecords(ctx, offs); err != nil {
		t.Fatalf("delete records: %v", err)
	}
	ranges := topicread.Ranges{}
	ranges.Add("one", 0, topicread.Span{From: 1, Until: 5})
	if got, err := values(ctx, t, rd, ranges); !errors.Is(err, kerr.OffsetOutOfRange) {
		t.Fatalf("read %s, %v; want OFFSET_OUT_OF_RANGE", got, err)
	}
	whole, _, err := rd.Whole(ctx, "one")
	if err != nil || whole["one"][0] != (topicread.Span{From: 3, Until: 5}) {
		t.Fatalf("Whole: %+v, %v; want 3 to 5", whole, err)
	}
}

// TestReadAwaitingOpenTransaction: a transaction open at the end that holds
// an awaited record is read to its marker, past the end (its records when
// it commits, none when it aborts, its awaited ones to Await.Aborted then);
// what others wrote past the end stays out; an open transaction without an
// awaited record is not waited for.
func TestReadAwaitingOpenTransaction(t *testing.T) {
	for _, tc := range []struct {
		name    string
		how     kgo.TransactionEndTry
		want    string
		aborted string
	}{
		{"committed", kgo.TryCommit, "[a y1 y2]", "[]"},
		{"aborted", kgo.TryAbort, "[a]", "[y2]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, c, rd := setup(t)
			plain, awaited, other := writer(t, c), writer(t, c, kgo.TransactionalID("w")), writer(t, c, kgo.TransactionalID("o"))
			produce := func(cl *kgo.Client, vs ...string) {
				for _, v := range vs {
					if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
						t.Fatalf("produce %s: %v", v, err)
					}
				}
			}
			for _, cl := range []*kgo.Client{awaited, other} {
				if err := cl.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
			}
			produce(plain, "a")
			produce(awaited, "y1", "y2")
			produce(other, "o1") // open for good: not awaited
			ranges, _, err := rd.Whole(ctx, "one")
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				got, aborted []string
				err          error
			}
			res := make(chan result, 1)
			go func() {
				got, aborted := []string{}, []string{}
				await := topicread.Await{Holds: func(r *kgo.Record) bool { return string(r.Value) == "y2" },
					Ended:   func(context.Context, *kgo.Record) (bool, error) { return false, nil },
					Aborted: func(r *kgo.Record) { aborted = append(aborted, string(r.Value)) }}
				err := rd.ReadAwaiting(ctx, ranges, await,
					func(r *kgo.Record) error {
						got = append(got, string(r.Value))
						return nil
					})
				res <- result{got, aborted, err}
			}()
			produce(plain, "late") // past the end: not read
			time.Sleep(200 * time.Millisecond)
			select {
			case r := <-res:
				t.Fatalf("the read ended (%v, %v) before the awaited transaction did", r.got, r.err)
			default:
			}
			if err := awaited.EndTransaction(ctx, tc.how); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-res:
				if r.err != nil || fmt.Sprint(r.got) != tc.want || fmt.Sprint(r.aborted) != tc.aborted {
					t.Fatalf("read %v (aborted %v), %v; want %s (aborted %s)", r.got, r.aborted, r.err, tc.want, tc.aborted)
				}
			case <-ctx.Done():
				t.Fatal("the read did not end after the awaited transaction's marker")
			}
		})
	}
}

// TestReadAwaitingHanging: an awaited transaction that stays unmarked while
// its coordinator says it ended (twice, a poll apart) ends the read with a
// *HangingError naming it and holding its awaited records; one the
// coordinator still runs is waited for.
func TestReadAwaitingHanging(t *testing.T) {
	ctx, c, rd := setup(t)
	txn := writer(t, c, kgo.TransactionalID("w"))
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"h1", "h2"} {
		if err := txn.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ranges, _, err := rd.Whole(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	await := topicread.Await{Holds: func(r *kgo.Record) bool { return string(r.Value) == "h2" },
		Ended: func(_ context.Context, r *kgo.Record) (bool, error) {
			if string(r.Value) != "h1" {
				return false, fmt.Errorf("asked about %q, want the transaction's first record", r.Value)
			}
			return asked.Add(1) > 2, nil // running for two checks, then ended
		}}
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = rd.ReadAwaiting(short, ranges, await, func(*kgo.Record) error { return nil })
	var hanging *topicread.HangingError
	if !errors.As(err, &hanging) || hanging.Offset != 0 || hanging.Topic != "one" || len(hanging.Held) != 1 || string(hanging.Held[0].Value) != "h2" {
		t.Fatalf("read: %v (asked %d); want a HangingError at one/0 offset 0 holding h2", err, asked.Load())
	}
	if n := asked.Load(); n != 4 {
		t.Fatalf("the coordinator was asked %d times, want 4 (twice running, twice ended)", n)
	}
}
