package retention

import (
	"testing"
	"time"
)

func TestAhead(t *testing.T) {
	day := 24 * time.Hour
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cases := []struct {
		now   string
		width time.Duration
		ahead int
		want  []string // From of each window
	}{
		{"2025-06-01T13:45:00Z", day, 2, []string{"2025-06-01T00:00:00Z", "2025-06-02T00:00:00Z", "2025-06-03T00:00:00Z"}},
		{"2025-06-01T00:00:00Z", day, 0, []string{"2025-06-01T00:00:00Z"}},
		{"2025-06-01T23:59:59+02:00", day, 1, []string{"2025-06-01T00:00:00Z", "2025-06-02T00:00:00Z"}}, // UTC days
		{"2025-06-01T13:45:10Z", 10 * time.Second, 1, []string{"2025-06-01T13:45:10Z", "2025-06-01T13:45:20Z"}},
		{"2025-06-01T13:45:00Z", time.Hour, 1, []string{"2025-06-01T13:00:00Z", "2025-06-01T14:00:00Z"}},
	}
	for _, c := range cases {
		got := Ahead(at(c.now), c.width, c.ahead)
		if len(got) != len(c.want) {
			t.Fatalf("%s: %d windows, want %d", c.now, len(got), len(c.want))
		}
		for i, w := range got {
			if !w.From.Equal(at(c.want[i])) || w.To.Sub(w.From) != c.width {
				t.Errorf("%s: window %d = [%v, %v), want from %s, %v wide", c.now, i, w.From, w.To, c.want[i], c.width)
			}
		}
	}
}

func TestBehind(t *testing.T) {
	now := time.Date(2025, 6, 3, 12, 0, 0, 0, time.UTC)
	w := Window{From: time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC), To: time.Date(2025, 6, 2, 0, 0, 0, 0, time.UTC)}
	for _, c := range []struct {
		retention time.Duration
		want      bool
	}{{36 * time.Hour, true}, {36*time.Hour + time.Nanosecond, false}, {48 * time.Hour, false}, {time.Hour, true}} {
		if got := Behind(w, now, c.retention); got != c.want {
			t.Errorf("retention %v: Behind = %v, want %v", c.retention, got, c.want)
		}
	}
}
