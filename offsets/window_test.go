package offsets

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outbox-cdc/outbox-cdc/lsn"
)

// TestWindowBoundedSamples drives a duration window with a watermark that
// moves at various rates and checks, at every call, against the full
// history: the confirmable position is never newer than the watermark as it
// was d ago, at most about d/128 older than that, and the window keeps at
// most windowBuckets+3 samples however often the watermark moves.
func TestWindowBoundedSamples(t *testing.T) {
	tests := []struct {
		name  string
		d     time.Duration
		tick  time.Duration // time between calls
		moves int           // the watermark moves on one call in moves (0: random)
		span  time.Duration
	}{
		{"moves every call, 1h window", time.Hour, 20 * time.Millisecond, 1, 150 * time.Minute},
		{"moves every ms, 1m window", time.Minute, time.Millisecond, 1, 4 * time.Minute},
		{"moves slower than a bucket", 10 * time.Second, 100 * time.Millisecond, 10, 2 * time.Minute},
		{"calls more often than moves", time.Minute, time.Millisecond, 37, 3 * time.Minute},
		{"bursts and silences", 30 * time.Minute, 50 * time.Millisecond, 0, 2 * time.Hour},
		{"tiny window", time.Millisecond, time.Microsecond, 1, 300 * time.Millisecond},
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 11))
			w := NewWindow(tt.d, 0)
			type seen struct {
				at  time.Time
				pos lsn.LSN
			}
			var hist []seen // every call, oldest first
			// asOf returns the watermark as it was at time at (0 before the first call).
			lo := 0
			asOf := func(at time.Time) lsn.LSN {
				for lo+1 < len(hist) && !hist[lo+1].at.After(at) {
					lo++
				}
				if len(hist) == 0 || hist[lo].at.After(at) {
					return 0
				}
				return hist[lo].pos
			}
			acked := lsn.LSN(1000)
			burst := false
			maxSamples := 0
			for now := t0; now.Sub(t0) < tt.span; now = now.Add(tt.tick) {
				switch {
				case tt.moves > 0:
					if len(hist)%tt.moves == 0 {
						acked += lsn.LSN(1 + rng.IntN(1000))
					}
				default:
					if rng.IntN(5000) == 0 {
						burst = !burst
					}
					if burst {
						acked += lsn.LSN(1 + rng.IntN(1000))
					}
				}
				hist = append(hist, seen{now, acked})
				got := w.Confirmable(now, acked)
				newest := asOf(now.Add(-tt.d))
				oldest := asOf(now.Add(-tt.d - tt.d/windowBuckets - tt.tick))
				if got > newest {
					t.Fatalf("at +%v: confirmable %v is newer than the watermark %v as it was %v ago", now.Sub(t0), got, newest, tt.d)
				}
				if got < oldest {
					t.Fatalf("at +%v: confirmable %v lags behind %v, the watermark a bucket before %v ago", now.Sub(t0), got, oldest, tt.d)
				}
				maxSamples = max(maxSamples, len(w.samples))
			}
			if maxSamples > windowBuckets+3 {
				t.Fatalf("window kept %d samples, want at most %d", maxSamples, windowBuckets+3)
			}
			t.Logf("%d calls, at most %d samples", len(hist), maxSamples)
		})
	}
}

// windowStep is one call of a scripted window scenario.
type windowStep struct {
	after time.Duration
	acked lsn.LSN
	want  lsn.LSN
}

func TestWindowSteps(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const d = 128 * time.Second // one bucket is 1s
	tests := []struct {
		name  string
		steps []windowStep
	}{
		{"moves inside a bucket share its last time", []windowStep{
			{0, 100, 0}, {300 * time.Millisecond, 200, 0}, {600 * time.Millisecond, 300, 0},
			{d, 300, 0}, // 100, 200 and 300 were merged into one sample seen at +600ms
			{d + 599*time.Millisecond, 300, 0},
			{d + 600*time.Millisecond, 300, 300},
		}},
		{"a move a bucket after the first opens a new sample", []windowStep{
			{0, 100, 0}, {999 * time.Millisecond, 200, 0}, {time.Second, 300, 0},
			{d + 999*time.Millisecond, 300, 200}, {d + time.Second, 300, 300},
		}},
		{"an unchanged watermark keeps its first time", []windowStep{
			{0, 100, 0}, {10 * time.Second, 100, 0}, {d, 100, 100}, {d + time.Second, 200, 100},
		}},
		{"old samples go, the newest one at least d old stays", []windowStep{
			{0, 100, 0}, {2 * time.Second, 200, 0}, {4 * time.Second, 300, 0},
			{d + 3*time.Second, 300, 200}, {10 * d, 300, 300},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWindow(d, 0)
			for _, s := range tt.steps {
				if got := w.Confirmable(t0.Add(s.after), s.acked); got != s.want {
					t.Fatalf("at +%v acked %v: confirmable %v, want %v", s.after, s.acked, got, s.want)
				}
			}
			if len(w.samples) > 3 {
				t.Fatalf("%d samples left, want the old ones dropped", len(w.samples))
			}
		})
	}
}
