package backoff

import (
	"testing"
	"time"
)

// TestNth: the waits the hand-written loops had (doubling, capped).
func TestNth(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		first, most time.Duration
		want        []time.Duration
	}{
		{100 * ms, 5 * time.Second, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5 * time.Second, 5 * time.Second}},
		{time.Second, 10 * time.Second, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second}},
		{100 * ms, time.Second, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}},
	}
	for _, c := range cases {
		for n, want := range c.want {
			if got := Nth(c.first, c.most, n); got != want {
				t.Errorf("Nth(%v, %v, %d) = %v, want %v", c.first, c.most, n, got, want)
			}
		}
		if got := Nth(c.first, c.most, 1000); got != c.most {
			t.Errorf("Nth(%v, %v, 1000) = %v, want %v", c.first, c.most, got, c.most)
		}
	}
	for range 100 {
		if d := Jitter(time.Second); d < 500*ms || d > time.Second {
			t.Fatalf("Jitter(1s) = %v, want 500ms to 1s", d)
		}
	}
}
