package chaos

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// event is one committed outbox row as the writer knows it.
type event struct {
	ID     string
	Agg    string // aggregate_id (the record key)
	Type   string // aggregate_type (the topic)
	Seq    int    // 1, 2, ... per aggregate, in commit order
	Writer int
	Txn    int64 // writer-local transaction number
	// PostLSN is pg_current_wal_lsn() read after the commit in the same
	// session (or, when the commit's outcome was unknown, after it was
	// found committed): it is at or after the transaction's commit end.
	PostLSN   lsn.LSN
	Committed time.Time // when the writer learned the commit
	Resolved  bool      // the outcome was unknown and settled by looking the id up
	// Bucket is the row's partition key (the writers' current bucket when
	// the transaction was built; retries reuse it).
	Bucket int
	// Oversize marks an event written larger than its topic's
	// max.message.bytes on purpose: it must end on the dead-letter topic.
	Oversize bool
	// Message marks a table-less event: a transactional logical decoding
	// message (pg_logical_emit_message, outbox.message_prefix), no row. The
	// table checks (the ledger against the table, verify) skip it; the
	// topic checks treat it as any event.
	Message bool
	// Backdate: the row's created_at is this far before now() (an
	// application-set time in the past; slow_test.go); 0: the default.
	Backdate time.Duration
}

// ledger collects committed events from all writers.
type ledger struct {
	mu     sync.Mutex
	events []event
	// undone are events that committed and were then undone by the
	// database itself (restore_test.go: a restore from an older copy, a
	// promotion of a standby that was behind); they may be in Kafka.
	undone []event
	// writers are the writers that record here; gate pauses them between
	// transactions (each holds it for reading while it commits one) so
	// that a restore can rewrite their state.
	writers []*writer
	gate    sync.RWMutex
}

func (l *ledger) add(evs []event) {
	l.mu.Lock()
	l.events = append(l.events, evs...)
	l.mu.Unlock()
}

func (l *ledger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// since returns the events from index i on.
func (l *ledger) since(i int) []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i >= len(l.events) {
		return nil
	}
	return append([]event(nil), l.events[i:]...)
}

func (l *ledger) all() []event { return l.since(0) }

// writerStats counts what the writers went through.
type writerStats struct {
	txns        atomic.Int64
	retries     atomic.Int64 // attempts that did not commit and were retried
	unknown     atomic.Int64 // commits whose outcome had to be looked up
	unknownWon  atomic.Int64 // ... and turned out committed
	reconnects  atomic.Int64
	lsnDeferred atomic.Int64 // committed, LSN read on a new connection
	// undefinedColumn counts attempts refused because a column the INSERT
	// names was missing (ops-drop-mapped-column); they are retried.
	undefinedColumn atomic.Int64
}

// writer inserts outbox rows for its own aggregates, one transaction at a
// time, and survives PostgreSQL restarts: a transaction is retried until it
// commits, and a commit whose outcome is unknown is settled by looking its
// first id up (ids are chosen here, so a retry of a transaction that did
// commit fails on the primary key instead of inserting twice).
type writer struct {
	n      int
	dsn    string
	aggs   []*aggregate
	multi  float64 // probability of a multi-event transaction
	rng    *mrand.Rand
	ledger *ledger
	stats  *writerStats
	conn   *pgx.Conn
	txn    int64
	// bucket is the shared current partition key (nil: 1); pad, when > 0,
	// adds that many bytes to each payload and marks the events Oversize.
	bucket *atomic.Int64
	pad    int
	// fill, when > 0, adds that many bytes of random hex text to each
	// payload (not Oversize): rows that move the WAL fast, which a
	// compressed pad would not (restore_writing_test.go).
	fill int
	// ins and lookup, when set, write and look up another outbox table's
	// rows (tables_test.go).
	ins    func(ctx context.Context, q execer, e event) error
	lookup string
	// bulk: a multi-row transaction is one INSERT (largetxn_test.go).
	bulk bool
	// msgAggs, when set, are aggregates of table-less events: with
	// probability msgProb a transaction also emits one message event of
	// one of them (messages.go). They are not the row aggregates, so the
	// per-key order rule holds across a gap repair, which publishes the
	// gap's rows ahead of the stream's messages.
	msgAggs []*aggregate
	msgProb float64
	// backdate is the probability that a transaction's rows get a
	// created_at hours in the past; holdMin..holdMax, when set, how long
	// each multi-row transaction stays open before its COMMIT
	// (slow_test.go).
	backdate         float64
	holdMin, holdMax time.Duration
	held             *heldLog
}

type aggregate struct {
	id, typ string
	next    int // next sequence number
}

func newWriter(n int, dsn string, aggs []*aggregate, multi float64, seed uint64, l *ledger, st *writerStats) *writer {
	w := &writer{n: n, dsn: dsn, aggs: aggs, multi: multi, rng: mrand.New(mrand.NewPCG(seed, uint64(n))), ledger: l, stats: st}
	l.mu.Lock()
	l.writers = append(l.writers, w)
	l.mu.Unlock()
	return w
}

// run writes until stop is closed (between transactions, so the last one is
// settled) or ctx ends. interval is the mean pause between transactions.
func (w *writer) run(ctx context.Context, stop <-chan struct{}, interval time.Duration) error {
	defer w.closeConn()
	for {
		d := time.Duration(float64(interval) * (0.5 + w.rng.Float64()))
		t := time.NewTimer(d)
		select {
		case <-stop:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if _, err := w.commitNext(ctx); err != nil {
			return err
		}
	}
}

// commitNext builds the next transaction, commits it (retrying as long as
// it takes) and records it in the ledger.
func (w *writer) commitNext(ctx context.Context) ([]event, error) {
	w.ledger.gate.RLock()
	defer w.ledger.gate.RUnlock()
	k := 1
	if w.rng.Float64() < w.multi {
		k = 2 + w.rng.IntN(3)
	}
	w.txn++
	bucket := 1
	if w.bucket != nil {
		bucket = int(w.bucket.Load())
	}
	evs := make([]event, k)
	next := map[*aggregate]int{}
	for i := range evs {
		a := w.aggs[w.rng.IntN(len(w.aggs))]
		if _, ok := next[a]; !ok {
			next[a] = a.next
		}
		evs[i] = event{ID: newUUID(), Agg: a.id, Type: a.typ, Seq: next[a], Writer: w.n, Txn: w.txn, Bucket: bucket, Oversize: w.pad > 0}
		next[a]++
	}
	evs = w.addMessage(evs, next, bucket)
	w.markBackdated(evs)
	if err := w.commit(ctx, evs); err != nil {
		return nil, err
	}
	for a, n := range next {
		a.next = n
	}
	w.stats.txns.Add(1)
	w.ledger.add(evs)
	return evs, nil
}

type outcome int

const (
	committed outcome = iota
	notCommitted
	unknown         // the commit was sent; the connection failed before its answer
	committedNoLSN  // committed, but the LSN could not be read
	committedBefore // a retry hit the primary key: an earlier attempt committed
)

const opTimeout = 10 * time.Second

// commit makes evs committed, whatever it takes, and sets their PostLSN.
func (w *writer) commit(ctx context.Context, evs []event) error {
	backoff := 50 * time.Millisecond
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.connect(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !sleepCtx(ctx, backoff) { // retry backoff while PostgreSQL is unreachable
				return ctx.Err()
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		res, post := w.try(ctx, evs)
		if res == unknown {
			w.stats.unknown.Add(1)
			w.closeConn()
			var err error
			if res, err = w.resolve(ctx, firstRow(evs).ID); err != nil {
				return err
			}
			if res == committedNoLSN {
				w.stats.unknownWon.Add(1)
			}
		}
		switch res {
		case committed:
			stamp(evs, post, false)
			return nil
		case committedNoLSN, committedBefore:
			w.closeConn()
			w.stats.lsnDeferred.Add(1)
			post, err := w.readLSN(ctx)
			if err != nil {
				return err
			}
			stamp(evs, post, true)
			return nil
		}
		w.stats.retries.Add(1)
		w.closeConn()
		if !sleepCtx(ctx, backoff) { // retry backoff
			return ctx.Err()
		}
		backoff = min(backoff*2, time.Second)
	}
}

func stamp(evs []event, post lsn.LSN, resolved bool) {
	now := time.Now()
	for i := range evs {
		evs[i].PostLSN, evs[i].Committed, evs[i].Resolved = post, now, resolved
	}
}

// The INSERT names event_type (a mapped column): while ops-drop-mapped-column
// has dropped it, every attempt fails and is retried. Each row's payload
// carries "low", the WAL insert position read inside its transaction before
// the COMMIT: a lower bound of its commit LSN (secondslot_test.go).
const (
	insertSQL = `INSERT INTO outbox (id, bucket, aggregate_type, aggregate_id, event_type, payload)
	VALUES ($1::uuid, $7::int, $2, $3, 'chaos', jsonb_build_object('seq', $4::int, 'writer', $5::int, 'txn', $6::bigint, ` + lowField + `))`
	insertPadSQL = `INSERT INTO outbox (id, bucket, aggregate_type, aggregate_id, event_type, payload)
	VALUES ($1::uuid, $7::int, $2, $3, 'chaos', jsonb_build_object('seq', $4::int, 'writer', $5::int, 'txn', $6::bigint, ` + lowField + `, 'pad', repeat('x', $8::int)))`
	insertFillSQL = `INSERT INTO outbox (id, bucket, aggregate_type, aggregate_id, event_type, payload)
	VALUES ($1::uuid, $7::int, $2, $3, 'chaos', jsonb_build_object('seq', $4::int, 'writer', $5::int, 'txn', $6::bigint, ` + lowField + `,
		'fill', (SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, $8::int / 32) g)))`
	lowField = `'low', pg_current_wal_insert_lsn()::text`
)

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (w *writer) insert(ctx context.Context, q execer, e event) error {
	if e.Message {
		return emitMessage(ctx, q, e)
	}
	if e.Backdate > 0 {
		return insertBackdated(ctx, q, e)
	}
	if w.ins != nil {
		return w.ins(ctx, q, e)
	}
	if w.pad > 0 {
		_, err := q.Exec(ctx, insertPadSQL, e.ID, e.Type, e.Agg, e.Seq, e.Writer, e.Txn, e.Bucket, w.pad)
		return err
	}
	if w.fill > 0 {
		_, err := q.Exec(ctx, insertFillSQL, e.ID, e.Type, e.Agg, e.Seq, e.Writer, e.Txn, e.Bucket, w.fill)
		return err
	}
	_, err := q.Exec(ctx, insertSQL, e.ID, e.Type, e.Agg, e.Seq, e.Writer, e.Txn, e.Bucket)
	return err
}

// isUndefinedColumn: the statement named a column the table lacks; it was
// refused before it ran, so nothing committed.
func isUndefinedColumn(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42703"
}

// try runs one attempt.
func (w *writer) try(ctx context.Context, evs []event) (outcome, lsn.LSN) {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if len(evs) == 1 {
		e := evs[0]
		if err := w.insert(octx, w.conn, e); err != nil {
			if isUniqueViolation(err) {
				return committedBefore, 0
			}
			if isUndefinedColumn(err) {
				w.stats.undefinedColumn.Add(1)
				return notCommitted, 0
			}
			// Even an error response may follow a commit (a shutdown
			// interrupt after the commit record): look it up.
			return unknown, 0
		}
	} else {
		tx, err := w.conn.Begin(octx)
		if err != nil {
			return notCommitted, 0
		}
		if err := w.insertAll(octx, tx, evs); err != nil {
			_ = tx.Rollback(context.Background())
			if isUniqueViolation(err) {
				return committedBefore, 0 // all or nothing: the earlier attempt committed
			}
			if isUndefinedColumn(err) {
				w.stats.undefinedColumn.Add(1)
			}
			return notCommitted, 0
		}
		if !w.holdOpen(octx) { // a transaction open across faults
			_ = tx.Rollback(context.Background())
			return notCommitted, 0
		}
		if err := tx.Commit(octx); err != nil {
			return unknown, 0
		}
	}
	var s string
	if err := w.conn.QueryRow(octx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return committedNoLSN, 0
	}
	l, err := lsn.Parse(s)
	if err != nil {
		return committedNoLSN, 0
	}
	return committed, l
}

// resolve looks id up on a new connection until it gets an answer.
func (w *writer) resolve(ctx context.Context, id string) (outcome, error) {
	backoff := 50 * time.Millisecond
	for {
		if err := w.connect(ctx); err == nil {
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			var n int
			err = w.conn.QueryRow(octx, cmp.Or(w.lookup, committedSQL("outbox", "id")), id).Scan(&n)
			cancel()
			if err == nil {
				if n > 0 {
					return committedNoLSN, nil
				}
				// Not there: the retry reuses the ids, so even a commit still
				// in flight cannot be inserted twice.
				return notCommitted, nil
			}
			w.closeConn()
		}
		if !sleepCtx(ctx, backoff) { // retry backoff
			return 0, ctx.Err()
		}
		backoff = min(backoff*2, time.Second)
	}
}

// readLSN reads pg_current_wal_lsn() on a working connection.
func (w *writer) readLSN(ctx context.Context) (lsn.LSN, error) {
	backoff := 50 * time.Millisecond
	for {
		if err := w.connect(ctx); err == nil {
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			var s string
			err = w.conn.QueryRow(octx, "SELECT pg_current_wal_lsn()::text").Scan(&s)
			cancel()
			if err == nil {
				return lsn.Parse(s)
			}
			w.closeConn()
		}
		if !sleepCtx(ctx, backoff) { // retry backoff
			return 0, ctx.Err()
		}
		backoff = min(backoff*2, time.Second)
	}
}

func (w *writer) connect(ctx context.Context) error {
	if w.conn != nil && !w.conn.IsClosed() {
		return nil
	}
	w.closeConn()
	cfg, err := pgx.ParseConfig(direct(w.dsn))
	if err != nil {
		return err
	}
	cfg.RuntimeParams["application_name"] = fmt.Sprintf("chaos-writer-%d", w.n)
	// pg_current_wal_lsn() after COMMIT covers the commit record only if
	// the commit waited for its WAL flush.
	cfg.RuntimeParams["synchronous_commit"] = "on"
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(octx, cfg)
	if err != nil {
		return err
	}
	w.conn = conn
	w.stats.reconnects.Add(1)
	return nil
}

func (w *writer) closeConn() {
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = w.conn.Close(ctx)
		cancel()
		w.conn = nil
	}
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// sleepCtx waits d or until ctx ends and reports whether d passed. It is
// for fault durations and gaps of the schedule, writer pacing and backoff,
// and the interval of loops that poll a real state: never to wait for
// something to happen.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
