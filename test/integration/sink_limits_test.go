package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/internal/config"
)

// limitedTopic creates a topic with the given max.message.bytes on the shared
// broker and deletes it when the test ends.
func limitedTopic(t *testing.T, partitions int32, maxBytes int) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "limited-" + hex.EncodeToString(b)
	adm := newAdmin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := fmt.Sprint(maxBytes)
	if _, err := adm.CreateTopic(ctx, partitions, 1, map[string]*string{"max.message.bytes": &v}, name); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopics(ctx, name); err != nil {
			t.Logf("delete topic %s: %v", name, err)
		}
	})
	return name
}

// lowerLimit sets topic's max.message.bytes to maxBytes and waits until the
// (single) broker describes it.
func lowerLimit(t *testing.T, topic string, maxBytes int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := fmt.Sprint(maxBytes)
	adm := newAdmin(t)
	resp, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, topic)
	if err == nil {
		_, err = resp.On(topic, nil)
	}
	if err != nil {
		t.Fatalf("lower max.message.bytes: %v", err)
	}
	// The (single) broker describes the value it applies.
	waitFor(t, 20*time.Second, "the lowered limit", func() bool {
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			return false
		}
		rc, err := rcs.On(topic, nil)
		for _, c := range rc.Configs {
			if err == nil && c.Key == "max.message.bytes" {
				return c.MaybeValue() == v
			}
		}
		return false
	})
}

// seqOf returns the payload's seq field.
func seqOf(t *testing.T, r *kgo.Record) int {
	t.Helper()
	var v struct{ Seq int }
	if err := json.Unmarshal(r.Value, &v); err != nil {
		t.Fatalf("value %.80s: %v", r.Value, err)
	}
	return v.Seq
}

// TestOversizeRecordAloneGoesToDeadLetter: one record over its topic's
// max.message.bytes among 1,000 valid ones of the same aggregate, all in one
// transaction. Only that record is dead-lettered; the 1,000 others reach the
// topic, in commit order, exactly once each.
func TestOversizeRecordAloneGoesToDeadLetter(t *testing.T) {
	const (
		total    = 1001
		oversize = 500 // seq of the record over the limit
		// Below franz-go's default batch cap (1,000,012 bytes), as topics
		// often are: the oversize record is not refused by the client but
		// sent in a batch with its neighbours, which the broker refuses
		// whole. The 1,000 valid records together stay under the limit.
		maxBytes = 256 << 10
	)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	topic := limitedTopic(t, 3, maxBytes)
	cfg := testConfig(t, dsn, "public.outbox", "oversize")
	cfg.DLQ.Mode = config.DLQSkip // later events of the aggregate overtake its dead letter
	cfg.Kafka.Topics = map[string]string{"limited": topic}
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)

	pad := strings.Repeat("p", 50)
	var bigID string
	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= total; i++ {
			payload := fmt.Sprintf(`{"seq": %d, "pad": %q}`, i, pad)
			if i == oversize {
				payload = fmt.Sprintf(`{"seq": %d, "blob": %q}`, i, strings.Repeat("x", 2*maxBytes))
			}
			id := insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload)
			if i == oversize {
				bigID = id
			}
		}
	})

	recs := consumeN(t, []string{topic}, total-1, 2*time.Minute, 3*time.Second)
	if len(recs) != total-1 {
		t.Errorf("%s holds %d records, want %d", topic, len(recs), total-1)
	}
	parts := byPartition(recs)
	if len(parts) != 1 {
		t.Errorf("records of one aggregate in %d partitions", len(parts))
	}
	for _, rs := range parts {
		want := 1
		for _, r := range rs {
			if want == oversize {
				want++
			}
			if got := seqOf(t, r); got != want {
				t.Fatalf("record at offset %d has seq %d, want %d (order or completeness broken)", r.Offset, got, want)
			}
			want++
		}
	}

	dlq := consumeN(t, []string{dlqFor("oversize")}, 1, time.Minute, 3*time.Second)
	if len(dlq) != 1 {
		seqs := make([]int, 0, len(dlq))
		for _, r := range dlq {
			seqs = append(seqs, seqOf(t, r))
		}
		if len(seqs) > 20 {
			seqs = seqs[:20]
		}
		t.Fatalf("%d dead letters, want exactly 1 (first seqs %v)", len(dlq), seqs)
	}
	d := dlq[0]
	if id, _ := header(d, "id"); id != bigID {
		t.Errorf("dead letter id %q, want %q", id, bigID)
	}
	reason, _ := header(d, "error")
	for _, want := range []string{"max.message.bytes", fmt.Sprint(maxBytes), topic} {
		if !strings.Contains(reason, want) {
			t.Errorf("error header %q does not mention %q", reason, want)
		}
	}
	if v, _ := header(d, "topic"); v != topic {
		t.Errorf("topic header %q, want %q", v, topic)
	}
}

// consumeFrom reads topics on brokers from the beginning until want records
// arrived, then for quiet more; like consumeN, for a broker of the test's own.
func consumeFrom(t *testing.T, brokers, topics []string, want int, timeout, quiet time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for len(recs) < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	if len(recs) < want {
		t.Fatalf("consumed %d records from %v, want %d", len(recs), topics, want)
	}
	short, cancelShort := context.WithTimeout(context.Background(), quiet)
	defer cancelShort()
	cl.PollFetches(short).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	return recs
}

// TestUnknownTopicWaitsForItsTopic: with auto-creation off (broker and
// connector), events for a topic created a few seconds later wait for it and
// are delivered in order, none dead-lettered; events for a topic that never
// appears go to the dead-letter topic after kafka.unknown_topic_timeout,
// saying so. Neither holds up a topic that exists.
func TestUnknownTopicWaitsForItsTopic(t *testing.T) {
	if kafkaServer.External() {
		t.Skip("needs its own broker")
	}
	const (
		late    = 20
		timeout = 8 * time.Second
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, adm := lockedBroker(ctx, t)
	if _, err := adm.CreateTopics(ctx, 1, 1, nil, topicFor("present"), dlqFor("waits")); err != nil {
		t.Fatal(err)
	}
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "waits")
	cfg.Kafka.Brokers = k.Brokers()
	cfg.Kafka.AutoCreateTopics = false
	cfg.Kafka.UnknownTopicTimeout = timeout
	c := startConnector(t, cfg)
	conn := pgConnect(t, dsn)

	start := time.Now()
	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= late/2; i++ {
			insert(t, tx, "outbox", "late", "agg-late", "E", fmt.Sprintf(`{"seq": %d}`, i))
		}
		insert(t, tx, "outbox", "never", "agg-never", "E", `{"seq": 1}`)
		insert(t, tx, "outbox", "present", "agg-present", "E", `{"seq": 1}`)
	})
	// The existing topic is not held up by the missing ones.
	if got := consumeFrom(t, k.Brokers(), []string{topicFor("present")}, 1, timeout/2, 0); len(got) != 1 {
		t.Fatalf("%d records on the existing topic", len(got))
	}
	// The topic is created only once the connector has found it missing
	// (sink/topics.go logs that when a lookup first finds no topic).
	waitFor(t, timeout/2, "the connector to find topic late missing", func() bool {
		return c.logged("kafka: topic does not exist; its records wait for it", "topic="+topicFor("late")+" ")
	})
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, topicFor("late")); err != nil {
		t.Fatalf("create topic: %v", err)
	}
	committed(t, conn, func(tx pgx.Tx) {
		for i := late/2 + 1; i <= late; i++ {
			insert(t, tx, "outbox", "late", "agg-late", "E", fmt.Sprintf(`{"seq": %d}`, i))
		}
	})

	recs := consumeFrom(t, k.Brokers(), []string{topicFor("late")}, late, time.Minute, 2*time.Second)
	if len(recs) != late {
		t.Errorf("%d records on the late topic, want %d", len(recs), late)
	}
	for i, r := range recs {
		if got := seqOf(t, r); got != i+1 {
			t.Fatalf("record %d of the late topic has seq %d: order broken", i, got)
		}
	}
	dlq := consumeFrom(t, k.Brokers(), []string{dlqFor("waits")}, 1, timeout+time.Minute, 2*time.Second)
	if len(dlq) != 1 {
		t.Fatalf("%d dead letters, want only the event of the topic that never appeared", len(dlq))
	}
	if waited := time.Since(start); waited < timeout {
		t.Errorf("dead-lettered after %v, before kafka.unknown_topic_timeout %v", waited, timeout)
	}
	reason, _ := header(dlq[0], "error")
	if want := fmt.Sprintf("topic %s did not exist for %v", topicFor("never"), timeout); !strings.Contains(reason, want) {
		t.Errorf("error header %q, want it to say %q", reason, want)
	}
	if v, _ := header(dlq[0], "topic"); v != topicFor("never") {
		t.Errorf("topic header %q", v)
	}
}

// TestMissingTopicCreatedWithStatedSettings: with kafka.auto_create_topics
// on (the default) and a broker that allows auto-creation, the connector
// creates a missing topic itself with kafka.topic_partitions and
// kafka.topic_replication_factor.
func TestMissingTopicCreatedWithStatedSettings(t *testing.T) {
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	cfg := testConfig(t, dsn, "public.outbox", "creates")
	cfg.Kafka.TopicPartitions = 5
	cfg.Kafka.TopicReplicationFactor = 1
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "created", "k", "E", `{"seq": 1}`) })
	if recs := consumeN(t, []string{topicFor("created")}, 1, time.Minute, time.Second); len(recs) != 1 {
		t.Fatalf("%d records", len(recs))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	td, err := newAdmin(t).ListTopics(ctx, topicFor("created"))
	if err != nil {
		t.Fatal(err)
	}
	d := td[topicFor("created")]
	if len(d.Partitions) != 5 || d.Partitions.NumReplicas() != 1 {
		t.Fatalf("topic has %d partitions, %d replicas; want 5 and 1", len(d.Partitions), d.Partitions.NumReplicas())
	}
}

// TestLoweredLimitRefusalKeepsOrder: a topic's max.message.bytes is lowered
// after the connector learned it, so the connector's size check and batch
// cap are stale and the broker refuses a batch holding an oversize record
// and its neighbours. Only that record is dead-lettered; the neighbours are
// produced again, in order, exactly once.
func TestLoweredLimitRefusalKeepsOrder(t *testing.T) {
	const (
		total    = 301
		oversize = 150
		lowered  = 64 << 10
	)
	dsn := newDatabase(t)
	createOutbox(t, dsn, "outbox", "jsonb")
	topic := limitedTopic(t, 1, 1<<20)
	cfg := testConfig(t, dsn, "public.outbox", "lowered")
	cfg.DLQ.Mode = config.DLQSkip // later events of the aggregate overtake its dead letter
	cfg.Kafka.Topics = map[string]string{"limited": topic}
	startConnector(t, cfg)
	conn := pgConnect(t, dsn)
	// The connector learns the topic and its 1 MiB limit.
	committed(t, conn, func(tx pgx.Tx) { insert(t, tx, "outbox", "limited", "agg-1", "Sized", `{"seq": 0}`) })
	consumeN(t, []string{topic}, 1, time.Minute, 0)

	lowerLimit(t, topic, lowered)

	committed(t, conn, func(tx pgx.Tx) {
		for i := 1; i <= total; i++ {
			payload := fmt.Sprintf(`{"seq": %d, "pad": %q}`, i, strings.Repeat("p", 50))
			if i == oversize {
				payload = fmt.Sprintf(`{"seq": %d, "blob": %q}`, i, strings.Repeat("x", 2*lowered))
			}
			insert(t, tx, "outbox", "limited", "agg-1", "Sized", payload)
		}
	})
	recs := consumeN(t, []string{topic}, total, 2*time.Minute, 3*time.Second)
	if len(recs) != total {
		t.Errorf("%s holds %d records, want %d", topic, len(recs), total)
	}
	want := 0
	for _, r := range recs {
		if want == oversize {
			want++
		}
		if got := seqOf(t, r); got != want {
			t.Fatalf("record at offset %d has seq %d, want %d (order or completeness broken)", r.Offset, got, want)
		}
		want++
	}
	dlq := consumeN(t, []string{dlqFor("lowered")}, 1, time.Minute, 3*time.Second)
	if len(dlq) != 1 || seqOf(t, dlq[0]) != oversize {
		t.Fatalf("%d dead letters, want exactly the oversize record", len(dlq))
	}
	if reason, _ := header(dlq[0], "error"); !strings.Contains(reason, "MESSAGE_TOO_LARGE") {
		t.Errorf("error header %q", reason)
	}
}
