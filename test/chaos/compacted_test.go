package chaos

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// pg-restore-compacted (exactly_once only): a restore over a compacted
// event topic whose cleaner ran before it. After the restore and the
// tombstone, the restored slot sends again what it had sent between its
// position and the copy, all in Kafka, and the run reads back what the
// first transactions' topics hold before it publishes them
// (pipeline/readback.go). On a compacted topic the cleaner has removed the
// records a newer one of their key superseded: the first event the read
// finds missing ends the read-back, and it and everything after it are
// published again, in order: duplicates, never a loss nor a reorder
// (docs/operations.md, "Exactly-once delivery").
//
// The topic of aggregate type "compact" has cleanup.policy=compact, a
// segment rolled every 100 ms, min.cleanable.dirty.ratio 0.01 and no
// compaction lag; the broker's cleaner looks every second
// (log.cleaner.backoff.ms, main_test.go). Its events are table-less
// (messages_test.go), each in a transaction with a row on the order topic:
// verify reads the table, and a compacted event has no row to find. The
// fault writes events of two keys just before the copy (the last of them
// lie past the slot's confirmed position, in what the restored slot sends
// again), newer ones of the same keys after it, waits until the cleaner
// removed the older ones, and restores (restoreWriting): half the time with
// the writers going on, half the time paused until the connector runs
// again, as pg-restore, which keeps the committed position refused by the
// WAL end alone.
//
// The checks: the live consumer keeps the topic's records; those the
// cleaner removed before the final read count as delivered (withCompacted).
// The copies that a process started by the fault's runbook sent again of
// events committed before the restore are counted apart in the
// exactly_once checks (withoutReadBackCopies); the order checks see every
// copy.

const (
	compactType = "compact"
	// compactEvents is how many transactions the fault commits before the
	// copy; as many follow it, compactPace apart (segments roll at 100 ms).
	compactEvents = 10
	compactPace   = 150 * time.Millisecond
)

// compactionReport is what the compacted topic went through.
type compactionReport struct {
	Topic string `json:"topic"`
	// Removed: records the live consumer read that the cleaner removed
	// before the final read (delivered).
	Removed int `json:"records_compacted_away"`
	// ReadBackDuplicates: copies sent again by a process of a
	// pg-restore-compacted runbook of events committed before the restore.
	ReadBackDuplicates int `json:"duplicates_after_compacted_readback"`
}

func (cr *compactionReport) String() string {
	return fmt.Sprintf("compacted topic %s: %d records removed by the cleaner (delivered), %d copies sent again after a compacted read-back (counted apart)",
		cr.Topic, cr.Removed, cr.ReadBackDuplicates)
}

func (r *run) compactTopic() string { return r.prefix + "." + compactType }

// setupCompacted creates the compacted topic in a run that has
// pg-restore-compacted, and adds it to the outbox topics.
func (r *run) setupCompacted(ctx context.Context, adm *kadm.Client) error {
	if !exactlyOnce() || r.skip[fPGRestoreCompacted] || r.m.Deck[fPGRestoreCompacted] == 0 {
		return nil
	}
	cfg := map[string]*string{
		"message.timestamp.type":    kadm.StringPtr("LogAppendTime"),
		"cleanup.policy":            kadm.StringPtr("compact"),
		"segment.ms":                kadm.StringPtr("100"),
		"min.cleanable.dirty.ratio": kadm.StringPtr("0.01"),
		"min.compaction.lag.ms":     kadm.StringPtr("0"),
	}
	resps, err := adm.CreateTopics(ctx, 1, 1, cfg, r.compactTopic())
	if err == nil {
		err = resps.Error()
	}
	if err != nil {
		return fmt.Errorf("create the compacted topic: %w", err)
	}
	r.topics = append(r.topics, r.compactTopic())
	r.compacted = true
	return waitTopicsLed(ctx, adm, []string{r.compactTopic()})
}

// compactor writes the compacted topic's events.
func (r *run) compactor() *writer {
	if r.cmp == nil {
		n := r.m.Writers + 4 + secondWriters // after the filler
		r.cmp = newWriter(n, r.dsn, []*aggregate{{id: "cmp-r", typ: "order", next: 1}}, 0, r.seed, r.ledger, r.wstats)
		r.cmp.bucket = &r.bucket
		r.cmp.msgAggs = []*aggregate{{id: "cmp-k0", typ: compactType, next: 1}, {id: "cmp-k1", typ: compactType, next: 1}}
		r.cmp.msgProb = 1
		r.t.Cleanup(r.cmp.closeConn)
	}
	return r.cmp
}

// compactWrites commits n transactions of the compactor, pace apart, and
// returns their table-less events (the compacted topic's).
func (r *run) compactWrites(ctx context.Context, n int, pace time.Duration) ([]event, error) {
	var out []event
	for i := range n {
		if i > 0 && !sleepCtx(ctx, pace) { // rolls the topic's segments between records
			return out, ctx.Err()
		}
		evs, err := r.compactor().commitNext(ctx)
		if err != nil {
			return out, err
		}
		for _, e := range evs {
			if e.Message {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

// pgRestoreCompacted runs the fault (above).
func (r *run) pgRestoreCompacted(ctx context.Context, f *faultRecord) (string, error) {
	if !r.compacted {
		return "no compacted topic in this run", nil
	}
	before, err := r.compactWrites(ctx, compactEvents, 0)
	if err != nil {
		return "", err
	}
	dirs, err := r.coldCopies(ctx, 1)
	defer removeCopies(dirs)
	if err != nil {
		return "", err
	}
	copied := time.Now()
	if _, err := r.compactWrites(ctx, compactEvents, compactPace); err != nil {
		return "", err
	}
	sleepCtx(ctx, r.between(time.Second, 3*time.Second)) // the workload goes on over the copy
	removed := r.awaitCleaned(ctx, before, 30*time.Second)
	o := restoreOpts{must: opsExitTimeout, may: 10 * time.Second, pause: r.rng.IntN(2) == 0}
	desc := fmt.Sprintf("%d events of %s before the copy, %d after; %v after the copy the cleaner had removed %d of the first; ",
		len(before), r.compactTopic(), compactEvents, time.Since(copied).Round(time.Millisecond), removed)
	if o.pause {
		desc += "writers paused until the connector runs again; "
	}
	desc, err = r.restoreWriting(ctx, f, fPGRestoreCompacted, dirs[0], o, desc)
	return desc + r.readBackSaid(ctx, f.Rewound), err
}

// awaitCleaned waits, at most d, until the final read of the compacted
// topic lacks every one of evs (a newer record of each key follows), and
// returns how many it lacks.
func (r *run) awaitCleaned(ctx context.Context, evs []event, d time.Duration) int {
	start := time.Now()
	removed := 0
	for {
		recs, _, err := readAll(ctx, []string{r.compactTopic()}, r.dlq)
		if err == nil {
			held := map[string]bool{}
			for _, c := range recs {
				held[c.ID] = true
			}
			removed = 0
			for _, e := range evs {
				if !held[e.ID] {
					removed++
				}
			}
		}
		if removed == len(evs) || time.Since(start) > d || !sleepCtx(ctx, 500*time.Millisecond) { // the cleaner's pace: it looks every second
			return removed
		}
	}
}

// readBackLine is how a process says how its read-back ended.
var readBackLine = regexp.MustCompile(`msg="exactly-once: read back the transactions already in Kafka[^"]*"(.*)`)

// readBackSaid reports what the current process, started since the
// rewind, said about its read-back: it reads back when the first events
// come, after it is ready, so its log is read for up to 10 s.
func (r *run) readBackSaid(ctx context.Context, since time.Time) string {
	in := r.conn.current()
	if in == nil || in.Start.Before(since) {
		return ""
	}
	for range 100 {
		if m := readBackLine.FindStringSubmatch(r.conn.logOf(in.N)); m != nil {
			return fmt.Sprintf("; #%d read back:%s", in.N, m[1])
		}
		if !sleepCtx(ctx, 100*time.Millisecond) { // polls the process's log
			break
		}
	}
	return fmt.Sprintf("; #%d logged no read-back within 10s", in.N)
}

// withCompacted adds to recs (the final read, in topic, partition and
// offset order) the compacted topic's records the live consumer read and
// the cleaner removed since: they were delivered.
func (o *observation) withCompacted(rep *Report, recs []copyRec) []copyRec {
	if !o.Compacted {
		return recs
	}
	cr := &compactionReport{Topic: o.CompactTopic}
	rep.Compaction = cr
	type at struct {
		p int32
		o int64
	}
	held := map[at]bool{}
	for _, c := range recs {
		if c.Topic == cr.Topic {
			held[at{c.Partition, c.Offset}] = true
		}
	}
	for _, c := range o.Kept[cr.Topic] {
		if k := (at{c.Partition, c.Offset}); !held[k] {
			held[k] = true
			c.Compacted = true
			recs = append(recs, c)
			cr.Removed++
		}
	}
	sort.SliceStable(recs, func(i, j int) bool {
		a, b := recs[i], recs[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	return recs
}

// withoutReadBackCopies leaves out, for the exactly_once checks, the copies
// of events committed before a pg-restore-compacted restore appended again
// after it, until the next fault, and counts them: what the runbook's
// read-back could not find, and everything after it, is published again.
// (A copy is told by its append time: in exactly_once every process of the
// source has the same producer id.)
func (o *observation) withoutReadBackCopies(rep *Report, recs []copyRec, copies map[string][]copyRec, byID map[string]*event) ([]copyRec, map[string][]copyRec) {
	type span struct{ from, to time.Time }
	var spans []span
	for i, f := range o.Faults {
		if f.Kind != fPGRestoreCompacted || f.Rewound.IsZero() {
			continue
		}
		s := span{from: f.Rewound}
		if i+1 < len(o.Faults) {
			s.to = o.Faults[i+1].Start
		}
		spans = append(spans, s)
	}
	if len(spans) == 0 || rep.Compaction == nil {
		return recs, copies
	}
	again := func(c copyRec) bool {
		e := byID[c.ID]
		for _, s := range spans {
			if e != nil && e.Committed.Before(s.from) && c.Append.After(s.from) && (s.to.IsZero() || c.Append.Before(s.to)) {
				return true
			}
		}
		return false
	}
	type at struct {
		topic string
		p     int32
		o     int64
	}
	dropped := map[at]bool{}
	out := make(map[string][]copyRec, len(copies))
	for id, cs := range copies {
		for i, c := range cs {
			if i > 0 && again(c) {
				dropped[at{c.Topic, c.Partition, c.Offset}] = true
				continue
			}
			out[id] = append(out[id], c)
		}
	}
	rep.Compaction.ReadBackDuplicates = len(dropped)
	kept := recs[:0:0]
	for _, c := range recs {
		if !dropped[at{c.Topic, c.Partition, c.Offset}] {
			kept = append(kept, c)
		}
	}
	return kept, out
}
