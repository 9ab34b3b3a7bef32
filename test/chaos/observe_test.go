package chaos

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// newKafkaClient is a client of the suite (never through the proxy) with
// quick retries, so it is back soon after a broker restart.
func newKafkaClient(opts ...kgo.Opt) (*kgo.Client, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(env.kafkaAddr),
		kgo.Dialer(kafkaDialer),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.ClientID("chaos-observer"),
	}
	return kgo.NewClient(append(base, opts...)...)
}

// liveConsumer reads the outbox topics for the whole run and notes when it
// first saw each event id.
type liveConsumer struct {
	mu        sync.Mutex
	seen      map[string]time.Time
	watches   map[string]chan struct{}
	records   atomic.Int64
	fetchErrs atomic.Int64
	// copies keeps every record read of the topics keepCopies named, in
	// the order read: the parking topic (its retention may delete records
	// before the final read) and the big topic (redrive_test.go).
	copies map[string][]copyRec
}

// keepCopies makes the consumer keep the records of topics; call it before run.
func (lc *liveConsumer) keepCopies(topics ...string) {
	lc.copies = map[string][]copyRec{}
	for _, t := range topics {
		lc.copies[t] = nil
	}
}

// kept returns the records read of topic (keepCopies), in the order read.
func (lc *liveConsumer) kept(topic string) []copyRec {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return slices.Clone(lc.copies[topic])
}

// copiesOf returns the records of id read on topic (keepCopies).
func (lc *liveConsumer) copiesOf(topic, id string) []copyRec {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var out []copyRec
	for _, c := range lc.copies[topic] {
		if c.ID == id {
			out = append(out, c)
		}
	}
	return out
}

func newLiveConsumer() *liveConsumer {
	return &liveConsumer{seen: map[string]time.Time{}, watches: map[string]chan struct{}{}}
}

// run consumes topics from the start until ctx ends.
func (lc *liveConsumer) run(ctx context.Context, topics []string, ready chan<- error) {
	cl, err := newKafkaClient(append([]kgo.Opt{
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.FetchMaxBytes(32 << 20),
	}, isolation()...)...)
	ready <- err
	if err != nil {
		return
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		now := time.Now()
		if ctx.Err() != nil {
			return
		}
		fs.EachError(func(string, int32, error) { lc.fetchErrs.Add(1) })
		lc.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			lc.records.Add(1)
			id, ok := header(r, "id")
			if !ok {
				return
			}
			if cs, keep := lc.copies[r.Topic]; keep {
				lc.copies[r.Topic] = append(cs, toCopy(r))
			}
			if _, dup := lc.seen[id]; dup {
				return
			}
			lc.seen[id] = now
			if ch, ok := lc.watches[id]; ok {
				close(ch)
				delete(lc.watches, id)
			}
		})
		lc.mu.Unlock()
	}
}

// watch returns a channel closed once id has been consumed.
func (lc *liveConsumer) watch(id string) <-chan struct{} {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	ch := make(chan struct{})
	if _, ok := lc.seen[id]; ok {
		close(ch)
		return ch
	}
	if old, ok := lc.watches[id]; ok {
		return old
	}
	lc.watches[id] = ch
	return ch
}

// seenAt returns when id was first consumed.
func (lc *liveConsumer) seenAt(id string) (time.Time, bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	t, ok := lc.seen[id]
	return t, ok
}

// snapshot copies the first-seen times.
func (lc *liveConsumer) snapshot() map[string]time.Time {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	m := make(map[string]time.Time, len(lc.seen))
	for k, v := range lc.seen {
		m[k] = v
	}
	return m
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// sample is one reading of the positions the connector has confirmed.
type sample struct {
	T    time.Time // when the query returned
	Slot lsn.LSN   // pg_replication_slots.confirmed_flush_lsn
	Ckpt lsn.LSN   // the connector's checkpoint (zero if none yet)
}

// sampler reads the slot's confirmed_flush_lsn and the checkpoint about
// every interval, on a direct connection, for the whole run.
type sampler struct {
	dsn, slot string
	mu        sync.Mutex
	samples   []sample
	failed    atomic.Int64 // readings that failed (PostgreSQL down)
}

func (s *sampler) run(ctx context.Context, interval time.Duration) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			c, err := pgx.Connect(cctx, direct(s.dsn))
			cancel()
			if err != nil {
				s.failed.Add(1)
				continue
			}
			conn = c
		}
		smp, err := s.read(ctx, conn)
		if err != nil {
			s.failed.Add(1)
			conn.Close(context.Background())
			conn = nil
			continue
		}
		if smp.Slot == 0 {
			continue // the slot does not exist yet
		}
		s.mu.Lock()
		s.samples = append(s.samples, smp)
		s.mu.Unlock()
	}
}

func (s *sampler) read(ctx context.Context, conn *pgx.Conn) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var smp sample
	var confirmed *string
	err := conn.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, s.slot).Scan(&confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return smp, nil
	}
	if err != nil {
		return smp, err
	}
	// The checkpoint is read after the slot, so the slot reading is no
	// later than T either way.
	ckpt, err := readCheckpoint(ctx, conn, s.slot)
	if err != nil {
		return smp, err
	}
	smp.T = time.Now()
	if confirmed != nil {
		smp.Slot, _ = lsn.Parse(*confirmed)
	}
	smp.Ckpt = ckpt
	return smp, nil
}

// samplesAfter counts the samples whose query returned after t. The second
// of them was queried wholly after t.
func (s *sampler) samplesAfter(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for i := len(s.samples) - 1; i >= 0 && s.samples[i].T.After(t); i-- {
		n++
	}
	return n
}

func (s *sampler) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}
