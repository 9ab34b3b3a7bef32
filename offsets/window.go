package offsets

import (
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// Window holds the confirmed position back by a duration or a byte count,
// so the WAL of that window stays available for replay.
type Window struct {
	d       time.Duration
	bytes   lsn.LSN
	samples []sample // acked positions over time, oldest first
}

type sample struct {
	at  time.Time
	pos lsn.LSN
}

// NewWindow returns a window of d or bytes (at most one is non-zero); a zero
// window confirms the acknowledged position itself.
func NewWindow(d time.Duration, bytes int64) *Window {
	return &Window{d: d, bytes: lsn.LSN(bytes)}
}

// Confirmable returns the position to confirm at now for the acknowledged
// position acked. It is used by one goroutine.
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
	if n := len(w.samples); n == 0 || w.samples[n-1].pos != acked {
		w.samples = append(w.samples, sample{now, acked})
	}
	// The newest sample at least d old is confirmable; older ones can go.
	cut := now.Add(-w.d)
	i := 0
	for i+1 < len(w.samples) && !w.samples[i+1].at.After(cut) {
		i++
	}
	w.samples = w.samples[i:]
	if w.samples[0].at.After(cut) {
		return 0
	}
	return w.samples[0].pos
}
