package sink

import (
	"testing"
	"time"
)

// TestHoldFor: a record waits only when the budget leaves slack after the
// round trip and gatherMin more records are expected within it (the wait
// then saves most requests), and never longer than the slack or the time
// gatherTarget records take.
func TestHoldFor(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name                  string
		limit, gap, last, rtt time.Duration
		want                  time.Duration
	}{
		{"off", 0, ms, ms, ms, 0},
		{"no gap known yet", 5 * ms, 0, 0, ms, 0},
		{"a lone record: next one expected after the slack", 5 * ms, 10 * ms, 10 * ms, ms, 0},
		{"a record after a pause, the mean still short", 5 * ms, ms / 2, 20 * ms, ms, 0},
		{"next one just inside the slack: it would save one request in two", 5 * ms, 3 * ms, 3 * ms, ms, 0},
		{"500/s: two expected within the slack, it goes at once", 5 * ms, 2 * ms, 2 * ms, ms / 2, 0},
		{"1,000/s: four expected within the slack", 5 * ms, ms, ms, ms / 2, 45 * ms / 10},
		{"just under four expected", 5 * ms, 1126 * time.Microsecond, ms, ms / 2, 0},
		{"2,000/s: the slack", 5 * ms, ms / 2, ms / 2, ms, 4 * ms},
		{"10,000/s: gatherTarget records", 5 * ms, ms / 10, ms / 10, ms, 15 * ms / 10},
		{"the round trip eats the budget", 5 * ms, ms / 10, ms / 10, 6 * ms, 0},
		{"the round trip is the budget", 5 * ms, ms / 10, ms / 10, 5 * ms, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := holdFor(tc.limit, tc.gap, tc.last, tc.rtt); got != tc.want {
				t.Fatalf("holdFor(%v, %v, %v, %v) = %v, want %v", tc.limit, tc.gap, tc.last, tc.rtt, got, tc.want)
			}
		})
	}
}

// TestBudgetFollowsTheLoad: the means follow arrivals and round trips on a
// controlled clock; an idle spell lets the next records go at once, and the
// mean gap then recovers within a few records.
func TestBudgetFollowsTheLoad(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	b := newBudget(5*time.Millisecond, func() time.Time { return now })
	step := func(d time.Duration) { now = now.Add(d) }
	if h := b.arrived(); h != 0 {
		t.Fatalf("first record held %v", h)
	}
	// A round trip of 1ms.
	b.sending()
	step(time.Millisecond)
	b.landed()
	if b.rtt != time.Millisecond {
		t.Fatalf("rtt %v after one round trip of 1ms", b.rtt)
	}
	// 2,000 records/s: after a few arrivals, the slack.
	var h time.Duration
	for range 20 {
		step(time.Millisecond / 2)
		h = b.arrived()
	}
	if h != 4*time.Millisecond {
		t.Fatalf("at 2,000/s held %v, want the slack 4ms (mean gap %v)", h, b.gap)
	}
	// Idle for a minute: the next record goes at once.
	step(time.Minute)
	if h := b.arrived(); h != 0 {
		t.Fatalf("after an idle minute held %v (mean gap %v)", h, b.gap)
	}
	if b.gap > 4*b.limit {
		t.Fatalf("mean gap %v after the idle spell, want it capped near %v", b.gap, 4*b.limit)
	}
	n := 0
	for h == 0 && n < 100 {
		step(time.Millisecond / 2)
		h = b.arrived()
		n++
	}
	if n > 4 {
		t.Fatalf("%d records at 2,000/s before the rate was seen again", n)
	}
}
