package offsets

import (
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// windowBuckets bounds the samples a duration window keeps: one per d/128,
// so the confirmed position lags by at most d/128 more than d.
const windowBuckets = 128

// Window holds the confirmed position back by a duration or a byte count,
// so the WAL of that window stays available for replay.
type Window struct {
	d       time.Duration
	bytes   lsn.LSN
	samples []sample // acked positions over time, oldest first
}

// sample says the watermark was pos at time at. Samples closer than
// d/windowBuckets share one: it keeps the time it opened (first) and the
// newest position with the time it was seen, which is never earlier than
// the truth.
type sample struct {
	first time.Time
	at    time.Time
	pos   lsn.LSN
}

// NewWindow returns a window of d or bytes (at most one is non-zero); a zero
// window confirms the acknowledged position itself.
func NewWindow(d time.Duration, bytes int64) *Window {
	return &Window{d: d, bytes: lsn.LSN(bytes)}
}

// Confirmable returns the position to confirm at now for the acknowledged
// position acked: never newer than acked was at now minus d. It is used by
// one goroutine.
func (w *Window) Confirmable(now time.Time, acked lsn.LSN) lsn.LSN {
	switch {
	case w == nil || (w.d == 0 && w.bytes == 0):
		return acked
	case w.bytes > 0:
		if acked <= w.bytes {
			return 0
		}
		return acked - w.bytes
	}
	n := len(w.samples)
	switch {
	case n > 0 && w.samples[n-1].pos == acked:
		// Unchanged: the older time stays true and confirms sooner.
	case n > 0 && now.Sub(w.samples[n-1].first) < max(w.d/windowBuckets, 1):
		last := &w.samples[n-1]
		last.at, last.pos = later(last.at, now), acked
	default:
		w.samples = append(w.samples, sample{first: now, at: now, pos: acked})
	}
	// The newest sample at least d old is confirmable; older ones can go.
	cut := now.Add(-w.d)
	i := 0
	for i+1 < len(w.samples) && !w.samples[i+1].at.After(cut) {
		i++
	}
	if i > 0 {
		// Shift rather than reslice, so the array does not creep forward
		// and get reallocated for ever.
		w.samples = w.samples[:copy(w.samples, w.samples[i:])]
	}
	if w.samples[0].at.After(cut) {
		return 0
	}
	return w.samples[0].pos
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
