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
	"github.com/twmb/franz-go/pkg/kgo"
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
