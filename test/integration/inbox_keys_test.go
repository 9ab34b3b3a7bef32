package integration

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/inbox"
)

// ibCloudEvent is a binary-mode CloudEvent from source with id.
func ibCloudEvent(topic, source, id string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(`{}`), Headers: []kgo.RecordHeader{
		{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte(id)},
		{Key: "ce_source", Value: []byte(source)}, {Key: "ce_type", Value: []byte("OrderPlaced")},
		{Key: "content-type", Value: []byte("application/json")}}}
}

// TestInboxCloudEventsSourceAndID: CloudEvents are deduplicated on (source,
// id), the pair the specification makes unique: two producers' events with
// one id are both handled, a copy of either is skipped, and an event an
// earlier inbox recorded under its id alone is still recognised.
func TestInboxCloudEventsSourceAndID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, conn := ibSetup(ctx, t)
	topic := newTopic(t, 1)
	if _, err := conn.Exec(ctx, `INSERT INTO inbox (event_id, consumer_name, topic, kafka_partition, kafka_offset)
		VALUES ('old-1', 'inventory', $1, 0, 0)`, topic); err != nil {
		t.Fatal(err)
	}
	ibProduce(ctx, t, ibCloudEvent(topic, "/billing", "1"), ibCloudEvent(topic, "/shipping", "1"),
		ibCloudEvent(topic, "/billing", "1"), ibCloudEvent(topic, "/billing", "old-1"), ibCloudEvent(topic, "/billing", "2"))
	calls := newIBCalls()
	ic := ibStart(t, dsn, topic, "inbox-"+topic, calls.handler(nil))
	ibWait(t, ctx, "the last event", func() bool { return calls.okCount([]string{"/billing 2"}) == 1 })
	ic.stop(t)
	ok, _ := calls.snapshot()
	want := []string{"/billing 1", "/shipping 1", "/billing 2"}
	if len(ok) != len(want) || calls.okCount(want) != len(want) {
		t.Errorf("handled %v, want %v: one event per (source, id), the one recorded before skipped", ok, want)
	}
	if d := ic.metric(t, inbox.MetricDuplicates); d != 2 {
		t.Errorf("duplicates = %v, want 2 (the copy, and the event recorded under its id alone)", d)
	}
}
