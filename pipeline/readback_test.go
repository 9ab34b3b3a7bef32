package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/outbox/wire"
	"github.com/outbox-cdc/outbox-cdc/router"
	"github.com/outbox-cdc/outbox-cdc/sink"
)

// TestReadBack: events already in their topics are held back until the
// first event that is not there; an event is matched by topic, key, id and
// value; each topic is read once, from the first event's time less the
// margin, and none after the read-back ended.
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
		{"in part: the read-back ends at the first event not found",
			[]txn{{{"orders", "k1", "e1", "v1"}, {"orders", "k1", "e5", "v5"}}, {{"payments", "k9", "p1", "w1"}}, {{"payments", "k9", "p2", "w2"}}},
			[][]bool{{true, false}, {false}, {false}}, []string{"orders"}},
		{"a topic with nothing",
			[]txn{{{"audit", "a", "x1", "y"}}, {{"orders", "k1", "e1", "v1"}}},
			[][]bool{{false}, {false}}, []string{"audit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var read []string
			rb := newReadBack(context.Background(), func(_ context.Context, topics []string, since time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
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
			}, time.Time{}, discard)
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

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestReadBackAbortAndErrors: a transaction cut short leaves nothing
// behind, its cut included: it is decided again; a failed read is the run's
// error; none at all holds nothing.
func TestReadBackAbortAndErrors(t *testing.T) {
	at := time.Now()
	rec := &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v"), Headers: []router.Header{{Key: wire.HeaderID, Value: []byte("e1")}}}
	rb := newReadBack(context.Background(), fakeKafka([]kafkaEv{{"orders", "k", "e1", "v", false}}), time.Time{}, discard)
	other := &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v2"), Headers: []router.Header{{Key: wire.HeaderID, Value: []byte("e2")}}}
	for range 2 { // found, then not found: cut short, then again whole
		if held, err := rb.inKafka(context.Background(), rec, at); err != nil || !held {
			t.Fatalf("e1: held %v, %v", held, err)
		}
		if held, err := rb.inKafka(context.Background(), other, at); err != nil || held {
			t.Fatalf("e2: held %v, %v", held, err)
		}
		if held, _ := rb.inKafka(context.Background(), rec, at); held {
			t.Fatal("e1 again after the cut: held")
		}
		if rb.done {
			t.Fatal("the read-back ended before the commit")
		}
		rb.abort()
	}
	rb.commit() // an empty transaction
	if held, err := rb.inKafka(context.Background(), rec, at); err != nil || !held {
		t.Fatalf("e1 after the abort: held %v, %v", held, err)
	}
	rb.commit()
	if rb.done || rb.txns != 1 || rb.skipped != 1 {
		t.Fatalf("after a transaction found whole: done %v, %d transactions, %d skipped", rb.done, rb.txns, rb.skipped)
	}

	boom := errors.New("broker gone")
	failing := newReadBack(context.Background(), func(context.Context, []string, time.Time, func(sink.ReadRecord) error) (sink.ReadStats, error) {
		return sink.ReadStats{}, boom
	}, time.Time{}, discard)
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

// TestReadBackStart: the read starts at the first event's commit, or its
// record's timestamp when older, never before the floor, less the margin.
func TestReadBackStart(t *testing.T) {
	commit := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name         string
		stamp, floor time.Time
		want         time.Time
	}{
		{"the commit", time.Time{}, time.Time{}, commit},
		{"an older timestamp", commit.Add(-time.Minute), time.Time{}, commit.Add(-time.Minute)},
		{"a newer timestamp", commit.Add(time.Minute), time.Time{}, commit},
		{"a timestamp years old, under the floor", commit.AddDate(-3, 0, 0), commit.Add(-time.Minute), commit.Add(-time.Minute)},
		{"a floor under the commit", time.Time{}, commit.Add(-time.Hour), commit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var since time.Time
			rb := newReadBack(context.Background(), func(_ context.Context, _ []string, s time.Time, _ func(sink.ReadRecord) error) (sink.ReadStats, error) {
				since = s
				return sink.ReadStats{}, nil
			}, tc.floor, discard)
			if _, err := rb.inKafka(context.Background(), &router.Record{Topic: "orders", Timestamp: tc.stamp}, commit); err != nil {
				t.Fatal(err)
			}
			if want := tc.want.Add(-readBackMargin); !since.Equal(want) {
				t.Fatalf("read from %v, want %v", since, want)
			}
		})
	}
}

// kafkaEv is a record of the read-back tests: in a topic before the run
// (unless gone: compacted, expired, parked, or stamped before the window),
// or an event the slot sends again.
type kafkaEv struct {
	topic, key, id, value string
	gone                  bool
}

// runReadBack runs stream through a read-back over log and returns each event's
// decision and the log after the run: what it held plus what it published.
func runReadBack(t *testing.T, rb *readBack, stream [][]kafkaEv, at time.Time) ([][]bool, []kafkaEv) {
	t.Helper()
	var out []kafkaEv
	var held [][]bool
	for i, tx := range stream {
		held = append(held, nil)
		for _, e := range tx {
			h, err := rb.inKafka(context.Background(), recordOf(e), at.Add(time.Duration(i)*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			held[i] = append(held[i], h)
			if !h {
				out = append(out, e)
			}
		}
		rb.commit()
	}
	return held, out
}

func recordOf(e kafkaEv) *router.Record {
	return &router.Record{Topic: e.topic, Key: []byte(e.key), Value: []byte(e.value), Headers: []router.Header{{Key: wire.HeaderID, Value: []byte(e.id)}}}
}

// fakeKafka is a readRange over log's records that are not gone.
func fakeKafka(log []kafkaEv) readRange {
	return func(ctx context.Context, topics []string, _ time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		for _, e := range log {
			if e.gone || e.topic != topics[0] {
				continue
			}
			if err := fn(sink.ReadRecord{Topic: e.topic, Key: []byte(e.key), ID: []byte(e.id), HasID: true, Value: []byte(e.value)}); err != nil {
				return sink.ReadStats{}, err
			}
		}
		return sink.ReadStats{}, ctx.Err()
	}
}

// keyOrderError says what breaks the read-back's invariant, if anything:
// every event of stream is in the log after the run (none lost), and each
// key's last record there is the key's newest event (none reordered).
func keyOrderError(before, published []kafkaEv, stream [][]kafkaEv) string {
	type tk struct{ topic, key string }
	last, in := map[tk]kafkaEv{}, map[kafkaEv]bool{}
	for _, e := range append(append([]kafkaEv(nil), before...), published...) {
		if !e.gone {
			last[tk{e.topic, e.key}], in[e] = e, true
		}
	}
	newest := map[tk]kafkaEv{}
	for _, tx := range stream {
		for _, e := range tx {
			if !in[kafkaEv{topic: e.topic, key: e.key, id: e.id, value: e.value}] {
				return fmt.Sprintf("event %s lost", e.id)
			}
			newest[tk{e.topic, e.key}] = e
		}
	}
	for k, e := range newest {
		if l := last[k]; l.id != e.id {
			return fmt.Sprintf("key %s/%s ends with %s (%s), its newest event is %s (%s)", k.topic, k.key, l.id, l.value, e.id, e.value)
		}
	}
	return ""
}

// TestReadBackKeyOrder: a transaction found only in part ends the
// read-back at its first event not found: that event and everything after
// it are published again (duplicates, in order), so no key's older value
// lands after a newer one and nothing is lost.
func TestReadBackKeyOrder(t *testing.T) {
	commit := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		kafka  []kafkaEv
		stream [][]kafkaEv
		want   [][]bool
	}{
		{name: "an older value compacted away: it and the newer one are published again",
			kafka: []kafkaEv{{"payments", "k9", "p1", "w1", false}, {"orders", "k1", "e1", "v1", true}, {"orders", "k1", "e2", "v2", false}},
			stream: [][]kafkaEv{{{"payments", "k9", "p1", "w1", false}, {"orders", "k1", "e1", "v1", false}},
				{{"orders", "k1", "e2", "v2", false}}},
			want: [][]bool{{true, false}, {false}}},
		{name: "found early in a transaction, missing later: the found one stays held, the rest goes again",
			kafka: []kafkaEv{{"orders", "k1", "e1", "v1", false}, {"orders", "k1", "e5", "v5", true}, {"orders", "k1", "e3", "v3", false}},
			stream: [][]kafkaEv{{{"orders", "k1", "e1", "v1", false}, {"orders", "k1", "e5", "v5", false}},
				{{"orders", "k1", "e3", "v3", false}}},
			want: [][]bool{{true, false}, {false}}},
		{name: "missing first, found after: both published",
			kafka: []kafkaEv{{"orders", "k1", "e1", "v1", true}, {"orders", "k2", "e2", "v2", false}, {"orders", "k2", "e3", "v3", false}},
			stream: [][]kafkaEv{{{"orders", "k1", "e1", "v1", false}, {"orders", "k2", "e2", "v2", false}},
				{{"orders", "k2", "e3", "v3", false}}},
			want: [][]bool{{false, false}, {false}}},
		{name: "stamped before the window, in another topic: the read-back ends there",
			kafka:  []kafkaEv{{"orders", "k1", "e1", "v1", false}, {"audit", "a", "x1", "y1", true}, {"orders", "k1", "e2", "v2", false}},
			stream: [][]kafkaEv{{{"orders", "k1", "e1", "v1", false}}, {{"audit", "a", "x1", "y1", false}, {"orders", "k1", "e2", "v2", false}}},
			want:   [][]bool{{true}, {false, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rb := newReadBack(context.Background(), fakeKafka(tc.kafka), time.Time{}, discard)
			held, published := runReadBack(t, rb, tc.stream, commit)
			if why := keyOrderError(tc.kafka, published, tc.stream); why != "" {
				t.Errorf("%s (held %v)", why, held)
			}
			if fmt.Sprint(held) != fmt.Sprint(tc.want) {
				t.Errorf("held %v, want %v", held, tc.want)
			}
		})
	}
}

// TestReadBackKeyOrderRandom: over histories whose records were removed at
// random (parked, expired, stamped before the window) or compacted, no key
// ends with an older value and nothing is lost.
func TestReadBackKeyOrderRandom(t *testing.T) {
	commit := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	rnd := rand.New(rand.NewPCG(7, 11))
	for run := range 3000 {
		var stream [][]kafkaEv
		for i := range 2 + rnd.IntN(10) {
			var tx []kafkaEv
			for j := range 1 + rnd.IntN(3) {
				id := fmt.Sprintf("e%d.%d", i, j)
				tx = append(tx, kafkaEv{topic: []string{"orders", "payments"}[rnd.IntN(2)], key: fmt.Sprint("k", rnd.IntN(3)), id: id, value: "v" + id})
			}
			stream = append(stream, tx)
		}
		var kafka []kafkaEv // the old history: the stream's first transactions
		for _, tx := range stream[:rnd.IntN(len(stream)+1)] {
			kafka = append(kafka, tx...)
		}
		for i := range kafka {
			superseded := slices.ContainsFunc(kafka[i+1:], func(e kafkaEv) bool { return e.topic == kafka[i].topic && e.key == kafka[i].key })
			kafka[i].gone = rnd.IntN(8) == 0 || superseded && rnd.IntN(2) == 0
		}
		rb := newReadBack(context.Background(), fakeKafka(kafka), time.Time{}, discard)
		held, published := runReadBack(t, rb, stream, commit)
		if why := keyOrderError(kafka, published, stream); why != "" {
			t.Fatalf("run %d: %s\nkafka %v\nstream %v\nheld %v", run, why, kafka, stream, held)
		}
	}
}

// TestReadBackBounded: a read past maxHeld records ends the read-back
// there, for good: what follows is published, an abort included.
func TestReadBackBounded(t *testing.T) {
	kafka := []kafkaEv{{"orders", "k1", "e1", "v1", false}, {"payments", "k9", "p1", "w1", false}, {"payments", "k9", "p2", "w2", false}}
	stream := [][]kafkaEv{{{"orders", "k1", "e1", "v1", false}, {"payments", "k9", "p1", "w1", false}}, {{"payments", "k9", "p2", "w2", false}}}
	rb := newReadBack(context.Background(), fakeKafka(kafka), time.Time{}, discard)
	rb.maxHeld = 2
	if held, err := rb.inKafka(context.Background(), recordOf(stream[0][0]), time.Now()); err != nil || !held {
		t.Fatalf("e1: held %v, %v", held, err)
	}
	rb.abort() // cut short before the read that passes the bound: it comes again
	held, published := runReadBack(t, rb, stream, time.Now())
	if fmt.Sprint(held) != "[[true false] [false]]" || !rb.done || rb.held.n != 0 {
		t.Fatalf("held %v, done %v, %d fingerprints kept", held, rb.done, rb.held.n)
	}
	if why := keyOrderError(kafka, published, stream); why != "" {
		t.Fatal(why)
	}

	rb = newReadBack(context.Background(), fakeKafka(kafka), time.Time{}, discard)
	rb.maxHeld = 2
	for _, e := range stream[0] {
		if _, err := rb.inKafka(context.Background(), recordOf(e), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	rb.abort() // past the bound: nothing is held any more
	if held, _ := rb.inKafka(context.Background(), recordOf(stream[0][0]), time.Now()); held {
		t.Fatal("an abort after the bound was passed reopened the read-back")
	}
}

// TestReadBackStop: the run's context ends a read that goes on (publish's
// context outlives a stop), and a long read logs its progress.
func TestReadBackStop(t *testing.T) {
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs strings.Builder
	rb := newReadBack(stop, func(_ context.Context, topics []string, _ time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		for i := 0; ; i++ { // a topic written faster than it is read; ignores its context
			if i == 10000 {
				cancel()
			}
			if err := fn(sink.ReadRecord{Topic: topics[0], Key: []byte("k"), ID: fmt.Append(nil, i), HasID: true}); err != nil {
				return sink.ReadStats{}, err
			}
		}
	}, time.Time{}, slog.New(slog.NewTextHandler(&logs, nil)))
	rb.progress = 0
	_, err := rb.inKafka(context.Background(), &router.Record{Topic: "orders"}, time.Now())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped read: %v", err)
	}
	if !strings.Contains(logs.String(), "reading back a topic") || !strings.Contains(logs.String(), "records=4096") {
		t.Fatalf("no progress logged: %s", logs.String())
	}
}

// TestFingerprints: a set filled over several reads (its last run added
// to after a seal) finds each fingerprint added and no other.
func TestFingerprints(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	var s fingerprints
	var in [][2]uint64
	for _, n := range []int{3, firstRun, 5 * firstRun, 1} {
		for range n {
			fp := [2]uint64{rnd.Uint64(), rnd.Uint64()}
			s.add(fp, 1<<20)
			in = append(in, fp)
		}
		s.seal()
		for i, fp := range in {
			if !s.has(fp) {
				t.Fatalf("after %d added: fingerprint %d not found", len(in), i)
			}
		}
	}
	for range 1000 {
		if fp := [2]uint64{rnd.Uint64(), rnd.Uint64()}; s.has(fp) {
			t.Fatalf("%x found, never added", fp)
		}
	}
	if c := cap(s.runs[len(s.runs)-1]); len(s.runs) != 3 || c != 4*firstRun {
		t.Fatalf("%d runs, the last of %d", len(s.runs), c)
	}
}

// TestReadBackLoadTenMillion measures the read-back's load of 10,000,000
// synthetic records (about 250 bytes each): time and peak heap, at the
// default bound (the read-back ends there) and with room for all of them.
func TestReadBackLoadTenMillion(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement: ten seconds or so")
	}
	const records = 10_000_000
	for _, maxHeld := range []int{readBackMaxHeld, records} {
		t.Run(fmt.Sprint(maxHeld), func(t *testing.T) {
			var base, ms runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&base)
			peak, readN := base.HeapInuse, 0
			key, id, value := make([]byte, 0, 32), make([]byte, 0, 32), bytes.Repeat([]byte("x"), 200)
			read := func(_ context.Context, topics []string, _ time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
				for i := range records {
					readN++
					key = strconv.AppendInt(append(key[:0], "order-"...), int64(i%1_000_000), 10)
					id = strconv.AppendInt(append(id[:0], "0000000000"...), int64(i), 16)
					copy(value, id)
					if err := fn(sink.ReadRecord{Topic: topics[0], Key: key, ID: id, HasID: true, Value: value}); err != nil {
						return sink.ReadStats{}, err
					}
					if i%250_000 == 0 {
						runtime.ReadMemStats(&ms)
						peak = max(peak, ms.HeapInuse)
					}
				}
				return sink.ReadStats{}, nil
			}
			rb := newReadBack(context.Background(), read, time.Time{}, discard)
			rb.maxHeld = maxHeld
			start := time.Now()
			if _, err := rb.inKafka(context.Background(), &router.Record{Topic: "orders"}, time.Now()); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			n, lookup := rb.held.n, time.Now()
			for i := range 100_000 {
				rb.held.has([2]uint64{uint64(i), uint64(i)})
			}
			t.Logf("%d records read: %v (%.0f ns/record), %d fingerprints held in %d runs, peak heap in use +%.1f MiB; a lookup %v; ended at the bound: %v",
				readN, took.Round(time.Millisecond), float64(took.Nanoseconds())/float64(readN), n, len(rb.held.runs),
				float64(peak-base.HeapInuse)/(1<<20), time.Since(lookup)/100_000, rb.full)
			// What is bounded is memory: 16 bytes a fingerprint, a quarter
			// more for the runs being merged and the read's own buffers.
			if limit := uint64(min(maxHeld, records)) * 16 * 5 / 4; peak-base.HeapInuse > limit {
				t.Errorf("peak heap in use +%d bytes, want at most %d", peak-base.HeapInuse, limit)
			}
			if full := maxHeld < records; rb.full != full || (!full && n != records) {
				t.Errorf("ended at the bound %v with %d held, want %v (%d)", rb.full, n, full, records)
			}
		})
	}
}

// TestReadBackSideTopics: a dead letter and a parked record (quarantine)
// are found on their topics under the topic they were meant for (their
// topic header), so a transaction that dead-lettered or parked an event is
// not published again; the same event meant for another topic is not.
func TestReadBackSideTopics(t *testing.T) {
	commit := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	held := map[string][]sink.ReadRecord{
		"orders":  {{Topic: "orders", Key: []byte("k1"), ID: []byte("e1"), HasID: true, Value: []byte("v1")}},
		"parking": {{Topic: "parking", Key: []byte("k2"), ID: []byte("e2"), HasID: true, Value: []byte("v2"), Orig: "orders"}},
		"dlq":     {{Topic: "dlq", Key: []byte("k3"), ID: []byte("e3"), HasID: true, Value: []byte("v3"), Orig: "orders"}},
	}
	var read []string
	rb := newReadBack(context.Background(), func(_ context.Context, topics []string, _ time.Time, fn func(sink.ReadRecord) error) (sink.ReadStats, error) {
		read = append(read, topics...)
		for _, r := range held[topics[0]] {
			if err := fn(r); err != nil {
				return sink.ReadStats{}, err
			}
		}
		return sink.ReadStats{}, nil
	}, time.Time{}, discard)
	rb.side = []string{"dlq", "parking"}
	for _, tc := range []struct {
		topic, key, id, value string
		want                  bool
	}{
		{"orders", "k1", "e1", "v1", true},
		{"orders", "k2", "e2", "v2", true},    // parked
		{"orders", "k3", "e3", "v3", true},    // dead-lettered
		{"payments", "k2", "e2", "v2", false}, // parked, but meant for orders
	} {
		rec := &router.Record{Topic: tc.topic, Key: []byte(tc.key), Value: []byte(tc.value),
			Headers: []router.Header{{Key: wire.HeaderID, Value: []byte(tc.id)}}}
		got, err := rb.inKafka(context.Background(), rec, commit)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Fatalf("%s %s: held %v, want %v", tc.topic, tc.id, got, tc.want)
		}
		rb.commit()
	}
	if want := []string{"dlq", "parking", "orders", "payments"}; !slices.Equal(read, want) {
		t.Fatalf("topics read %v, want %v: each once, the side topics first", read, want)
	}
}

// TestReadBackRedoReadsFromTheStart: a snapshot taken again reads its
// topics from their start, whatever the first row's time: the interrupted
// snapshot's records carry its own start time, or the rows'.
func TestReadBackRedoReadsFromTheStart(t *testing.T) {
	var since []time.Time
	rb := newReadBack(context.Background(), func(_ context.Context, _ []string, s time.Time, _ func(sink.ReadRecord) error) (sink.ReadStats, error) {
		since = append(since, s)
		return sink.ReadStats{}, nil
	}, time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC), discard)
	rb.redo = true
	rec := &router.Record{Topic: "orders", Key: []byte("k"), Value: []byte("v"), Timestamp: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC),
		Headers: []router.Header{{Key: wire.HeaderID, Value: []byte("e1")}}}
	if _, err := rb.inKafka(context.Background(), rec, time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	if len(since) != 1 || !since[0].IsZero() {
		t.Fatalf("read from %v, want the start (a zero time)", since)
	}
}
