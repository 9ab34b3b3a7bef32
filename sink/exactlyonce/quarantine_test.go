package exactlyonce_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/exactlyonce"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

const (
	parking = "outbox.parking"
	qstate  = "outbox.quarantine"
	qsource = "sys/db/slot"
)

// quarantined configures a transactional sink for dlq.mode quarantine.
func quarantined(cfg *exactlyonce.Config) {
	cfg.Sink.ParkingTopic, cfg.Sink.QuarantineTopic, cfg.Sink.QuarantineSource = parking, qstate, qsource
}

// newQuarantineTxn starts a transactional sink in dlq.mode quarantine and
// restores its quarantines.
func newQuarantineTxn(ctx context.Context, t *testing.T, c *kfake.Cluster, tune ...func(*exactlyonce.Config)) (*exactlyonce.Txn, func()) {
	t.Helper()
	tx, _, closeTx := newTxn(ctx, t, c, qsource, 10*time.Millisecond, append([]func(*exactlyonce.Config){quarantined}, tune...)...)
	if err := tx.StartQuarantines(ctx); err != nil {
		t.Fatalf("StartQuarantines: %v", err)
	}
	return tx, closeTx
}

// produceKeyed hands one PostgreSQL transaction over: key=value pairs.
func produceKeyed(ctx context.Context, t *testing.T, tx *exactlyonce.Txn, done sink.Done, end lsn.LSN, tp string, kv ...string) {
	t.Helper()
	for i := 0; i < len(kv); i += 2 {
		rec := &router.Record{Topic: tp, Key: []byte(kv[i]), Value: []byte(kv[i+1]), Timestamp: time.Now(),
			Headers: []router.Header{{Key: "id", Value: []byte(kv[i+1])}}}
		if err := tx.Produce(ctx, rec, done); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	tx.EndTxn(end)
}

// refusePoison makes the broker refuse, for "one", every batch holding
// "poison" while on is set.
func refusePoison(t *testing.T, ctx context.Context, c *kfake.Cluster) *atomic.Bool {
	t.Helper()
	on := new(atomic.Bool)
	on.Store(true)
	names := sinktest.TopicNames(ctx, t, sinktest.Admin(t, c), "one")
	sinktest.Refuse(c, names, nil, func(tp string, b []byte) int16 {
		if on.Load() && tp == "one" && bytes.Contains(b, []byte("poison")) {
			return kerr.PolicyViolation.Code
		}
		return 0
	})
	return on
}

// outcomes waits for n outcomes and counts the parked and dead-lettered.
func outcomes(ctx context.Context, t *testing.T, done *sinktest.Outcomes, n int) (parked, dead int) {
	t.Helper()
	for range n {
		o := done.Wait(ctx, t)
		switch {
		case o.Err != nil:
			t.Fatalf("outcome %+v", o)
		case o.Parked:
			parked++
		case o.DeadLettered:
			dead++
		}
	}
	return parked, dead
}

// stateOf is the last committed state record of key ("" for a tombstone or
// none).
func stateOf(ctx context.Context, t *testing.T, c *kfake.Cluster, key string) string {
	t.Helper()
	state := ""
	for _, r := range readCommitted(ctx, t, c, qstate, true, false) {
		if string(r.Key) != qsource+"/"+key {
			continue
		}
		state = ""
		if r.Value != nil {
			var rec quarantine.StateRecord
			if err := json.Unmarshal(r.Value, &rec); err != nil {
				t.Fatalf("state record: %v", err)
			}
			state = rec.State
		}
	}
	return state
}

// TestTxnQuarantineInTheTransaction: the broker refuses one event of key
// p; the redone Kafka transaction holds its dead letter, p's later events
// parked (in that PostgreSQL transaction and the next) and p's state
// record, with the other keys' events: read_committed sees each once where
// it belongs, and a restart restores the quarantine.
func TestTxnQuarantineInTheTransaction(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one", parking))
	refusePoison(t, ctx, c)
	tx, closeTx := newQuarantineTxn(ctx, t, c)
	done := sinktest.NewOutcomes()
	produceKeyed(ctx, t, tx, done, 100, "one", "a", "a1", "p", "poison", "a", "a2", "p", "p2")
	produceKeyed(ctx, t, tx, done, 200, "one", "p", "p3", "a", "a3")
	if parked, dead := outcomes(ctx, t, done, 6); parked != 2 || dead != 1 {
		t.Fatalf("%d parked, %d dead-lettered; want 2 and 1", parked, dead)
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[a1 a2 a3]" {
		t.Fatalf("read_committed sees %s on the topic, want [a1 a2 a3]", got)
	}
	park := readCommitted(ctx, t, c, parking, true, false)
	if got := fmt.Sprint(values(park)); got != "[p2 p3]" {
		t.Fatalf("read_committed sees %s parked, want [p2 p3]", got)
	}
	if q, _ := sinktest.Header(park[0], quarantine.Header); q != "poison" {
		t.Fatalf("parked record's quarantine header %q, want the dead letter's id", q)
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, dlq, true, false))); got != "[poison]" {
		t.Fatalf("dead letters %s", got)
	}
	if s := stateOf(ctx, t, c, "p"); s != quarantine.StateQuarantined {
		t.Fatalf("p's committed state %q, want %q", s, quarantine.StateQuarantined)
	}
	// The aborted attempt (the refusal) left copies only isolation hides.
	if n := len(values(readCommitted(ctx, t, c, "one", false, false))); n <= 3 {
		t.Fatalf("read_uncommitted sees %d records on the topic; the refusal aborted nothing?", n)
	}

	closeTx()
	tx2, _ := newQuarantineTxn(ctx, t, c)
	produceKeyed(ctx, t, tx2, done, 300, "one", "p", "p4", "a", "a4")
	if parked, dead := outcomes(ctx, t, done, 2); parked != 1 || dead != 0 {
		t.Fatalf("after the restart %d parked, %d dead-lettered; want 1 and 0", parked, dead)
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, parking, true, false))); got != "[p2 p3 p4]" {
		t.Fatalf("after the restart read_committed sees %s parked, want [p2 p3 p4]", got)
	}
}

// TestTxnQuarantineUnconfirmedCommit: the commit of the transaction that
// begins the quarantine is not confirmed. Committed, the set takes the
// quarantine in when that is learned (the next event of p is parked);
// lost, the redone transaction begins it again. Either way each record is
// once where it belongs.
func TestTxnQuarantineUnconfirmedCommit(t *testing.T) {
	for _, lose := range []bool{false, true} {
		t.Run(fmt.Sprintf("lost=%v", lose), func(t *testing.T) {
			ctx := sinktest.Ctx(t)
			// Dead-lettered before it is sent (over the limit): the cut
			// EndTxn is the commit, not the abort a refusal makes.
			c := sinktest.NewCluster(t, kfake.SeedTopics(1, parking))
			sinktest.CreateTopic(ctx, t, sinktest.Admin(t, c), "one", map[string]string{"max.message.bytes": "1024"})
			poison := string(bytes.Repeat([]byte("x"), 4<<10))
			d := &cutEndTxn{lose: lose, refusal: time.Second}
			tx, _ := newQuarantineTxn(ctx, t, c, func(cfg *exactlyonce.Config) {
				cfg.Sink.TestOpts = append(cfg.Sink.TestOpts, kgo.Dialer(d.dial))
			})
			done := sinktest.NewOutcomes()
			produceKeyed(ctx, t, tx, done, 100, "one", "a", "a1")
			outcomes(ctx, t, done, 1)
			d.armed.Store(true)
			produceKeyed(ctx, t, tx, done, 200, "one", "p", poison, "a", "a2")
			outcomes(ctx, t, done, 2)
			if !d.cut.Load() {
				t.Fatal("no EndTxn was cut: the test tested nothing")
			}
			produceKeyed(ctx, t, tx, done, 300, "one", "p", "p2", "a", "a3")
			if parked, _ := outcomes(ctx, t, done, 2); parked != 1 {
				t.Fatalf("%d parked after the unconfirmed commit, want p2", parked)
			}
			if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[a1 a2 a3]" {
				t.Fatalf("read_committed sees %s on the topic, want [a1 a2 a3]", got)
			}
			if got := fmt.Sprint(values(readCommitted(ctx, t, c, parking, true, false))); got != "[p2]" {
				t.Fatalf("read_committed sees %s parked, want [p2]", got)
			}
			if got := values(readCommitted(ctx, t, c, dlq, true, false)); len(got) != 1 || got[0] != poison {
				t.Fatalf("%d dead letters, want the poison event once", len(got))
			}
		})
	}
}

// TestTxnRedriveInOneTransaction: once the broker takes the poison event,
// a redrive republishes it and the parked events, in order, with the
// tombstone, in one Kafka transaction; later events of the key go to their
// topic after them. A redrive the broker refuses leaves the quarantine,
// answered with a failure.
func TestTxnRedriveInOneTransaction(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(1, "one", parking))
	refusing := refusePoison(t, ctx, c)
	var ownedCfg exactlyonce.Config
	tx, _ := newQuarantineTxn(ctx, t, c, func(cfg *exactlyonce.Config) { ownedCfg = *cfg })
	done := sinktest.NewOutcomes()
	produceKeyed(ctx, t, tx, done, 100, "one", "p", "p1", "p", "poison", "p", "p2")
	produceKeyed(ctx, t, tx, done, 200, "one", "p", "p3")
	outcomes(ctx, t, done, 4)

	sc, err := sink.NewStateClient(ownedCfg.Sink)
	if err != nil {
		t.Fatalf("state client: %v", err)
	}
	defer sc.Close()
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err = sc.Redrive(rctx, "p", false)
	cancel()
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("POLICY_VIOLATION")) && !bytes.Contains([]byte(err.Error()), []byte("policy")) {
		t.Fatalf("redrive while the broker refuses the event: %v, want its refusal", err)
	}
	if s := stateOf(ctx, t, c, "p"); s != quarantine.StateFailed {
		t.Fatalf("p's state after the refused redrive %q, want %q", s, quarantine.StateFailed)
	}

	refusing.Store(false)
	rctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	err = sc.Redrive(rctx, "p", false)
	cancel()
	if err != nil {
		t.Fatalf("redrive: %v", err)
	}
	produceKeyed(ctx, t, tx, done, 300, "one", "p", "p4")
	if parked, _ := outcomes(ctx, t, done, 1); parked != 0 {
		t.Fatal("an event of the key after the redrive was parked")
	}
	if got := fmt.Sprint(values(readCommitted(ctx, t, c, "one", true, false))); got != "[p1 poison p2 p3 p4]" {
		t.Fatalf("read_committed sees %s, want [p1 poison p2 p3 p4]: each once, in order", got)
	}
	if s := stateOf(ctx, t, c, "p"); s != "" {
		t.Fatalf("p's state after the redrive %q, want a tombstone", s)
	}
}

// startTxn starts a transactional sink of cfg and restores its quarantines.
func startTxn(ctx context.Context, t *testing.T, cfg exactlyonce.Config) (*exactlyonce.Txn, func()) {
	t.Helper()
	tx, err := exactlyonce.New(cfg, testLog())
	if err != nil {
		t.Fatal(err)
	}
	closeTx := sync.OnceFunc(tx.Close)
	t.Cleanup(closeTx)
	if _, err := tx.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.StartQuarantines(ctx); err != nil {
		t.Fatal(err)
	}
	return tx, closeTx
}
