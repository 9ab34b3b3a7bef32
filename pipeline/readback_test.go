package pipeline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// TestReadBack: events already in their topics are held back until the
// first transaction none of whose events is there; an event is matched by
// topic, key, id and value; each topic is read once, from the first event's
// time less the margin.
func TestReadBack(t *testing.T) {
	commit := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	type ev struct{ topic, key, id, value string }
	inKafka := []ev{
		{"orders", "k1", "e1", "v1"}, {"orders", "k2", "e2", "v2"}, {"orders", "k1", "e3", "v3"},
		{"payments", "k9", "p1", "w1"},
	}
	type txn []ev
	for _, tc := range []struct {
		name string
		txns []txn
		want [][]bool // held, per event of each transaction
		read []string // topics read, in order
	}{
		{"old then new",
			[]txn{{{"orders", "k1", "e1", "v1"}, {"orders", "k2", "e2", "v2"}}, {{"orders", "k1", "e3", "v3"}}, {{"orders", "k1", "e4", "v4"}}, {{"orders", "k1", "e1", "v1"}}},
			[][]bool{{true, true}, {true}, {false}, {false}}, []string{"orders"}},
		{"a reused id with another value is new",
			[]txn{{{"orders", "k1", "e1", "v-new"}}, {{"orders", "k2", "e2", "v2"}}},
			[][]bool{{false}, {false}}, []string{"orders"}},
		{"a reused id under another key is new",
			[]txn{{{"orders", "k3", "e1", "v1"}}},
			[][]bool{{false}}, []string{"orders"}},
		{"in part: the rest is published, the read-back goes on",
			[]txn{{{"orders", "k1", "e1", "v1"}, {"orders", "k1", "e5", "v5"}}, {{"payments", "k9", "p1", "w1"}}, {{"payments", "k9", "p2", "w2"}}},
			[][]bool{{true, false}, {true}, {false}}, []string{"orders", "payments"}},
		{"a topic with nothing",
			[]txn{{{"audit", "a", "x1", "y"}}, {{"orders", "k1", "e1", "v1"}}},
			[][]bool{{false}, {false}}, []string{"audit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var read []string
			rb := newReadBack(func(_ context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
				if want := commit.Add(-readBackMargin); !since.Equal(want) {
					t.Errorf("read from %v, want %v", since, want)
				}
				read = append(read, topics...)
				for _, e := range inKafka {
					if e.topic == topics[0] {
						if err := fn(sink.ReadRecord{Topic: e.topic, Key: []byte(e.key), ID: []byte(e.id), HasID: true, Value: []byte(e.value)}); err != nil {
							return sink.ReadStats{}, err
						}
					}
				}
				return sink.ReadStats{}, nil
			}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			for i, tx := range tc.txns {
				for j, e := range tx {
					rec := &router.Record{Topic: e.topic, Key: []byte(e.key), Value: []byte(e.value),
						Headers: []router.Header{{Key: wire.HeaderEventType, Value: []byte("E")}, {Key: wire.HeaderID, Value: []byte(e.id)}}}
					held, err := rb.inKafka(context.Background(), rec, commit.Add(time.Duration(i)*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					if held != tc.want[i][j] {
						t.Errorf("transaction %d event %d (%s): held %v, want %v", i, j, e.id, held, tc.want[i][j])
					}
				}
				rb.commit()
			}
			if len(read) != len(tc.read) {
				t.Fatalf("topics read %v, want %v", read, tc.read)
			}
			for i := range read {
				if read[i] != tc.read[i] {
					t.Fatalf("topics read %v, want %v", read, tc.read)
				}
			}
		})
	}
}

// TestReadBackAbortAndErrors: a transaction cut short leaves no count
// behind; a failed read is the run's error; none at all holds nothing.
func TestReadBackAbortAndErrors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	at := time.Now()
	rec := &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v"), Headers: []router.Header{{Key: wire.HeaderID, Value: []byte("e1")}}}
	rb := newReadBack(func(_ context.Context, _ []string, _ time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadStats{}, fn(sink.ReadRecord{Topic: "orders", Key: []byte("k"), ID: []byte("e1"), HasID: true, Value: []byte("v")})
	}, log)
	other := &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v2"), Headers: []router.Header{{Key: wire.HeaderID, Value: []byte("e2")}}}
	if held, err := rb.inKafka(context.Background(), other, at); err != nil || held {
		t.Fatalf("e2: held %v, %v", held, err)
	}
	rb.abort() // the transaction comes again, whole
	if held, err := rb.inKafka(context.Background(), rec, at); err != nil || !held {
		t.Fatalf("e1 after the abort: held %v, %v", held, err)
	}
	rb.commit()
	if rb.done {
		t.Fatal("the read-back ended on a transaction found in Kafka")
	}

	boom := errors.New("broker gone")
	failing := newReadBack(func(context.Context, []string, time.Time, func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadStats{}, boom
	}, log)
	if _, err := failing.inKafka(context.Background(), rec, at); !errors.Is(err, boom) {
		t.Fatalf("failed read: %v", err)
	}
	var none *readBack
	if held, err := none.inKafka(context.Background(), rec, at); held || err != nil {
		t.Fatalf("no read-back: held %v, %v", held, err)
	}
	none.commit()
	none.abort()
}
