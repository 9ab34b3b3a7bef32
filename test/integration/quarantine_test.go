package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// seqsByKey groups the records' seq by key, in the order read.
func seqsByKey(t *testing.T, recs []*kgo.Record) map[string][]int {
	t.Helper()
	m := map[string][]int{}
	for _, r := range recs {
		m[string(r.Key)] = append(m[string(r.Key)], seqOf(t, r))
	}
	return m
}

// TestQuarantineParksLaterEvents: the broker refuses the first of 20 events
// of aggregate agg-1 (its topic's limit was lowered after the connector read
// it), in one transaction with the other 19 and with 20 events of agg-2 in
// the same partition. agg-1 is quarantined: its refused event is
// dead-lettered, the 19 later ones are parked in order with the quarantine
// header, and none reaches the event topic; agg-2 reaches it complete and
// in order.
func TestQuarantineParksLaterEvents(t *testing.T) {
	const (
		events  = 20
		lowered = 64 << 10
	)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	topic := limitedTopic(t, 1, 1<<20)
	cfg := testConfig(t, dsn, "public.outbox", "quarantine")
	cfg.Kafka.Topics = map[string]string{"limited": topic}
	cfg.DLQ.Mode = config.DLQQuarantine
	cfg.Kafka.ParkingTopic = "parking.quarantine." + runID
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	// The connector learns the topic and its 1 MiB limit.
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "limited", "agg-0", "Sized", `{"seq": 0}`) })
	consumeN(t, []string{topic}, 1, time.Minute, 0)

	lowerLimit(t, topic, lowered)

	var refusedID string
	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= events; i++ {
			payload := fmt.Sprintf(`{"seq": %d, "pad": %q}`, i, strings.Repeat("p", 50))
			if i == 1 {
				payload = fmt.Sprintf(`{"seq": %d, "blob": %q}`, i, strings.Repeat("x", 2*lowered))
			}
			id := insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload)
			if i == 1 {
				refusedID = id
			}
			insert(t, tx, "outbox", "limited", "agg-2", "Sized", fmt.Sprintf(`{"seq": %d}`, 100+i))
		}
	})
	parked := consumeN(t, []string{cfg.Kafka.ParkingTopic}, events-1, 2*time.Minute, 3*time.Second)
	var wantParked, wantOther []int
	for i := 2; i <= events; i++ {
		wantParked = append(wantParked, i)
	}
	for i := 1; i <= events; i++ {
		wantOther = append(wantOther, 100+i)
	}
	if got := seqsByKey(t, parked); len(got) != 1 || !slices.Equal(got["agg-1"], wantParked) {
		t.Fatalf("parking topic holds %v, want agg-1 %v", got, wantParked)
	}
	for _, r := range parked {
		q, _ := header(r, sink.HeaderQuarantine)
		tp, _ := header(r, "topic")
		if q != refusedID || tp != topic {
			t.Fatalf("parked seq %d: quarantine %q, topic %q; want %s and %s", seqOf(t, r), q, tp, refusedID, topic)
		}
	}
	got := seqsByKey(t, consumeN(t, []string{topic}, 1+events, time.Minute, 3*time.Second))
	if len(got["agg-1"]) != 0 || !slices.Equal(got["agg-2"], wantOther) || !slices.Equal(got["agg-0"], []int{0}) {
		t.Fatalf("event topic holds %v, want agg-0 [0], agg-2 %v and no agg-1", got, wantOther)
	}
	dlq := consumeN(t, []string{dlqFor("quarantine")}, 1, time.Minute, 3*time.Second)
	if len(dlq) != 1 || seqOf(t, dlq[0]) != 1 || string(dlq[0].Key) != "agg-1" {
		t.Fatalf("%d dead letters, want exactly agg-1's seq 1", len(dlq))
	}
	// The metrics follow the acknowledgements, which a consumer may see first.
	waitFor(t, 10*time.Second, "19 parked events and 1 quarantined aggregate in the metrics", func() bool {
		return testutil.ToFloat64(c.m.Parked) == events-1 && testutil.ToFloat64(c.m.Quarantined) == 1
	})
}
