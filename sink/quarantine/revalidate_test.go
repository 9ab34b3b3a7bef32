package quarantine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
	"github.com/outbox-cdc/outbox-cdc/sink/internal/sinktest"
	"github.com/outbox-cdc/outbox-cdc/sink/quarantine"
)

// fakeContracts is a Revalidator: refuse makes it refuse values holding
// that text; it frames what it accepts as "v2:" + value and records what
// it was asked.
type fakeContracts struct {
	mu     sync.Mutex
	refuse string
	asked  []string
}

func (f *fakeContracts) Revalidate(_ context.Context, topic, eventType string, value []byte, published bool) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, fmt.Sprintf("%s %s %s %v", topic, eventType, value, published))
	if f.refuse != "" && strings.Contains(string(value), f.refuse) {
		return nil, errors.New("still violates its contract")
	}
	return append([]byte("v2:"), value...), nil
}

func (f *fakeContracts) set(refuse string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse, f.asked = refuse, nil
}

func (f *fakeContracts) questions() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.asked, "; ")
}

// contractDead is record i of key as the pipeline dead-letters a contract
// violation: error, topic, contract_subject, contract_version first.
func contractDead(key string, i int) *router.Record {
	r := keyedRecord(dlq, key, i, "-bad")
	r.Headers = append([]router.Header{{Key: wire.HeaderError, Value: []byte("contracts: at /qty")},
		{Key: wire.HeaderTopic, Value: []byte(topic)}, {Key: wire.HeaderContractSubject, Value: []byte(topic + "-T")},
		{Key: wire.HeaderContractVersion, Value: []byte("1")}}, r.Headers...)
	r.Headers = append(r.Headers, router.Header{Key: wire.HeaderEventType, Value: []byte("T")},
		router.Header{Key: wire.HeaderAggregateID, Value: []byte(key)})
	return r
}

// TestRedriveRevalidates: a contract dead letter quarantines its key under
// its topic; a redrive while its payload (or a parked record) still fails
// the contract is refused with the reason and republishes nothing; once it
// fits, the dead letter's payload and the parked records go to the topic
// in order, in the form the contract gives, without the dead letter's
// headers, and the quarantine is lifted.
func TestRedriveRevalidates(t *testing.T) {
	ctx := sinktest.Ctx(t)
	c := sinktest.NewCluster(t, kfake.SeedTopics(3, parking))
	fc := &fakeContracts{}
	s := startSaved(ctx, t, c, func(cfg *sink.Config) { cfg.Contracts = fc })
	res := sinktest.NewResults(2)
	sinktest.Produce(ctx, t, s, contractDead("k", 0), res.Slot(0))
	sinktest.Produce(ctx, t, s, keyedRecord(topic, "k", 1, "-parked"), res.Slot(1))
	if out := res.All(ctx, t, 2); !out[0].DeadLettered || !out[1].Parked {
		t.Fatalf("outcomes %+v: want dead-lettered, parked", out)
	}
	sc := stateClient(t, c)
	if q := listed(ctx, t, sc, "k"); q.Topic != topic {
		t.Fatalf("quarantine %+v, want the dead letter's topic %s", q, topic)
	}
	for _, refuse := range []string{"-bad", "-parked"} {
		fc.set(refuse)
		err := sc.Redrive(ctx, "k", false)
		if err == nil || !strings.Contains(err.Error(), "still violates") || !strings.Contains(err.Error(), "ev-") {
			t.Fatalf("redrive refusing %s: %v, want a failure with the reason and the event", refuse, err)
		}
		if q := s.Quarantined(); len(q) != 1 {
			t.Fatalf("after the refusal: quarantined %+v, want k", q)
		}
	}
	fc.set("")
	if err := sc.Redrive(ctx, "k", false); err != nil {
		t.Fatalf("redrive: %v", err)
	}
	want := topic + " T 0000-bad false; " + topic + "  0001-parked true"
	if got := fc.questions(); got != want {
		t.Fatalf("asked %q, want %q", got, want)
	}
	recs := sinktest.Consume(ctx, t, c, topic, 2)
	if got := byKey(recs)["k"]; fmt.Sprint(got) != "[v2:0000-bad v2:0001-parked]" {
		t.Fatalf("topic holds k %v, want both revalidated, in order", got)
	}
	for _, h := range recs[0].Headers {
		switch h.Key {
		case wire.HeaderError, wire.HeaderTopic, wire.HeaderContractSubject, wire.HeaderContractVersion, quarantine.Header:
			t.Fatalf("republished dead letter keeps header %s: %v", h.Key, recs[0].Headers)
		}
	}
	if q := s.Quarantined(); len(q) != 0 {
		t.Fatalf("quarantined %+v after the redrive, want none", q)
	}
}
